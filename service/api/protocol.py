"""What the inference protocols' HTTP frontends (v2 and KServe's V1) share: their errors leave as
`{"error": "..."}`, the shape their clients parse, instead of /v1's problem+json, converted in
one place; and their inference routes run on the hot path (service.api.hot_path)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from service.api.auth import Scope, require
from service.api.problems import STATUS_OF, http_detail, unwrapped, validation_detail
from service.errors import BadRequestError, KilnError

log = logging.getLogger("kiln.api")

# The hot path's handlers check the key themselves: FastAPI's dependencies do not run there.
check_infer = require(Scope.infer)


def error_of(exc: Exception, where: str) -> tuple[int, str]:
    """The status and message that answer `exc`: its own for an expected error; for a bug a
    500, logged with its traceback as an error of `where`."""
    exc = unwrapped(exc)
    if isinstance(exc, KilnError):
        return exc.status_code, str(exc)
    if isinstance(exc, HTTPException):
        return http_detail(exc)
    if isinstance(exc, RequestValidationError):
        return 400, validation_detail(exc)
    for exc_type, (status, _) in STATUS_OF.items():
        if isinstance(exc, exc_type):
            return status, str(exc)
    log.exception("unhandled error on %s", where)
    return 500, f"{type(exc).__name__}; see the server log"


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def guarded(handler: Handler) -> Handler:
    """The handler, with every error it raises answered as `{"error": ...}`."""

    async def guarded_handler(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            status, message = error_of(exc, f"{request.method} {request.url.path}")
            headers = exc.headers if isinstance(exc, KilnError) else None
            return JSONResponse({"error": message}, status_code=status, headers=headers)

    return guarded_handler


class ProtocolRoute(APIRoute):
    """Wraps each handler, dependencies included, so every error leaves as `{"error": ...}`."""

    def get_route_handler(self) -> Handler:
        return guarded(super().get_route_handler())


class InferRoute(APIRoute):
    """The hot path's routes: the endpoint is called with the request and its path parameters,
    as in a plain Starlette route. FastAPI's request handler, which validates parameters and
    solves dependencies there are none of, took about a tenth of a small model's request; the
    signature still documents the route in OpenAPI."""

    def get_route_handler(self) -> Handler:
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request=request, **request.path_params)
            return response

        return guarded(handler)


def version_number(version: str) -> int:
    if re.fullmatch(r"[0-9]{1,18}", version) is None:
        raise BadRequestError(f"model version must be an integer; got {version!r}")
    return int(version)
