"""What the inference protocols' HTTP frontends (v2 and KServe's V1) share: their errors leave as
`{"error": "..."}`, the shape their clients parse, instead of /v1's problem+json, converted in
one place; and their inference routes run on the hot path (service.api.hot_path), reading and
writing their bodies themselves, so that their schemas, here for v2, only document them."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from service.api.auth import Scope, require
from service.api.problems import STATUS_OF, http_detail, unwrapped, validation_detail
from service.api.schemas import shared_schema
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


# The Open Inference Protocol's inference bodies, named as in KServe's own models: service.tensors
# parses and prints them, and these only document them, in OpenAPI and the SDKs.
Parameters = dict[str, str | int | float | bool]
DATATYPE = Field(description="BOOL, UINT8 to UINT64, INT8 to INT64, FP16, FP32, FP64 or BYTES.")
SHARED = "shared_memory_region, shared_memory_byte_size and shared_memory_offset"


class Tensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str = DATATYPE
    parameters: Parameters = Field(
        default_factory=dict,
        description=f"binary_data_size: its bytes follow the JSON (the binary extension); {SHARED}: "
        "where it lies, in a registered region.",
    )
    data: list[Any] = Field(
        default_factory=list,
        description="The values in row-major order (a request's flat or nested); none when binary or "
        "in shared memory.",
    )


class RequestInput(Tensor):
    """An input tensor of a request."""


class RequestOutput(BaseModel):
    name: str
    parameters: Parameters = Field(
        default_factory=dict,
        description=f"binary_data: return it as binary; classification: its top n classes; {SHARED}: "
        "write it there.",
    )


class InferenceRequest(BaseModel):
    id: str | None = Field(default=None, description="Echoed in the response.")
    parameters: Parameters = Field(
        default_factory=dict,
        description="binary_data_output: every output as binary; priority: 1 the highest, 0 the "
        "model's default; timeout: microseconds it may wait in the queue.",
    )
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] = Field(
        default_factory=list, description="The outputs to return, and how; none: every output."
    )


class ResponseOutput(Tensor):
    """An output tensor of a response."""


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = Field(default=None, description="The request's, when it gave one.")
    parameters: Parameters = Field(default_factory=dict)
    outputs: list[ResponseOutput]


# The protocol's health answers, which kserve's client reads (tritonclient reads the status alone).
class ServerLiveResponse(BaseModel):
    live: bool


class ServerReadyResponse(BaseModel):
    ready: bool


class ModelReadyResponse(BaseModel):
    name: str
    ready: bool


BINARY = (
    "Triton's binary tensor extension: `application/octet-stream`, the JSON first, its length in the "
    "Inference-Header-Content-Length header, then the bytes of each tensor whose parameters give "
    "binary_data_size, in order."
)
# openapi_extra and responses of v2's infer routes.
INFER_BODY: dict[str, Any] = {
    "requestBody": {
        "description": f"An inference request, as JSON; or in {BINARY} Gzip and deflate bodies "
        "(Content-Encoding) are read too.",
        "required": True,
        "content": {
            "application/json": {
                "schema": shared_schema(InferenceRequest),
                "example": {
                    "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 1.5]}]
                },
            }
        },
    }
}
INFER_OK: dict[str, Any] = {
    "model": InferenceResponse,
    "description": "The outputs, as JSON; with binary outputs (binary_data_output, or an output's "
    f"binary_data), in {BINARY}",
}


def version_number(version: str) -> int:
    if re.fullmatch(r"[0-9]{1,18}", version) is None:
        raise BadRequestError(f"model version must be an integer; got {version!r}")
    return int(version)
