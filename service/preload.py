"""Loading models as a process starts, as Triton loads its model repository and TorchServe its
`--models` before they report ready: readiness waits for it, so that a new replica takes no
traffic while its first requests would wait for runner loads. A model repository
(KILN_MODEL_REPOSITORY) is deployed first, and its models are loaded too."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from service.errors import NotFoundError, NotReadyError
from service.periodic import STOP_WAIT_S
from service.runtime import Runtime
from service.store import StoreUnavailableError

log = logging.getLogger("kiln.preload")

EVERY_MODEL = "*"
# While the store is unreachable, how often to ask it again: readiness fails on it meanwhile.
STORE_RETRY_S = 1.0
T = TypeVar("T")


def model_names(setting: str) -> list[str]:
    """KILN_LOAD_MODELS' names, each once, in order; `["*"]` for every model."""
    names = list(dict.fromkeys(n.strip() for n in setting.split(",") if n.strip()))
    return [EVERY_MODEL] if EVERY_MODEL in names else names


class Preload:
    """Loads and warms up the models KILN_LOAD_MODELS names (`*`: every model, but not one that
    is unloaded), one after the other, in a thread of its own; `check` says how far it got.
    `deploy`, run first, deploys a model repository and names the models it deployed."""

    def __init__(
        self, runtime: Runtime, setting: str, deploy: Callable[[threading.Event], list[str]] | None = None
    ) -> None:
        self.runtime = runtime
        self._names = model_names(setting)
        self._deploy = deploy
        self._finished = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress = "listing the models"
        if not self._names and deploy is None:
            self._finished.set()

    def start(self) -> None:
        if not self._finished.is_set():
            # A daemon, so that a hung load cannot keep the process from exiting.
            self._thread = threading.Thread(target=self._run, name="kiln-preload", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Blocking: no model after the one loading now, which is waited for (up to STOP_WAIT_S)
        so that it does not run on while the runtime and the store close."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def check(self) -> None:
        """Raises NotReadyError until every named model is loaded, or found unloadable."""
        if not self._finished.is_set():
            raise NotReadyError(f"loading models at startup: {self._progress}")

    def _run(self) -> None:
        started = time.perf_counter()
        loaded = 0
        try:
            deployed = []
            if self._deploy is not None:
                self._progress = "deploying the model repository (KILN_MODEL_REPOSITORY)"
                deploy = self._deploy
                # Again from the start after a store outage: what was deployed is found.
                deployed = self._retrying(lambda: deploy(self._stopping))
            names = list(dict.fromkeys(self._models() + deployed))
            for done, name in enumerate(names):
                if self._stopping.is_set():
                    return
                if self.runtime.over_budget():
                    log.warning("KILN_RUNTIME_MAX_MB is full: %s will load on first request", names[done:])
                    break
                evictions = self.runtime.evictions
                self._progress = f"{done} of {len(names)} tried, now {name!r}"
                loaded += self.warm(name)
                if self.runtime.evictions != evictions:  # preloading more would evict what it loaded
                    log.warning(
                        "KILN_RUNTIME_MAX_MB filled up with %r: %s will load on first request",
                        name,
                        names[done + 1 :],
                    )
                    break
            log.info(
                "loaded %d of %d model(s) at startup in %.1f s",
                loaded,
                len(names),
                time.perf_counter() - started,
            )
        except StoreUnavailableError:  # only when stopping
            log.warning("stopped while the store was unreachable")
        except Exception:  # readiness must not wait forever on a bug
            log.exception("loading models at startup failed")
        finally:
            self._finished.set()

    def _models(self) -> list[str]:
        if self._names != [EVERY_MODEL]:
            return self._names
        views = self._retrying(self.runtime.registry.list_models)
        return [v.name for v in views if not v.unloaded]

    def warm(self, name: str) -> bool:
        """Whether the model loaded; why not is logged."""
        try:
            started = time.perf_counter()
            variants = self._retrying(lambda: self.runtime.warm(name))
        except NotFoundError as exc:  # unknown, or nothing ready on this host yet: not fatal
            log.warning("model %r is not loaded at startup: %s", name, exc)
        except Exception as exc:  # it loads at its first request, or says there why it cannot
            log.warning("model %r is not loaded at startup: %s: %s", name, type(exc).__name__, exc)
        else:
            log.info(
                "model %r is loaded and warmed up in %.2f s: %s",
                name,
                time.perf_counter() - started,
                ", ".join(sorted({v.backend for v in variants})),
            )
            return True
        return False

    def _retrying(self, call: Callable[[], T]) -> T:
        """The call's result, asked again while the store is unreachable (a replica that starts
        during a Redis outage loads its models once Redis is back)."""
        progress = self._progress
        while True:
            try:
                found = call()
                self._progress = progress
                return found
            except StoreUnavailableError as exc:
                self._progress = f"waiting for the store: {exc}"
                if self._stopping.wait(STORE_RETRY_S):
                    raise
