"""service.api.grpc_stream on its own: answers run side by side, leave in arrival order, stay
within the window, and are cancelled with the stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from service.api import grpc_stream
from service.api.grpc_stream import in_order


async def numbers(count: int) -> AsyncIterator[int]:
    for i in range(count):
        yield i


class Answers:
    """Answers that take as long as `delays` says for each request, and count how many run at once."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.running = self.peak = 0
        self.cancelled: list[int] = []

    async def __call__(self, i: int) -> int:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.delays[i])
        except asyncio.CancelledError:
            self.cancelled.append(i)
            raise
        finally:
            self.running -= 1
        return i


# The earlier the request, the longer its answer takes.
SLOWEST_FIRST = [0.01 * (6 - i) for i in range(6)]


def test_answers_run_together_and_leave_in_arrival_order() -> None:
    answers = Answers(SLOWEST_FIRST)

    async def collect() -> list[int]:
        return [answer async for answer in in_order(numbers(6), answers)]

    assert asyncio.run(collect()) == list(range(6))
    assert answers.peak == 6  # the later, quicker answers did not wait for the earlier ones


def test_a_full_window_stops_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_stream, "WINDOW", 2)
    answers = Answers(SLOWEST_FIRST)

    async def collect() -> list[int]:
        return [answer async for answer in in_order(numbers(6), answers)]

    assert asyncio.run(collect()) == list(range(6))
    assert answers.peak == 2


def test_closing_the_stream_cancels_the_answers_outstanding() -> None:
    answers = Answers([0.0] + [10.0] * 4)

    async def first_then_close() -> tuple[int, list[int]]:
        stream = in_order(numbers(5), answers)
        first = await anext(stream)
        await stream.aclose()
        await asyncio.sleep(0)  # the cancellations land
        return first, sorted(answers.cancelled)  # here: asyncio.run would cancel what is left

    assert asyncio.run(first_then_close()) == (0, [1, 2, 3, 4])
