"""Shutdown's chained signal handlers: they call the handler they chained onto, and give it back
at the end only where nothing replaced them since (uvicorn restores its own first when a second
Ctrl+C cuts its shutdown short: giving back a finished server's would leave signals ignored)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from service.api.shutdown import Shutdown


@pytest.fixture
def handlers() -> Iterator[list[str]]:
    """What SIGTERM's handler before the app's saw; the test's own handler is put back after."""
    seen: list[str] = []
    original = signal.getsignal(signal.SIGTERM)

    def uvicorns(signum: int, frame: FrameType | None) -> None:
        seen.append("uvicorn")

    signal.signal(signal.SIGTERM, uvicorns)
    yield seen
    signal.signal(signal.SIGTERM, original)


def test_a_signal_begins_shutdown_and_reaches_the_handler_before(handlers: list[str]) -> None:
    async def serve() -> bool:
        shutdown = Shutdown()
        shutdown.watch()
        before = await shutdown.wait(0.01)
        signal.raise_signal(signal.SIGTERM)
        began = await shutdown.wait(5)
        shutdown.unwatch()
        return not before and began

    assert asyncio.run(serve())
    assert handlers == ["uvicorn"]
    signal.raise_signal(signal.SIGTERM)  # given back
    assert handlers == ["uvicorn", "uvicorn"]


def test_a_handler_put_in_since_is_left_in_place(handlers: list[str]) -> None:
    def restored(signum: int, frame: FrameType | None) -> None:
        handlers.append("restored")

    async def serve() -> None:
        shutdown = Shutdown()
        shutdown.watch()
        signal.signal(signal.SIGTERM, restored)  # as uvicorn's capture_signals does on its way out
        shutdown.unwatch()

    asyncio.run(serve())
    signal.raise_signal(signal.SIGTERM)
    assert handlers == ["restored"]


def test_a_signal_after_the_loop_closed_still_reaches_the_handler_before(handlers: list[str]) -> None:
    shutdown = Shutdown()

    async def serve() -> None:
        shutdown.watch()

    asyncio.run(serve())  # closes its loop, with the app's handler still in place
    signal.raise_signal(signal.SIGTERM)
    assert handlers == ["uvicorn"]
    shutdown.unwatch()
