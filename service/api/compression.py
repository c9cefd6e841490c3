"""HTTP compression of v2 inference bodies, as Triton's HTTP server offers it.

tritonclient's `infer(request_compression_algorithm=...)` sends the whole body, binary tensors
included, as `Content-Encoding: gzip` or `deflate` (zlib's format, as HTTP means it), with
`Inference-Header-Content-Length` counting the uncompressed JSON; its
`response_compression_algorithm` asks for the response the same way through `Accept-Encoding`.
"""

from __future__ import annotations

import zlib

from starlette.concurrency import run_in_threadpool

from service.errors import BadRequestError, PayloadTooLargeError

# zlib's window bits for each encoding's container.
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# Smaller responses go as they are: compressing saves them too little (Starlette's GZipMiddleware
# stops at 500 bytes).
MIN_COMPRESSED_BYTES = 1024
# Compressed on the event loop up to this size (at most about 0.2 ms for floats, the worst case),
# in the threadpool beyond it.
INLINE_BYTES = 4 * 1024
# On float tensors, level 6 compressed a few percent smaller than level 1 at up to 10x the CPU.
LEVEL = 1


def content_encoding(header: str | None) -> str | None:
    """The request body's encoding: None for none, else one of WBITS; 400 for any other."""
    encoding = (header or "").strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding not in WBITS:
        raise BadRequestError(f"Content-Encoding {header!r} is not supported; send gzip, deflate or none")
    return encoding


def decompress(body: bytes, encoding: str, limit: int, setting: str = "KILN_MAX_UPLOAD_MB") -> bytes:
    """The body as it was before `encoding`; 413 once it passes `limit` bytes, which a small body
    can (compressed zeros shrink a thousandfold), and 400 for data that is not of that encoding.
    One gzip member, as tritonclient and Triton write: a body of many members would each time
    copy the rest of the body, quadratic in its length."""
    stream = zlib.decompressobj(WBITS[encoding])
    try:
        out = stream.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadRequestError(f"the request body is not valid {encoding} data: {exc}") from exc
    if len(out) > limit:
        raise PayloadTooLargeError(
            f"the request body is more than {limit} bytes decompressed; {setting} allows {limit}"
        )
    if not stream.eof:
        raise BadRequestError(f"the request body's {encoding} data ends early")
    if extra := len(stream.unused_data):
        raise BadRequestError(f"the request body has {extra} bytes after its {encoding} data")
    return out


def accepted_encoding(header: str | None) -> str | None:
    """The encoding to answer in: of those in WBITS, the one `Accept-Encoding` weighs most (the
    first listed on a tie), or None when it accepts neither."""
    best, best_q = None, 0.0
    for item in (header or "").split(","):
        name, *params = item.split(";")
        name = name.strip().lower()
        name = "gzip" if name == "x-gzip" else name  # the same, as RFC 9110 asks
        if name not in WBITS:
            continue
        q = 1.0
        for param in params:  # q need not come first: "gzip;level=1;q=0" refuses gzip
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                q = _weight(value)
        if q > best_q:
            best, best_q = name, q
    return best


def _weight(value: str) -> float:
    """A q-value, 0 to 1; one that is not (`inf`, `high`) counts as a refusal."""
    try:
        q = float(value)
    except ValueError:
        return 0.0
    return q if 0.0 <= q <= 1.0 else 0.0


def compressed(payload: bytes, encoding: str) -> bytes:
    """The payload in `encoding`, for a response that says so in its Content-Encoding."""
    stream = zlib.compressobj(LEVEL, zlib.DEFLATED, WBITS[encoding])
    return stream.compress(payload) + stream.flush()


async def compress(payload: bytes, encoding: str) -> bytes:
    if len(payload) <= INLINE_BYTES:
        return compressed(payload, encoding)
    return await run_in_threadpool(compressed, payload, encoding)
