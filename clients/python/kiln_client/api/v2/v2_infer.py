from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.inference_request import InferenceRequest
from ...models.inference_response import InferenceResponse
from ...models.protocol_error import ProtocolError
from ...types import Response


def _get_kwargs(
    name: str,
    *,
    body: InferenceRequest,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v2/models/{name}/infer".format(
            name=quote(str(name), safe=""),
        ),
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> InferenceResponse | ProtocolError:
    if response.status_code == 200:
        response_200 = InferenceResponse.from_dict(response.json())

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

    if response.status_code == 413:
        response_413 = ProtocolError.from_dict(response.json())

        return response_413

    if response.status_code == 503:
        response_503 = ProtocolError.from_dict(response.json())

        return response_503

    response_default = ProtocolError.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[InferenceResponse | ProtocolError]:
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
    body: InferenceRequest,
) -> Response[InferenceResponse | ProtocolError]:
    """Run the model's default version, else its newest ready one.

    Args:
        name (str):
        body (InferenceRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[InferenceResponse | ProtocolError]
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
    body: InferenceRequest,
) -> InferenceResponse | ProtocolError | None:
    """Run the model's default version, else its newest ready one.

    Args:
        name (str):
        body (InferenceRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        InferenceResponse | ProtocolError
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
    body: InferenceRequest,
) -> Response[InferenceResponse | ProtocolError]:
    """Run the model's default version, else its newest ready one.

    Args:
        name (str):
        body (InferenceRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[InferenceResponse | ProtocolError]
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
    body: InferenceRequest,
) -> InferenceResponse | ProtocolError | None:
    """Run the model's default version, else its newest ready one.

    Args:
        name (str):
        body (InferenceRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        InferenceResponse | ProtocolError
    """

    return (
        await asyncio_detailed(
            name=name,
            client=client,
            body=body,
        )
    ).parsed
