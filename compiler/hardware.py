"""Host detection: the target fingerprint this machine compiles for and serves from."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# Most capable vector ISA first: it decides which compiled code can run here.
_ISA_FLAGS = [("avx512", "avx512f"), ("avx2", "avx2"), ("sse4", "sse4_2"), ("neon", "asimd")]


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


@functools.cache
def llvm_cpu() -> str:
    """LLVM's name for this CPU (e.g. znver3): compiled artifacts are only portable within it."""
    try:
        from tvm.target import codegen
    except ImportError:
        return "generic"
    return str(codegen.llvm_get_system_cpu())


@functools.cache
def cpu_target() -> str:
    """E.g. `cpu-x86_64-znver3-avx2`."""
    flags = cpu_flags()
    isa = next((name for name, flag in _ISA_FLAGS if flag in flags), "generic")
    return f"cpu-{platform.machine()}-{llvm_cpu()}-{isa}"


def local_targets() -> list[str]:
    """Targets this host can serve. CUDA detection arrives with the GPU backends."""
    return [cpu_target()]
