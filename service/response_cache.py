"""Triton's response cache: a model that opts in (`"response_cache": true` at upload) answers a
request whose inputs it has answered before from memory, without running.

Per process, in an LRU bounded by KILN_RESPONSE_CACHE_MB. Keyed by the model version and the
inputs' names, dtypes, shapes and bytes: any variant of the version may have answered, since every
one was verified against TorchScript.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from service.records import VariantRecord


@dataclass(frozen=True)
class Cached:
    outputs: dict[str, np.ndarray]
    variant: VariantRecord  # the one that computed them
    nbytes: int


Key = tuple[str, int, bytes]  # model, version, digest of the inputs


def response_key(name: str, version: int, inputs: Mapping[str, np.ndarray]) -> Key:
    digest = hashlib.blake2b(digest_size=16)
    for input_name in sorted(inputs):
        array = np.ascontiguousarray(inputs[input_name])
        digest.update(f"{input_name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.data)
    return name, version, digest.digest()


class ResponseCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Key, Cached] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Key) -> Cached | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: Key, outputs: Mapping[str, np.ndarray], variant: VariantRecord) -> None:
        """Copies: a request's outputs are views of its batch's, which they would keep alive.
        Read-only, since every hit shares them."""
        kept = {}
        for output, array in outputs.items():
            kept[output] = np.array(array, copy=True)
            kept[output].flags.writeable = False
        entry = Cached(kept, variant, sum(a.nbytes for a in kept.values()))
        if entry.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            self._bytes += entry.nbytes - (old.nbytes if old else 0)
            self._entries[key] = entry
            while self._bytes > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self._bytes -= gone.nbytes

    def drop(self, name: str, version: int | None = None) -> None:
        """A model's entries, or one version's: it was deleted or unloaded."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == name and version in (None, k[1])]:
                self._bytes -= self._entries.pop(key).nbytes

    @property
    def size_bytes(self) -> int:
        return self._bytes
