"""Periodic duties: one turn that raises is logged, and the next turns still come (a worker
whose heartbeat thread died would stop counting as live while it kept consuming)."""

from __future__ import annotations

import logging
import threading

import pytest

from service.periodic import Periodic


class Flaky(Periodic):
    def __init__(self) -> None:
        super().__init__("kiln-flaky", 0.01)
        self.turns = 0
        self.third = threading.Event()

    def run_once(self) -> None:
        self.turns += 1
        if self.turns == 1:
            raise RuntimeError("EXECABORT Transaction discarded because of previous errors.")
        if self.turns == 3:
            self.third.set()


def test_a_turn_that_raises_does_not_end_the_thread(caplog: pytest.LogCaptureFixture) -> None:
    flaky = Flaky()
    with caplog.at_level(logging.ERROR, logger="kiln.periodic"):
        flaky.start()
        try:
            assert flaky.third.wait(10)
        finally:
            flaky.stop(5)
    [record] = caplog.records
    assert record.getMessage() == "kiln-flaky failed; it runs again in 0.01 s"
    assert record.exc_info is not None and "EXECABORT" in str(record.exc_info[1])


class Hung(Periodic):
    def __init__(self) -> None:
        super().__init__("kiln-hung", 0.01)
        self.entered = threading.Event()
        self.release = threading.Event()

    def run_once(self) -> None:
        self.entered.set()
        self.release.wait()  # a store call that never answers


def test_stop_gives_up_on_a_hung_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shutdown is not held forever by a turn stuck on the store: stop waits a bounded time."""
    monkeypatch.setattr("service.periodic.STOP_WAIT_S", 0.2)
    hung = Hung()
    hung.start()
    try:
        assert hung.entered.wait(10)
        stopper = threading.Thread(target=hung.stop)
        stopper.start()
        stopper.join(5)
        assert not stopper.is_alive()
    finally:
        hung.release.set()
