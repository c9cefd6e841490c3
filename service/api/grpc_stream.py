"""Triton's ModelStreamInfer: a gRPC stream of inference requests, each answered in the order it
came, as Triton answers a model that is not decoupled (tritonclient's `start_stream` and
`async_stream_infer`; perf_analyzer's `--streaming`).

The requests of a stream run concurrently, so that they batch with one another and with every
other request; an error is the answer to its own request, and the stream goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

# The requests of one stream in flight at once. Past it the stream is not read further, and
# gRPC's flow control holds the client back, rather than every request it sends piling up here.
WINDOW = 64


async def in_order(
    requests: AsyncIterator[Any], answer: Callable[[Any], Awaitable[Any]]
) -> AsyncGenerator[Any, None]:
    """`answer(request)` for each request, started as it arrives and yielded in arrival order.
    `answer` must not raise: its errors are its answers. Closing this generator (the client
    cancelled the stream) cancels the answers still outstanding, so that none of them runs."""
    window = asyncio.Semaphore(WINDOW)
    started: asyncio.Queue[asyncio.Future[Any] | None] = asyncio.Queue()

    async def read() -> None:
        try:
            async for request in requests:
                await window.acquire()
                started.put_nowait(asyncio.ensure_future(answer(request)))
        finally:
            started.put_nowait(None)  # the end of the stream, or a failure to read it

    reader = asyncio.ensure_future(read())
    current = None
    try:
        while (current := await started.get()) is not None:
            yield await current
            window.release()  # once written: the answer being written holds its place too
        await reader  # raises what ended the reading, if anything did
    finally:
        reader.cancel()
        if current is not None:
            current.cancel()
        while not started.empty():
            if (outstanding := started.get_nowait()) is not None:
                outstanding.cancel()
