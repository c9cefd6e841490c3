"""Per-request observability: a request id on every log line and response, and error counts;
and the API key of the routes that take a body, checked before the body is read.

Pure ASGI rather than BaseHTTPMiddleware: streamed responses (server-sent events) pass through
untouched, and the request id set here stays visible to the handler, its threadpool calls,
uvicorn's access log and the 500 handler, which all run in this request's task.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import metrics
from service.api import auth
from service.api.problems import problem
from service.errors import KilnError
from service.logs import request_id

HEADER = "X-Request-ID"
HEADER_KEY = HEADER.lower().encode()  # as ASGI spells header names
# Ids from proxies and clients are echoed and logged: accept only short, printable, unspaced ones.
SANE_ID = re.compile(r"[A-Za-z0-9._:=+/-]{1,128}")
# New ids: 128 random bits, as many as uuid4's, for correlating logs rather than for secrecy, so
# from a generator rather than a getrandom() syscall per request. A generator of its own, which
# no library's random.seed() can repeat, reseeded in each forked process.
_IDS = random.Random()
os.register_at_fork(after_in_child=_IDS.seed)


def incoming_or_new(value: str | None) -> str:
    if value is not None and SANE_ID.fullmatch(value):
        return value
    return f"{_IDS.getrandbits(128):032x}"


def given_id(scope: Scope) -> str | None:
    """The request's X-Request-ID, from the raw header list: Starlette's `Headers` decodes every
    header to find one, a cost on every request."""
    for key, value in scope["headers"]:
        if key == HEADER_KEY:
            return str(value.decode("latin-1"))
    return None


def route_template(scope: Scope) -> str:
    """The matched route's path template, so that /v1/models/a and /v1/models/b count as one."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class RequestContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = incoming_or_new(given_id(scope))
        rid_header = (HEADER_KEY, rid.encode("latin-1"))
        # Not reset afterwards: the task ends with the request, and uvicorn's access log, which
        # runs outside this middleware, must still see it.
        request_id.set(rid)
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # Appended without a search: no handler sets this header itself.
                message["headers"] = [*message.get("headers", ()), rid_header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            if status:  # a response under way cannot be answered again
                raise
            # uvicorn cancels what still runs at its graceful shutdown's timeout, then answers 500
            # as for a bug, with an error's traceback: a 503 says to send it again elsewhere.
            await problem(
                503,
                "Service unavailable",
                "the server stopped before this request finished (KILN_SHUTDOWN_TIMEOUT_S); send it again",
            )(scope, receive, send_with_id)
        except Exception:
            # Answered by Starlette's 500 handler, which raises again once it has answered, or,
            # on the hot path or once a response had started, by uvicorn.
            metrics.HTTP_ERRORS.labels(str(max(status, 500)), route_template(scope)).inc()
            raise
        if status >= 400:
            metrics.HTTP_ERRORS.labels(str(status), route_template(scope)).inc()


class BodyRoute(NamedTuple):
    """A route whose body FastAPI reads before it checks the key."""

    route: APIRoute
    scopes: Sequence[auth.Scope]  # as `auth.scopes_of` reads them
    refusal: Callable[[KilnError], ASGIApp]  # the response the route's own check answers with


class KeyBeforeBody:
    """FastAPI reads and parses a route's body (a whole upload, spooled to disk) before it solves
    the route's dependencies, its key check among them: so a caller with no key could make the
    server take in KILN_MAX_UPLOAD_MB, or wait for it. The key of each of `routes` is checked
    here first, and a refusal answered as the route would answer it. Inside `RequestContext`,
    which gives it its request id and counts it."""

    def __init__(self, app: ASGIApp, keys: Mapping[str, auth.Scope], routes: Sequence[BodyRoute]) -> None:
        self.app = app
        self.keys = keys
        self.routes = routes
        self.methods = {method for r in routes for method in r.route.methods or ()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in self.methods:
            for route, scopes, refusal in self.routes:
                match, child = route.matches(scope)
                if match is not Match.FULL:
                    continue
                key = auth.presented_key(Headers(scope=scope))
                try:
                    for needed in scopes:
                        auth.authorize(self.keys, key, needed)
                except KilnError as exc:
                    scope.update(child)  # counted on its route, as the router would have matched it
                    await refusal(exc)(scope, receive, send)
                    return
                break
        await self.app(scope, receive, send)
