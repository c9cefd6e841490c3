"""Give memory back to the OS once runners are dropped, so an eviction really lowers RSS."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def release_memory() -> None:
    """Collect cycles, then ask glibc to return free heap pages: without malloc_trim, freed
    weights often stay in the process's arenas and RSS never drops."""
    gc.collect()
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
