from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.protocol_error import ProtocolError
from ...models.trace_settings_doc import TraceSettingsDoc
from ...types import Response


def _get_kwargs(
    name: str,
) -> dict[str, Any]:

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v2/models/{name}/trace/setting".format(
            name=quote(str(name), safe=""),
        ),
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ProtocolError | TraceSettingsDoc:
    if response.status_code == 200:
        response_200 = TraceSettingsDoc.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = ProtocolError.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = ProtocolError.from_dict(response.json())

        return response_401

    if response.status_code == 403:
        response_403 = ProtocolError.from_dict(response.json())

        return response_403

    if response.status_code == 404:
        response_404 = ProtocolError.from_dict(response.json())

        return response_404

    response_default = ProtocolError.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[ProtocolError | TraceSettingsDoc]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    name: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[ProtocolError | TraceSettingsDoc]:
    """The trace settings of a model: its own, the server's for the rest.

    Args:
        name (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ProtocolError | TraceSettingsDoc]
    """

    kwargs = _get_kwargs(
        name=name,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    name: str,
    *,
    client: AuthenticatedClient | Client,
) -> ProtocolError | TraceSettingsDoc | None:
    """The trace settings of a model: its own, the server's for the rest.

    Args:
        name (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ProtocolError | TraceSettingsDoc
    """

    return sync_detailed(
        name=name,
        client=client,
    ).parsed


async def asyncio_detailed(
    name: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[ProtocolError | TraceSettingsDoc]:
    """The trace settings of a model: its own, the server's for the rest.

    Args:
        name (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ProtocolError | TraceSettingsDoc]
    """

    kwargs = _get_kwargs(
        name=name,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    name: str,
    *,
    client: AuthenticatedClient | Client,
) -> ProtocolError | TraceSettingsDoc | None:
    """The trace settings of a model: its own, the server's for the rest.

    Args:
        name (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ProtocolError | TraceSettingsDoc
    """

    return (
        await asyncio_detailed(
            name=name,
            client=client,
        )
    ).parsed
