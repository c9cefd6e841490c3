"""Triton's response cache: a model that opts in (`"response_cache": true` at upload) answers a
request whose inputs it has answered before from memory, without running.

Per process, in an LRU bounded by KILN_RESPONSE_CACHE_MB. Keyed by the model version and the
inputs' names, dtypes, shapes and bytes: any variant of the version may have answered, since every
one was verified against TorchScript.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from service.records import VariantRecord

Key = tuple[str, int, bytes]  # model, version, digest of the inputs
# What an entry holds besides its arrays' data (the arrays' and dict's objects, the key): a
# 1x10 float32 answer took about 670 bytes in all, 40 of them data.
ENTRY_OVERHEAD_BYTES = 1024
# Inputs up to this size are hashed on the event loop: sha256 takes about 0.4 ms for 600 KB.
HASH_INLINE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Cached:
    outputs: dict[str, np.ndarray]
    variant: VariantRecord  # the one that computed them
    nbytes: int


def response_key(name: str, version: int, inputs: Mapping[str, np.ndarray]) -> Key:
    digest = hashlib.sha256()
    for input_name in sorted(inputs):
        array = np.asarray(inputs[input_name], order="C")
        digest.update(f"{input_name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.data)
    return name, version, digest.digest()


class ResponseCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Key, Cached] = OrderedDict()
        self._by_version: defaultdict[tuple[str, int], set[Key]] = defaultdict(set)
        self._bytes = 0
        # Drops of each model's answers so far: an answer computed across one is not kept.
        self._drops: Counter[str] = Counter()
        self._lock = threading.Lock()

    def epoch(self, name: str) -> int:
        """Taken before a request runs, for its `put`."""
        return self._drops[name]

    def get(self, key: Key) -> Cached | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: Key, outputs: Mapping[str, np.ndarray], variant: VariantRecord, epoch: int) -> None:
        """Copies: a request's outputs are views of its batch's, which they would keep alive.
        Read-only, since every hit shares them. Not kept when the model's answers were dropped
        since `epoch` (the cache turned off by a PATCH as it ran, say: its answer would count
        against the budget, and be served when the cache is turned on again)."""
        kept = {}
        for output, array in outputs.items():
            kept[output] = np.array(array, copy=True)
            kept[output].flags.writeable = False
        entry = Cached(kept, variant, ENTRY_OVERHEAD_BYTES + sum(a.nbytes for a in kept.values()))
        if entry.nbytes > self.max_bytes:
            return
        with self._lock:
            if self._drops[key[0]] != epoch:
                return
            self._remove(key)
            self._entries[key] = entry
            self._by_version[key[:2]].add(key)
            self._bytes += entry.nbytes
            while self._bytes > self.max_bytes:
                self._remove(next(iter(self._entries)))

    def drop(self, name: str, version: int | None = None) -> None:
        """A model's entries, or one version's: it was deleted or unloaded."""
        with self._lock:
            self._drops[name] += 1
            versions = [v for v in self._by_version if v[0] == name and version in (None, v[1])]
            for keys in [self._by_version.pop(v) for v in versions]:
                for key in keys:
                    self._bytes -= self._entries.pop(key).nbytes

    def _remove(self, key: Key) -> None:
        gone = self._entries.pop(key, None)
        if gone is not None:
            self._bytes -= gone.nbytes
            keys = self._by_version[key[:2]]
            keys.discard(key)
            if not keys:
                del self._by_version[key[:2]]

    @property
    def size_bytes(self) -> int:
        return self._bytes
