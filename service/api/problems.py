"""Every error becomes an RFC 9457 problem response here, and only here."""

from __future__ import annotations

import errno
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from compiler.errors import (
    BackendUnavailableError,
    InputMismatchError,
    InvalidModelError,
    InvalidSpecError,
    ModelRunError,
)
from service.api.schemas import Problem, shared_components
from service.errors import KilnError, PayloadTooLargeError
from service.headers import byte_count
from service.store import StoreUnavailableError

log = logging.getLogger("kiln.api")

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_REF = "#/components/schemas/Problem"
# What a form field (an upload's config, its samples and labels in it) may hold; a file is spooled
# to disk instead. Starlette's default, 1 MiB, refused documented labels and an image's sample.
FORM_FIELD_BYTES = 32 << 20
FIELD_TOO_LARGE = "Part exceeded maximum size"  # how Starlette refuses a form field past it

# Compiler and store errors keep their own types; this is where they get an HTTP status.
STATUS_OF: dict[type[Exception], tuple[int, str]] = {
    InvalidModelError: (400, "Invalid model"),
    InputMismatchError: (400, "Invalid inputs"),
    ModelRunError: (400, "Model failed on the inputs"),
    InvalidSpecError: (422, "Invalid input spec"),
    BackendUnavailableError: (422, "Backend unavailable"),
    StoreUnavailableError: (503, "Store unavailable"),
    # nginx's code: the client closed its connection before its request was in. No one reads
    # the answer; the code keeps such requests out of both client (400) and server (5xx) errors.
    ClientDisconnect: (499, "Client closed request"),
}


def unwrapped(exc: Exception) -> Exception:
    """A client's disconnect as itself: FastAPI, reading a body, reports it as a 400."""
    cause = exc.__cause__
    return cause if isinstance(exc, HTTPException) and isinstance(cause, ClientDisconnect) else exc


