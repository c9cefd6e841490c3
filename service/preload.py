"""Loading models as a process starts, as Triton loads its model repository and TorchServe its
`--models` before they report ready: readiness waits for it, so that a new replica takes no
traffic while its first requests would wait for runner loads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from service.errors import NotFoundError, NotReadyError
from service.runtime import Runtime
from service.store import StoreUnavailableError

log = logging.getLogger("kiln.preload")

EVERY_MODEL = "*"
# While the store is unreachable, how often to ask it again: readiness fails on it meanwhile.
STORE_RETRY_S = 1.0
T = TypeVar("T")


class Preload:
    """Loads and warms up the models KILN_LOAD_MODELS names (`*`: every model, but not one that
    is unloaded), one after the other, in a thread of its own; `check` says how far it got."""

    def __init__(self, runtime: Runtime, names: str) -> None:
        self.runtime = runtime
        self._names = [n.strip() for n in names.split(",") if n.strip()]
        self._finished = threading.Event()
        self._stopping = threading.Event()
        self._progress = "listing the models"
        if not self._names:
            self._finished.set()

    def start(self) -> None:
        if not self._finished.is_set():
            # A daemon: a load cannot be cut short, and must not hold up the process's exit.
            threading.Thread(target=self._run, name="kiln-preload", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()

    def check(self) -> None:
        """Raises NotReadyError until every named model is loaded, or found unloadable."""
        if not self._finished.is_set():
            raise NotReadyError(f"loading models at startup (KILN_LOAD_MODELS): {self._progress}")

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            names = self._models()
            for done, name in enumerate(names):
                if self._stopping.is_set():
                    return
                if self.runtime.over_budget():
                    log.warning(
                        "KILN_RUNTIME_MAX_MB is full: %s load on their first request", ", ".join(names[done:])
                    )
                    break
                self._progress = f"{done} of {len(names)} loaded, now {name!r}"
                self._warm(name)
            log.info("loaded %d model(s) at startup in %.1f s", len(names), time.perf_counter() - started)
        except StoreUnavailableError:
            log.warning("stopped before the store answered: no model was loaded at startup")
        except Exception:  # readiness must not wait forever on a bug
            log.exception("loading models at startup failed")
        finally:
            self._finished.set()

    def _models(self) -> list[str]:
        if self._names != [EVERY_MODEL]:
            return self._names
        views = self._retrying(self.runtime.registry.list_models)
        return [v.name for v in views if not v.unloaded]

    def _warm(self, name: str) -> None:
        try:
            variants = self._retrying(lambda: self.runtime.warm(name))
        except NotFoundError as exc:  # unknown, or nothing ready on this host yet: not fatal
            log.warning("model %r is not loaded at startup: %s", name, exc)
        except Exception as exc:  # it serves without warming, or says on its requests why not
            log.warning("model %r is not loaded at startup: %s: %s", name, type(exc).__name__, exc)
        else:
            log.info("model %r is loaded: %s", name, ", ".join(sorted({v.backend for v in variants})))

    def _retrying(self, call: Callable[[], T]) -> T:
        """The call's result, asked again while the store is unreachable (a replica that starts
        during a Redis outage loads its models once Redis is back)."""
        while True:
            try:
                return call()
            except StoreUnavailableError as exc:
                if self._stopping.wait(STORE_RETRY_S):
                    raise
                self._progress = f"waiting for the store: {exc}"
