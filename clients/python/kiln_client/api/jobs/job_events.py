from http import HTTPStatus
from typing import Any, cast
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.problem import Problem
from ...types import Response


def _get_kwargs(
    job_id: str,
) -> dict[str, Any]:

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/jobs/{job_id}/events".format(
            job_id=quote(str(job_id), safe=""),
        ),
    }

    return _kwargs


def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> Any | Problem:
    if response.status_code == 200:
        response_200 = cast(Any, None)
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


def _build_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> Response[Any | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    job_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[Any | Problem]:
    """Stream a compile job's stage changes as server-sent events until it settles.

     A `text/event-stream`. The first event comes at once with the job's current state, then one
    whenever its stage, status, attempts, error, cache hit or tuning progress changes:

        event: stage
        data: {"stage": "compiling", "status": "running", "attempts": 1, "error": null, "cache_hit":
    false,
               "tuning": null}

    A tuned variant's `tuning` counts its trials as they run: `{"trials_done": 32, "trials_total": 96,
    ...}` (see the job's `tuning`).

    The stream closes after `event: end`, sent when the job settles (`{"reason": "settled",
    "status": "succeeded"}`), is deleted with its model (`{"reason": "deleted", "detail": ...}`), or
    when this server shuts down (`{"reason": "shutdown", ...}`): the job goes on (a worker's in
    Redis mode; in embedded mode, once this server is back), and is followed by opening the stream
    again, on another replica or on this server once it is back.
    Comment lines (`: ping`) keep idle connections open.

    Args:
        job_id (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Any | Problem]
    """

    kwargs = _get_kwargs(
        job_id=job_id,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    job_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Any | Problem | None:
    """Stream a compile job's stage changes as server-sent events until it settles.

     A `text/event-stream`. The first event comes at once with the job's current state, then one
    whenever its stage, status, attempts, error, cache hit or tuning progress changes:

        event: stage
        data: {"stage": "compiling", "status": "running", "attempts": 1, "error": null, "cache_hit":
    false,
               "tuning": null}

    A tuned variant's `tuning` counts its trials as they run: `{"trials_done": 32, "trials_total": 96,
    ...}` (see the job's `tuning`).

    The stream closes after `event: end`, sent when the job settles (`{"reason": "settled",
    "status": "succeeded"}`), is deleted with its model (`{"reason": "deleted", "detail": ...}`), or
    when this server shuts down (`{"reason": "shutdown", ...}`): the job goes on (a worker's in
    Redis mode; in embedded mode, once this server is back), and is followed by opening the stream
    again, on another replica or on this server once it is back.
    Comment lines (`: ping`) keep idle connections open.

    Args:
        job_id (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Any | Problem
    """

    return sync_detailed(
        job_id=job_id,
        client=client,
    ).parsed


async def asyncio_detailed(
    job_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[Any | Problem]:
    """Stream a compile job's stage changes as server-sent events until it settles.

     A `text/event-stream`. The first event comes at once with the job's current state, then one
    whenever its stage, status, attempts, error, cache hit or tuning progress changes:

        event: stage
        data: {"stage": "compiling", "status": "running", "attempts": 1, "error": null, "cache_hit":
    false,
               "tuning": null}

    A tuned variant's `tuning` counts its trials as they run: `{"trials_done": 32, "trials_total": 96,
    ...}` (see the job's `tuning`).

    The stream closes after `event: end`, sent when the job settles (`{"reason": "settled",
    "status": "succeeded"}`), is deleted with its model (`{"reason": "deleted", "detail": ...}`), or
    when this server shuts down (`{"reason": "shutdown", ...}`): the job goes on (a worker's in
    Redis mode; in embedded mode, once this server is back), and is followed by opening the stream
    again, on another replica or on this server once it is back.
    Comment lines (`: ping`) keep idle connections open.

    Args:
        job_id (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Any | Problem]
    """

    kwargs = _get_kwargs(
        job_id=job_id,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    job_id: str,
    *,
    client: AuthenticatedClient | Client,
) -> Any | Problem | None:
    """Stream a compile job's stage changes as server-sent events until it settles.

     A `text/event-stream`. The first event comes at once with the job's current state, then one
    whenever its stage, status, attempts, error, cache hit or tuning progress changes:

        event: stage
        data: {"stage": "compiling", "status": "running", "attempts": 1, "error": null, "cache_hit":
    false,
               "tuning": null}

    A tuned variant's `tuning` counts its trials as they run: `{"trials_done": 32, "trials_total": 96,
    ...}` (see the job's `tuning`).

    The stream closes after `event: end`, sent when the job settles (`{"reason": "settled",
    "status": "succeeded"}`), is deleted with its model (`{"reason": "deleted", "detail": ...}`), or
    when this server shuts down (`{"reason": "shutdown", ...}`): the job goes on (a worker's in
    Redis mode; in embedded mode, once this server is back), and is followed by opening the stream
    again, on another replica or on this server once it is back.
    Comment lines (`: ping`) keep idle connections open.

    Args:
        job_id (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Any | Problem
    """

    return (
        await asyncio_detailed(
            job_id=job_id,
            client=client,
        )
    ).parsed