def problem(status: int, title: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        Problem(title=title, status=status, detail=detail).model_dump(),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


def too_large(size: int, limit: int, setting: str = "KILN_MAX_UPLOAD_MB") -> str:
    return f"the request body is at least {size} bytes; {setting} allows {limit}"


class DeclaredTooLarge:
    """Starlette answers a body whose declared length is past the app's max_body_size with a
    text/plain 413 of its own, past every exception handler: it goes out as `answer` has the
    matched route (None: none matched) answer its errors (problem+json, or `{"error"}` on the
    protocols' routes)."""

    def __init__(
        self, app: ASGIApp, limit: int, answer: Callable[[BaseRoute | None], Callable[[KilnError], ASGIApp]]
    ) -> None:
        self.app = app
        self.limit = limit
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        replaced = False

        async def sending(message: Message) -> None:
            nonlocal replaced
            if replaced:
                return  # the plain text's body
            if message["type"] == "http.response.start" and message["status"] == 413 and _plain(message):
                replaced = True
                route = scope.get("route")  # set by the router once it matched
                # The limit in force: a route's own is below the app's only for JSON inference.
                limit = scope.get(MAX_BODY_SIZE_SCOPE_KEY) or self.limit
                setting = "KILN_MAX_JSON_MB" if limit < self.limit else "KILN_MAX_UPLOAD_MB"
                declared = byte_count(Headers(scope=scope).get("content-length", ""))
                error = PayloadTooLargeError(too_large(declared or limit + 1, limit, setting))
                await self.answer(route)(error)(scope, receive, send)
                return
            await send(message)

        await self.app(scope, receive, sending)


def disk_full(exc: BaseException | None) -> TypeGuard[OSError]:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_detail(exc: OSError) -> str:
    """Which disk is full: that of the path that failed, where it is not the temporary disk's.
    An upload spooled there fails on a write, which names no path."""
    tmp = Path(tempfile.gettempdir())
    path = Path(os.path.abspath(os.fsdecode(exc.filename))) if isinstance(exc.filename, str | bytes) else tmp
    if not path.is_relative_to(tmp):
        return f"the server's disk holding {path} is full; try again once there is space"
    return (
        f"the server's temporary disk ({tmp}) is full: the upload could not be held; try again once "
        "there is space"
    )


def http_detail(exc: HTTPException) -> tuple[int, str]:
    """The status and words of Starlette's own HTTP error, saying what to fix."""
    if disk_full(exc.__cause__):  # FastAPI's "error parsing the body", spooling an upload
        return 503, disk_full_detail(exc.__cause__)
    if exc.status_code == 413:  # past max_body_size: the app's, or a JSON inference route's
        return (
            413,
            "the request body is larger than KILN_MAX_UPLOAD_MB, or for JSON inference "
            "KILN_MAX_JSON_MB, allows",
        )
    if exc.status_code == 400 and str(exc.detail).startswith(FIELD_TOO_LARGE):
        return 413, (
            f"the form field config is over {FORM_FIELD_BYTES >> 20} MiB: give fewer or smaller "
            "samples, and set labels with PATCH .../serving"
        )
    return exc.status_code, str(exc.detail)


def _plain(start: Message) -> bool:
    return MutableHeaders(raw=start["headers"]).get("content-type", "").startswith("text/plain")


def validation_detail(exc: RequestValidationError | ValidationError) -> str:
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            error = err.get("ctx", {}).get("error")
            # FastAPI's, of the body, has loc ("body", offset) ("29: JSON decode error"); pydantic's
            # own parse (of a body, or of an upload's config field) none, and the caller says what
            # it parsed, its error the line and column.
            loc = err.get("loc") or ()
            parts.append(
                f"the body is not valid JSON: {error} at character {loc[-1]}"
                if loc
                else f"not valid JSON: {error}"
            )
            continue
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(parts)


def finish_document(app: FastAPI) -> None:
    """FastAPI files every response model under the route's media type; Problem answers are
    application/problem+json, and the spec says so. And it adds the models that `openapi_extra`
    references (schemas.shared_schema) to the components."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()  # cached on the app: edited once
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, shared in shared_components().items():
            if components.setdefault(name, shared) != shared:
                raise RuntimeError(f"two schemas are named {name}; rename one of the models")
        for operation in (op for path in schema["paths"].values() for op in path.values()):
            for response in operation.get("responses", {}).values():
                # Under the route's own media type (JSON, or an event stream's): a problem is
                # still a problem+json document.
                content: dict[str, Any] = next(iter(response.get("content", {}).values()), {})
                if content.get("schema") == {"$ref": PROBLEM_REF}:
                    response["content"] = {PROBLEM_MEDIA_TYPE: content}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install(app: FastAPI) -> None:
    finish_document(app)

    @app.exception_handler(KilnError)
    async def kiln_error(request: Request, exc: KilnError) -> JSONResponse:
        return problem(exc.status_code, exc.title, str(exc), exc.headers)

    for exc_type, (status, title) in STATUS_OF.items():

        async def mapped(request: Request, exc: Exception, s: int = status, t: str = title) -> JSONResponse:
            return problem(s, t, str(exc))

        app.add_exception_handler(exc_type, mapped)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = validation_detail(exc)
        content_type = request.headers.get("content-type", "none")
        # FastAPI reads a body as JSON only when it says so, and curl -d says it is a form.
        if any(tuple(err.get("loc", ())) == ("body",) for err in exc.errors()) and "json" not in content_type:
            detail = (
                f"send the body as JSON with Content-Type: application/json, not {content_type}; {detail}"
            )
        return problem(422, "Invalid request", detail)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(unwrapped(exc), ClientDisconnect):
            status, title = STATUS_OF[ClientDisconnect]
            return problem(status, title, "the client closed the connection before its request was in")
        status, detail = http_detail(exc)
        title = {413: PayloadTooLargeError.title, 503: "Service unavailable"}.get(status, "HTTP error")
        return problem(status, title, detail)

    @app.exception_handler(OSError)
    async def os_error(request: Request, exc: OSError) -> JSONResponse:
        if disk_full(exc):  # spooling an upload, as its check reads it from a file
            return problem(503, "Service unavailable", disk_full_detail(exc))
        return await unexpected(request, exc)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "Internal error", f"{type(exc).__name__}; see the server log")
