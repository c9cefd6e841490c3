"""Host detection: the target fingerprints this machine compiles for and serves from.

A CPU target names the ISA compiled code may use; a CUDA target names the GPU architecture
(`cuda-sm90` for compute capability 9.0), which TensorRT engines and CUDA kernels are built for.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("kiln.hardware")

# Most capable vector ISA first: it decides which compiled code can run here.
_ISA_FLAGS = [("avx512", "avx512f"), ("avx2", "avx2"), ("sse4", "sse4_2"), ("neon", "asimd")]

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,compute_cap,memory.total",
    "--format=csv,noheader",
]
_NVIDIA_SMI_TIMEOUT_S = 10.0
_CAPABILITY_RE = re.compile(r"^(\d+)\.(\d+)$")
# `cuda-sm90`: compute capability 9.0; `cuda-sm120`: 12.0. The last digit is the minor version.
_CUDA_TARGET_RE = re.compile(r"^cuda-sm(\d+)(\d)$")
_MEMORY_RE = re.compile(r"^(\d+)(?:\s*MiB)?$")


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


# LLVM's x86 vector features, each with the /proc/cpuinfo flag that says the host has it.
_LLVM_VECTOR_FEATURES = {
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avxvnni": "avx_vnni",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512cd": "avx512cd",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
}


def llvm_missing_features() -> list[str]:
    """`-feature` for each vector feature this x86 host lacks, for LLVM's `mattr`.

    LLVM names the CPU by its model (`znver4`) and assumes the model's full ISA, but a VM may
    hide some of it: a Zen 4 guest without AVX-512 runs code built for `znver4` into SIGILL.
    """
    flags = cpu_flags()
    if platform.machine() not in ("x86_64", "AMD64") or not flags:
        return []
    return [f"-{feature}" for feature, flag in _LLVM_VECTOR_FEATURES.items() if flag not in flags]


@functools.cache
def cpu_target() -> str:
    """E.g. `cpu-x86_64-znver3-avx2`."""
    flags = cpu_flags()
    isa = next((name for name, flag in _ISA_FLAGS if flag in flags), "generic")
    return f"cpu-{platform.machine()}-{llvm_cpu()}-{isa}"


@dataclass(frozen=True)
class CudaDevice:
    # nvidia-smi's number (PCI bus order), after CUDA_VISIBLE_DEVICES; CUDA agrees when
    # CUDA_DEVICE_ORDER=PCI_BUS_ID or the GPUs are alike, so code that runs kernels asks CUDA.
    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_mb: int | None

    @property
    def target(self) -> str:
        major, minor = self.compute_capability
        return f"cuda-sm{major}{minor}"


def cuda_capability(target: str) -> tuple[int, int] | None:
    """`cuda-sm90` -> (9, 0), the inverse of CudaDevice.target; None for any other name."""
    match = _CUDA_TARGET_RE.match(target)
    return (int(match[1]), int(match[2])) if match else None


def parse_nvidia_smi(text: str) -> list[CudaDevice]:
    """Rows of `index, name, compute_cap, memory.total`; rows that do not parse are skipped.

    The name is everything between the first and the last two fields, so a comma in it is fine.
    """
    devices = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            continue
        index, name, capability, memory = fields[0], ", ".join(fields[1:-2]), fields[-2], fields[-1]
        cap = _CAPABILITY_RE.match(capability)
        if not index.isdigit() or cap is None:
            log.warning("nvidia-smi: skipping a row that does not parse: %r", line)
            continue
        mem = _MEMORY_RE.match(memory)
        devices.append(CudaDevice(int(index), name, (int(cap[1]), int(cap[2])), int(mem[1]) if mem else None))
    return devices


def visible(devices: list[CudaDevice], cuda_visible_devices: str | None) -> list[CudaDevice] | None:
    """Apply CUDA_VISIBLE_DEVICES (which nvidia-smi ignores) and renumber as CUDA does.

    None when the variable uses a form this cannot map (UUIDs, MIG instances): ask CUDA instead.
    """
    if cuda_visible_devices is None:
        return devices
    by_index = {d.index: d for d in devices}
    chosen = []
    for item in (i.strip() for i in cuda_visible_devices.split(",")):
        if item and not item.lstrip("-").isdigit():
            return None
        # CUDA stops at the first entry that names no device (-1 is the usual "none").
        if not item or int(item) not in by_index:
            break
        chosen.append(by_index[int(item)])
    return [CudaDevice(i, d.name, d.compute_capability, d.memory_mb) for i, d in enumerate(chosen)]


def _from_nvidia_smi() -> list[CudaDevice] | None:
    """None when nvidia-smi is missing or fails (no driver, or too old for compute_cap)."""
    try:
        done = subprocess.run(
            NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("nvidia-smi unavailable: %s", exc)
        return None
    if done.returncode != 0:
        log.info("nvidia-smi failed (%d): %s", done.returncode, done.stderr.strip() or done.stdout.strip())
        return None
    return visible(parse_nvidia_smi(done.stdout), os.environ.get("CUDA_VISIBLE_DEVICES"))


def _from_torch() -> list[CudaDevice]:
    """The fallback: initialises CUDA in this process, which nvidia-smi avoids."""
    import torch

    if not torch.version.cuda or not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append(CudaDevice(index, props.name, (props.major, props.minor), props.total_memory >> 20))
    return devices


@functools.cache
def cuda_devices() -> list[CudaDevice]:
    found = _from_nvidia_smi()
    return found if found is not None else _from_torch()


def torch_cuda_device(target: str) -> Any:
    """The torch.device of the first GPU CUDA numbers with `target`'s architecture, or None.
    Asked of CUDA, not nvidia-smi: their orders differ unless CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    import torch

    capability = cuda_capability(target)
    if capability is None or not torch.version.cuda or not torch.cuda.is_available():
        return None
    for index in range(torch.cuda.device_count()):
        if torch.cuda.get_device_capability(index) == capability:
            return torch.device("cuda", index)
    return None


def local_targets() -> list[str]:
    """Targets this host can serve: its CPU, then one per distinct GPU architecture."""
    targets = [cpu_target()]
    for device in cuda_devices():
        if device.target not in targets:
            targets.append(device.target)
    return targets
