"""Background duties that repeat on an interval: a worker's heartbeat and redelivery, and the
API's sweeps and settings reads."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("kiln.periodic")

# How long a stop waits for a turn or a load in progress, which cannot be cut short.
STOP_WAIT_S = 10.0


class Periodic:
    """Runs `run_once` every `interval_s` on a daemon thread, from `start` until `stop`."""

    def __init__(self, name: str, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def run_once(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:  # a bug, or an error no subclass foresaw: the next turn still comes
                log.exception("%s failed; it runs again in %g s", self._thread.name, self.interval_s)

    def stop(self, wait_s: float | None = None) -> None:
        """Waits for a turn in progress, up to `wait_s` (None: STOP_WAIT_S). The thread is a
        daemon: one that hangs on the store past it does not keep the process from exiting."""
        self._stop.set()
        if self._thread.ident is not None:  # a start that failed earlier stops what never started
            self._thread.join(STOP_WAIT_S if wait_s is None else wait_s)
