from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.protocol_error import ProtocolError
from ...models.trace_settings_doc import TraceSettingsDoc
from ...models.v2_update_model_trace_settings_trace_settings_in import V2UpdateModelTraceSettingsTraceSettingsIn
from ...types import Response


def _get_kwargs(
    name: str,
    *,
    body: V2UpdateModelTraceSettingsTraceSettingsIn,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v2/models/{name}/trace/setting".format(
            name=quote(str(name), safe=""),
        ),
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
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

    if response.status_code == 503:
        response_503 = ProtocolError.from_dict(response.json())

        return response_503

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
    body: V2UpdateModelTraceSettingsTraceSettingsIn,
) -> Response[ProtocolError | TraceSettingsDoc]:
    """Change a model's own trace settings in every process; null gives one back to the server's, and a
    body naming none gives all back, as in Triton.

    Args:
        name (str):
        body (V2UpdateModelTraceSettingsTraceSettingsIn): The settings to change, as Triton takes
            them: strings (numbers taken too), the level a
            string or a list of them; null clears a setting, back to the server's (for a model) or the
            default (for the server).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ProtocolError | TraceSettingsDoc]
    """

    kwargs = _get_kwargs(
        name=name,
        body=body,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    name: str,
    *,
    client: AuthenticatedClient | Client,
    body: V2UpdateModelTraceSettingsTraceSettingsIn,
) -> ProtocolError | TraceSettingsDoc | None:
    """Change a model's own trace settings in every process; null gives one back to the server's, and a
    body naming none gives all back, as in Triton.

    Args:
        name (str):
        body (V2UpdateModelTraceSettingsTraceSettingsIn): The settings to change, as Triton takes
            them: strings (numbers taken too), the level a
            string or a list of them; null clears a setting, back to the server's (for a model) or the
            default (for the server).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ProtocolError | TraceSettingsDoc
    """

    return sync_detailed(
        name=name,
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    name: str,
    *,
    client: AuthenticatedClient | Client,
    body: V2UpdateModelTraceSettingsTraceSettingsIn,
) -> Response[ProtocolError | TraceSettingsDoc]:
    """Change a model's own trace settings in every process; null gives one back to the server's, and a
    body naming none gives all back, as in Triton.

    Args:
        name (str):
        body (V2UpdateModelTraceSettingsTraceSettingsIn): The settings to change, as Triton takes
            them: strings (numbers taken too), the level a
            string or a list of them; null clears a setting, back to the server's (for a model) or the
            default (for the server).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ProtocolError | TraceSettingsDoc]
    """

    kwargs = _get_kwargs(
        name=name,
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    name: str,
    *,
    client: AuthenticatedClient | Client,
    body: V2UpdateModelTraceSettingsTraceSettingsIn,
) -> ProtocolError | TraceSettingsDoc | None:
    """Change a model's own trace settings in every process; null gives one back to the server's, and a
    body naming none gives all back, as in Triton.

    Args:
        name (str):
        body (V2UpdateModelTraceSettingsTraceSettingsIn): The settings to change, as Triton takes
            them: strings (numbers taken too), the level a
            string or a list of them; null clears a setting, back to the server's (for a model) or the
            default (for the server).

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
            body=body,
        )
    ).parsed
