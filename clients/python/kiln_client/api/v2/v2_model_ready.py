from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.model_ready_response import ModelReadyResponse
from ...models.protocol_error import ProtocolError
from ...types import Response


def _get_kwargs(
    name: str,
) -> dict[str, Any]:

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v2/models/{name}/ready".format(
            name=quote(str(name), safe=""),
        ),
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ModelReadyResponse | ProtocolError:
    if response.status_code == 200:
        response_200 = ModelReadyResponse.from_dict(response.json())

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

    if response.status_code == 409:
        response_409 = ProtocolError.from_dict(response.json())

        return response_409

    response_default = ProtocolError.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[ModelReadyResponse | ProtocolError]:
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
) -> Response[ModelReadyResponse | ProtocolError]:
    """Whether the model serves requests naming no version here; else a 400 (409: unloaded).

    Args:
        name (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ModelReadyResponse | ProtocolError]
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
) -> ModelReadyResponse | ProtocolError | None:
    """Whether the model serves requests naming no version here; else a 400 (409: unloaded).

    Args:
        name (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ModelReadyResponse | ProtocolError
    """

    return sync_detailed(
        name=name,
        client=client,
    ).parsed


async def asyncio_detailed(
    name: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[ModelReadyResponse | ProtocolError]:
    """Whether the model serves requests naming no version here; else a 400 (409: unloaded).

    Args:
        name (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ModelReadyResponse | ProtocolError]
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
) -> ModelReadyResponse | ProtocolError | None:
    """Whether the model serves requests naming no version here; else a 400 (409: unloaded).

    Args:
        name (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ModelReadyResponse | ProtocolError
    """

    return (
        await asyncio_detailed(
            name=name,
            client=client,
        )
    ).parsed
