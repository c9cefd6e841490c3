"""Request and response bodies of the inference protocols (v2 and KServe's V1), as they come
and go over HTTP: JSON bodies parsed into their models, Content-Encoding, KILN_MAX_UPLOAD_MB, and
responses compressed as the client accepts."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from service.api.compression import (
    MIN_COMPRESSED_BYTES,
    accepted_encoding,
    compress,
    content_encoding,
    decompress,
)
from service.api.problems import too_large, validation_detail
from service.errors import BadRequestError, PayloadTooLargeError
from service.headers import byte_count
from service.settings import Settings

Body = TypeVar("Body", bound=BaseModel)
# JSON up to these sizes is parsed and printed on the event loop, larger in the threadpool: it
# costs about 20 us per KiB either way, and one big request must not stall every other.
INLINE_JSON_BYTES = 4 * 1024
INLINE_JSON_ELEMENTS = 256  # output values printed as JSON: about 4 KiB of text


async def json_body(request: Request, model: type[Body], shape: str) -> Body:
    """The body as `model`, whatever its content type: tritonclient sends JSON without saying so.
    `shape` says what it must be, in the 400 of a body that is not."""
    return parsed(await request.body(), model, shape)


def parsed(body: bytes, model: type[Body], shape: str) -> Body:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise BadRequestError(f"the body must be {shape}: {validation_detail(exc)}") from None


def json_request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its body with `json_body`."""
    content = {"application/json": {"schema": model.model_json_schema()}}
    return {"requestBody": {"required": True, "content": content}}


async def bounded_body(request: Request, limit: int, setting: str = "KILN_MAX_UPLOAD_MB") -> bytes:
    """The body, refused with 413 past `limit` bytes (the `setting`'s): a declared length before
    any is read, a chunked body as it arrives. The route checks this itself, since `hot_path`
    serves it without the framework's body limit."""
    declared = byte_count(request.headers.get("content-length", ""))
    if declared is not None and declared > limit:
        raise PayloadTooLargeError(too_large(declared, limit, setting))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(too_large(size, limit, setting))
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: Request, limit: int, setting: str = "KILN_MAX_UPLOAD_MB") -> bytes:
    """The body, decompressed as its Content-Encoding says, and at most `limit` bytes (the
    `setting`'s) either way."""
    encoding = content_encoding(request.headers.get("content-encoding"))  # before the body is read
    body = await bounded_body(request, limit, setting)
    if encoding is not None:  # inflates to at most `limit`: off the event loop
        body = await run_in_threadpool(decompress, body, encoding, limit, setting)
    return body


async def inference_body(request: Request, settings: Settings, binary: bool) -> bytes:
    """An inference request's body: JSON is held to KILN_MAX_JSON_MB, decompressed too, as its
    parse takes many times its size; a binary one (`binary`: its JSON header's length given) to
    KILN_MAX_UPLOAD_MB."""
    if binary:
        return await read_body(request, settings.max_request_bytes)
    return await read_body(request, settings.max_json_bytes, "KILN_MAX_JSON_MB")


async def answer(
    request: Request, settings: Settings, payload: bytes, media_type: str, headers: dict[str, str]
) -> Response:
    """The response, compressed in the encoding that the request's Accept-Encoding weighs most."""
    if len(payload) >= MIN_COMPRESSED_BYTES and settings.response_compression:
        answer_in = accepted_encoding(request.headers.get("accept-encoding"))
        if answer_in is not None:
            payload = await compress(payload, answer_in)
            headers["Content-Encoding"] = answer_in
            headers["Vary"] = "Accept-Encoding"
    return Response(payload, media_type=media_type, headers=headers)
