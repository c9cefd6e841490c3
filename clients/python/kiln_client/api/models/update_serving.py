from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.problem import Problem
from ...models.serving_in import ServingIn
from ...models.version_out import VersionOut
from ...types import Response


def _get_kwargs(
    name: str,
    version: int,
    *,
    body: ServingIn,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "patch",
        "url": "/v1/models/{name}/versions/{version}/serving".format(
            name=quote(str(name), safe=""),
            version=quote(str(version), safe=""),
        ),
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> Problem | VersionOut:
    if response.status_code == 200:
        response_200 = VersionOut.from_dict(response.json())

        return response_200

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 403:
        response_403 = Problem.from_dict(response.json())

        return response_403

    if response.status_code == 404:
        response_404 = Problem.from_dict(response.json())

        return response_404

    if response.status_code == 422:
        response_422 = Problem.from_dict(response.json())

        return response_422

    if response.status_code == 503:
        response_503 = Problem.from_dict(response.json())

        return response_503

    response_default = Problem.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Problem | VersionOut]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    name: str,
    version: int,
    *,
    client: AuthenticatedClient | Client,
    body: ServingIn,
) -> Response[Problem | VersionOut]:
    """Change a version's batching, queue, timeout, response-cache or label settings without a recompile;
    every replica follows within KILN_ROUTE_TTL_S.

    Args:
        name (str):
        version (int):
        body (ServingIn): The serving settings to change. Those left out keep their value; null
            restores what an
            upload that leaves a setting out gets (the server's default, no limit, [], false for
            response_cache, true for dynamic_batching and adaptive_queue_delay, 0 for priority_levels,
            1
            for instances, {} for labels).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | VersionOut]
    """

    kwargs = _get_kwargs(
        name=name,
        version=version,
        body=body,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    name: str,
    version: int,
    *,
    client: AuthenticatedClient | Client,
    body: ServingIn,
) -> Problem | VersionOut | None:
    """Change a version's batching, queue, timeout, response-cache or label settings without a recompile;
    every replica follows within KILN_ROUTE_TTL_S.

    Args:
        name (str):
        version (int):
        body (ServingIn): The serving settings to change. Those left out keep their value; null
            restores what an
            upload that leaves a setting out gets (the server's default, no limit, [], false for
            response_cache, true for dynamic_batching and adaptive_queue_delay, 0 for priority_levels,
            1
            for instances, {} for labels).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Problem | VersionOut
    """

    return sync_detailed(
        name=name,
        version=version,
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    name: str,
    version: int,
    *,
    client: AuthenticatedClient | Client,
    body: ServingIn,
) -> Response[Problem | VersionOut]:
    """Change a version's batching, queue, timeout, response-cache or label settings without a recompile;
    every replica follows within KILN_ROUTE_TTL_S.

    Args:
        name (str):
        version (int):
        body (ServingIn): The serving settings to change. Those left out keep their value; null
            restores what an
            upload that leaves a setting out gets (the server's default, no limit, [], false for
            response_cache, true for dynamic_batching and adaptive_queue_delay, 0 for priority_levels,
            1
            for instances, {} for labels).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | VersionOut]
    """

    kwargs = _get_kwargs(
        name=name,
        version=version,
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    name: str,
    version: int,
    *,
    client: AuthenticatedClient | Client,
    body: ServingIn,
) -> Problem | VersionOut | None:
    """Change a version's batching, queue, timeout, response-cache or label settings without a recompile;
    every replica follows within KILN_ROUTE_TTL_S.

    Args:
        name (str):
        version (int):
        body (ServingIn): The serving settings to change. Those left out keep their value; null
            restores what an
            upload that leaves a setting out gets (the server's default, no limit, [], false for
            response_cache, true for dynamic_batching and adaptive_queue_delay, 0 for priority_levels,
            1
            for instances, {} for labels).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Problem | VersionOut
    """

    return (
        await asyncio_detailed(
            name=name,
            version=version,
            client=client,
            body=body,
        )
    ).parsed
