"""Telling the app's endless streams that the server is shutting down.

Told to stop, uvicorn closes its listeners and waits for every open connection to finish, and
the app hears nothing of it until they have. A job's event stream, which ends only when its job
settles, would hold the whole shutdown until `KILN_SHUTDOWN_TIMEOUT_S`, or until Kubernetes
kills the pod. So the app chains a handler of its own onto uvicorn's, for the signals uvicorn
stops on, and the streams end as soon as one comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

# The signals uvicorn stops on (its HANDLED_SIGNALS, less Windows' SIGBREAK).
SIGNALS = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, FrameType | None], Any]


class Shutdown:
    def __init__(self) -> None:
        self.begun = asyncio.Event()
        # Each signal's handler before ours, and ours.
        self._chained: dict[signal.Signals, tuple[Handler, Handler]] = {}

    def watch(self) -> None:
        """Chain onto the handlers in place now: uvicorn's, while it serves the app. Only the
        main thread may set handlers, so an app served from another (a test client's portal)
        hears nothing, and a signal with no Python handler keeps its default action."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            previous = signal.getsignal(sig)
            if not callable(previous):
                continue

            def chained(signum: int, frame: FrameType | None, previous: Handler = previous) -> None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits
                    loop.call_soon_threadsafe(self.begun.set)
                previous(signum, frame)

            self._chained[sig] = (previous, chained)
            signal.signal(sig, chained)

    def unwatch(self) -> None:
        """Give back the handlers ours chained onto, unless another replaced ours since: uvicorn
        restores its own first when a second Ctrl+C cuts the shutdown short, and the handler
        ours chained onto would then be a finished server's, which ignores signals."""
        for sig, (previous, chained) in self._chained.items():
            if signal.getsignal(sig) is chained:
                signal.signal(sig, previous)
        self._chained.clear()

    async def then(self, stop: Callable[[float], Awaitable[object]], grace_s: float) -> None:
        """Once shutdown begins, `stop(grace_s)`."""
        await self.begun.wait()
        await stop(grace_s)

    async def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds: True at once when shutdown has begun."""
        try:
            await asyncio.wait_for(self.begun.wait(), timeout)
        except TimeoutError:
            return False
        return True
