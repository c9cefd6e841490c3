"""The serving process's heap: kept out of the garbage collector's way, and given back to the OS
once runners are dropped, so that an eviction really lowers RSS."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable, Iterable


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


# Objects allocated between two young collections; CPython's default is 700. Each young
# collection walks every request in flight, and at the default they took ~8% of the MLP's
# throughput (3,159 -> 3,409 requests/s, means of 3 and 4 A/B runs: one process, wrk at
# concurrency 16); garbage in reference cycles waits a little longer to be freed.
YOUNG_COLLECTION_ALLOCATIONS = 20_000

# Objects frozen by the last collection that walked the whole heap, and (at most) frozen since:
# an over-count, as refcounting frees most of those (an evicted runner's), recounted only when it
# may call for a walk, since gc.get_freeze_count() follows the whole frozen list (~25 ms here).
_walked = 0
_frozen_since_walk = 0


def collect_young_less_often() -> None:
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, *gc.get_threshold()[1:])


def freeze_heap() -> None:
    """Collect, then move every object alive now out of the collector's sight (gc.freeze).
    Otherwise each full collection walks all of torch's, TVM's and the runners' objects: here
    that was a 200 ms pause every few seconds at 1,300 requests/s, and it set the p99 latency.
    Refcounting still frees frozen objects; only a collection after gc.unfreeze finds their
    cycles, and that walks the whole heap (~150 ms, the GIL held): see `_collect_and_freeze`."""
    _collect_and_freeze(dropped=())


def release_memory(dropped: Iterable[Callable[[], object]] | None = None) -> None:
    """Free what the caller dropped, then ask glibc to return free heap pages: without
    malloc_trim, freed weights often stay in the process's arenas and RSS never drops.
    `dropped`: weak references to the evicted runners; None when unknown."""
    _collect_and_freeze(dropped)
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _collect_and_freeze(dropped: Iterable[Callable[[], object]] | None) -> None:
    """Collect the objects made since the heap was last frozen, and freeze what is left. The
    frozen heap is thawed and walked too only when that is needed: when one of `dropped` is still
    alive (a cycle that was alive when the heap was frozen holds it) or they are unknown; and
    when it has grown by a quarter since it was last walked, as CPython paces its own full
    collections, so that frozen objects that became cyclic garbage (requests in flight at a
    load) stay bounded at a cost linear in what is frozen."""
    global _walked, _frozen_since_walk
    gc.collect()
    unfrozen = len(gc.get_objects())
    whole = _walked == 0  # nothing was frozen: that collection walked it all
    if not whole and (dropped is None or any(ref() is not None for ref in dropped) or _grown(unfrozen)):
        gc.unfreeze()
        gc.collect()
        unfrozen = len(gc.get_objects())
        whole = True
    _walked, _frozen_since_walk = (unfrozen, 0) if whole else (_walked, _frozen_since_walk + unfrozen)
    gc.freeze()


def _grown(unfrozen: int) -> bool:
    """Whether the frozen heap, with the `unfrozen` objects about to join it, has grown by more
    than a quarter since it was last walked."""
    global _frozen_since_walk
    if 4 * (_frozen_since_walk + unfrozen) > _walked:
        _frozen_since_walk = gc.get_freeze_count() - _walked
    return 4 * (_frozen_since_walk + unfrozen) > _walked
