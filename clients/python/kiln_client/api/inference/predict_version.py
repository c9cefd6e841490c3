from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.predict_in import PredictIn
from ...models.predict_out import PredictOut
from ...models.problem import Problem
from ...types import UNSET, Response, Unset


def _get_kwargs(
    name: str,
    version: int,
    *,
    body: PredictIn,
    backend: None | str | Unset = UNSET,
    timeout_us: int | None | Unset = UNSET,
    priority: int | Unset = 0,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    params: dict[str, Any] = {}

    json_backend: None | str | Unset
    if isinstance(backend, Unset):
        json_backend = UNSET
    else:
        json_backend = backend
    params["backend"] = json_backend

    json_timeout_us: int | None | Unset
    if isinstance(timeout_us, Unset):
        json_timeout_us = UNSET
    else:
        json_timeout_us = timeout_us
    params["timeout_us"] = json_timeout_us

    params["priority"] = priority

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/models/{name}/versions/{version}/predict".format(
            name=quote(str(name), safe=""),
            version=quote(str(version), safe=""),
        ),
        "params": params,
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> PredictOut | Problem:
    if response.status_code == 200:
        response_200 = PredictOut.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = Problem.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 403:
        response_403 = Problem.from_dict(response.json())

        return response_403

    if response.status_code == 404:
        response_404 = Problem.from_dict(response.json())

        return response_404

    if response.status_code == 409:
        response_409 = Problem.from_dict(response.json())

        return response_409

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
) -> Response[PredictOut | Problem]:
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
    body: PredictIn,
    backend: None | str | Unset = UNSET,
    timeout_us: int | None | Unset = UNSET,
    priority: int | Unset = 0,
) -> Response[PredictOut | Problem]:
    """Run one version of a model.

    Args:
        name (str):
        version (int):
        backend (None | str | Unset): Pin a backend (e.g. `tvm`) instead of the fastest verified
            variant.
        timeout_us (int | None | Unset): Microseconds the request may wait before it is answered
            503 instead of run; counts when shorter than the model's default_timeout_us; 0 sets none.
        priority (int | Unset): Triton's request priority: 1 is the highest of the model's
            priority_levels; 0, or one past them, waits at its default_priority_level. Default: 0.
        body (PredictIn):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[PredictOut | Problem]
    """

    kwargs = _get_kwargs(
        name=name,
        version=version,
        body=body,
        backend=backend,
        timeout_us=timeout_us,
        priority=priority,
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
    body: PredictIn,
    backend: None | str | Unset = UNSET,
    timeout_us: int | None | Unset = UNSET,
    priority: int | Unset = 0,
) -> PredictOut | Problem | None:
    """Run one version of a model.

    Args:
        name (str):
        version (int):
        backend (None | str | Unset): Pin a backend (e.g. `tvm`) instead of the fastest verified
            variant.
        timeout_us (int | None | Unset): Microseconds the request may wait before it is answered
            503 instead of run; counts when shorter than the model's default_timeout_us; 0 sets none.
        priority (int | Unset): Triton's request priority: 1 is the highest of the model's
            priority_levels; 0, or one past them, waits at its default_priority_level. Default: 0.
        body (PredictIn):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        PredictOut | Problem
    """

    return sync_detailed(
        name=name,
        version=version,
        client=client,
        body=body,
        backend=backend,
        timeout_us=timeout_us,
        priority=priority,
    ).parsed


async def asyncio_detailed(
    name: str,
    version: int,
    *,
    client: AuthenticatedClient | Client,
    body: PredictIn,
    backend: None | str | Unset = UNSET,
    timeout_us: int | None | Unset = UNSET,
    priority: int | Unset = 0,
) -> Response[PredictOut | Problem]:
    """Run one version of a model.

    Args:
        name (str):
        version (int):
        backend (None | str | Unset): Pin a backend (e.g. `tvm`) instead of the fastest verified
            variant.
        timeout_us (int | None | Unset): Microseconds the request may wait before it is answered
            503 instead of run; counts when shorter than the model's default_timeout_us; 0 sets none.
        priority (int | Unset): Triton's request priority: 1 is the highest of the model's
            priority_levels; 0, or one past them, waits at its default_priority_level. Default: 0.
        body (PredictIn):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[PredictOut | Problem]
    """

    kwargs = _get_kwargs(
        name=name,
        version=version,
        body=body,
        backend=backend,
        timeout_us=timeout_us,
        priority=priority,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    name: str,
    version: int,
    *,
    client: AuthenticatedClient | Client,
    body: PredictIn,
    backend: None | str | Unset = UNSET,
    timeout_us: int | None | Unset = UNSET,
    priority: int | Unset = 0,
) -> PredictOut | Problem | None:
    """Run one version of a model.

    Args:
        name (str):
        version (int):
        backend (None | str | Unset): Pin a backend (e.g. `tvm`) instead of the fastest verified
            variant.
        timeout_us (int | None | Unset): Microseconds the request may wait before it is answered
            503 instead of run; counts when shorter than the model's default_timeout_us; 0 sets none.
        priority (int | Unset): Triton's request priority: 1 is the highest of the model's
            priority_levels; 0, or one past them, waits at its default_priority_level. Default: 0.
        body (PredictIn):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        PredictOut | Problem
    """

    return (
        await asyncio_detailed(
            name=name,
            version=version,
            client=client,
            body=body,
            backend=backend,
            timeout_us=timeout_us,
            priority=priority,
        )
    ).parsed
