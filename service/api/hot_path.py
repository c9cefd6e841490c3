"""Inference requests skip the framework's middleware stack.

On this project's 2-core machine a bare FastAPI route answered about 4,500 requests/s where a
plain ASGI app on the same uvicorn answered 19,000: server errors, exception handlers, the body
limit and exit stacks each wrap every request and its `send`, and that cost is the same for a
small model's 0.5 ms request as for an upload. So the inference routes of v2 and of KServe's V1
protocol (`InferRoute`) are matched first, and their handlers run with only what they need around
them:

- `RequestContext`, for the request id and the error counts, as around every request;
- the route's own handler, which answers every error as `{"error": ...}` and checks the body
  against KILN_MAX_UPLOAD_MB itself (`bodies.bounded_body`).

Everything else, and any route added later, goes through the full stack, as do these routes
when OpenTelemetry is on (KILN_OPENTELEMETRY): FastAPI's router names the spans' routes. A bug that escapes
the handler is answered by uvicorn (a plain 500), still counted by `RequestContext`.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.protocol import Handler, InferRoute


def direct(handler: Handler) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await handler(Request(scope, receive))
        await response(scope, receive, send)

    return app


class InferenceFirst:
    def __init__(self, app: ASGIApp, routes: Sequence[InferRoute]) -> None:
        self.app = app  # the full stack; `app`, as FastAPI looks for middleware through it
        self.routes = [(route, direct(route.get_route_handler())) for route in routes]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            for route, app in self.routes:
                match, child = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child)
                    await app(scope, receive, send)
                    return
        await self.app(scope, receive, send)
