"""The serving process's heap: kept out of the garbage collector's way, and given back to the OS
once runners are dropped, so that an eviction really lowers RSS."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


# Objects allocated between two young collections; CPython's default is 700. Each young
# collection walks every request in flight, and at the default they took ~8% of the MLP's
# throughput (3,159 -> 3,409 requests/s, means of 3 and 4 A/B runs: one process, wrk at
# concurrency 16); garbage in reference cycles waits a little longer to be freed.
YOUNG_COLLECTION_ALLOCATIONS = 20_000


def collect_young_less_often() -> None:
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, *gc.get_threshold()[1:])


def freeze_heap() -> None:
    """Collect, then move every object alive now out of the collector's sight (gc.freeze).
    Otherwise each full collection walks all of torch's, TVM's and the runners' objects: here
    that was a 200 ms pause every few seconds at 1,300 requests/s, and it set the p99 latency.
    Refcounting still frees frozen objects; `release_memory` thaws them to find cycles."""
    gc.collect()
    gc.freeze()


def release_memory() -> None:
    """Collect cycles, frozen objects included, then ask glibc to return free heap pages:
    without malloc_trim, freed weights often stay in the process's arenas and RSS never drops."""
    gc.unfreeze()
    freeze_heap()
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
