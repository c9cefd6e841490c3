"""The runtime: routes requests to variants and keeps loaded runners in an LRU cache.

Requests hold a reference to the runner they started with, so swapping in a faster variant or
evicting one never drops a request in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from compiler.artifact import Artifact
from compiler.backends import get_backend
from compiler.hardware import local_targets
from compiler.runner import Runner
from compiler.spec import InputSpec
from service.errors import NotFoundError
from service.jobs import spec_of
from service.records import VariantRecord, VersionRecord
from service.registry import ARTIFACT_BLOB, MODEL_BLOB, Registry
from service.router import ANY_TARGET, choose_variant, serving_version
from service.settings import Settings
from service.store import StoreUnavailableError

log = logging.getLogger("kiln.runtime")


@dataclass(frozen=True)
class Route:
    version: VersionRecord
    spec: InputSpec
    variants: list[VariantRecord]
    fetched_at: float


@dataclass(frozen=True)
class Prediction:
    outputs: dict[str, np.ndarray]
    version: int
    variant: VariantRecord


class Runtime:
    def __init__(self, registry: Registry, settings: Settings) -> None:
        self.registry = registry
        self.settings = settings
        self.targets = set(local_targets())
        self._routes: dict[tuple[str, int | None], Route] = {}
        self._runners: OrderedDict[str, Runner] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    def route(self, name: str, version: int | None) -> Route:
        key = (name, version)
        cached = self._routes.get(key)
        if cached is not None and time.monotonic() - cached.fetched_at < self.settings.route_ttl_s:
            return cached
        try:
            if version is None:
                chosen, variants = serving_version(self.registry.get_model(name).versions, self.targets)
            else:
                chosen = self.registry.get_version(name, version)
                variants = self.registry.variants_of(chosen)
        except StoreUnavailableError:
            if cached is not None:
                return cached  # the store is down: keep serving what this replica knows
            raise
        except NotFoundError:
            self._routes.pop(key, None)
            raise
        route = Route(chosen, spec_of(chosen), variants, time.monotonic())
        self._routes[key] = route
        return route

    def predict(
        self,
        name: str,
        version: int | None,
        inputs: Mapping[str, object],
        backend: str | None = None,
    ) -> Prediction:
        """Blocking: call it from a worker thread, never on the event loop."""
        route = self.route(name, version)
        arrays = route.spec.coerce(inputs)
        batch = route.spec.check(arrays)
        variant = choose_variant(route.variants, self.targets, batch, backend)
        runner = self.runner(route.version, variant)
        return Prediction(runner.run(arrays), route.version.version, variant)

    def runner(self, version: VersionRecord, variant: VariantRecord) -> Runner:
        key = variant.artifact_key or f"torchscript:{version.sha256}"
        with self._lock:
            runner = self._runners.get(key)
            if runner is not None:
                self._runners.move_to_end(key)
                return runner
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:  # one load per artifact, however many requests arrive at once
            with self._lock:
                runner = self._runners.get(key)
            if runner is None:
                runner = self._load(version, variant)
                with self._lock:
                    self._runners[key] = runner
                    while len(self._runners) > self.settings.runtime_max_loaded:
                        evicted, _ = self._runners.popitem(last=False)
                        log.info("evicted runner %s", evicted)
        with self._lock:
            self._loading.pop(key, None)
        return runner

    def _load(self, version: VersionRecord, variant: VariantRecord) -> Runner:
        started = time.perf_counter()
        store = self.registry.store
        if variant.artifact_key is None:
            payload = store.get_blob(MODEL_BLOB.format(sha256=version.sha256))
            artifact = Artifact(variant.backend, ANY_TARGET, spec_of(version), payload)
        else:
            artifact = Artifact.unpack(store.get_blob(ARTIFACT_BLOB.format(key=variant.artifact_key)))
        runner = get_backend(variant.backend).load(artifact)
        log.info(
            "loaded %s variant %s of %s v%d in %.2f s",
            variant.backend,
            variant.id,
            version.name,
            version.version,
            time.perf_counter() - started,
        )
        return runner

    def forget(self, name: str) -> None:
        """Drop a deleted model's routes at once; its runners age out of the LRU."""
        for key in [k for k in self._routes if k[0] == name]:
            self._routes.pop(key, None)

    @property
    def loaded(self) -> int:
        return len(self._runners)
