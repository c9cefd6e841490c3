"""The TVM backend's CUDA half: `cuda-smXX` targets, dlight's GPU schedules, and loading on a GPU.

Code generation needs no GPU. TVM writes CUDA C for every kernel; where TVM's CUDA runtime is
loaded (a GPU host), tvm.compile also turns that C into a cubin, and the artifact holds the
cubin. Elsewhere the artifact holds the CUDA C (`meta["cuda_code"] == "source"`), and TVM
compiles it when a GPU host loads the artifact. Either way CUDA C -> cubin is TVM's
`tvm_callback_cuda_compile`: NVRTC through the cuda-bindings package (TVM's default), or nvcc
with TVM_CUDA_COMPILE_MODE=nvcc; both need the CUDA toolkit's headers.

Loading and running need a CUDA device of the target's architecture and TVM's CUDA runtime
(libtvm_runtime_cuda.so, which needs the driver's libcuda.so.1 and libcudart).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

from compiler.errors import BackendUnavailableError
from compiler.hardware import cuda_capability, cuda_devices

# meta["cuda_code"]: what the artifact's CUDA module holds.
SOURCE = "source"  # CUDA C, compiled to a cubin by TVM when the artifact is loaded
BINARY = "binary"  # a cubin (or PTX) compiled when the artifact was built


def tvm_target(target: str) -> Any:
    """`cuda-sm90` -> TVM's cuda target for sm_90, host code for a generic x86-64/aarch64 CPU.

    TVM 0.27 only accepts the JSON form. The host side is the VM's glue and kernel launches,
    so it is not tuned to the compiling CPU: the GPU host that serves may have another.
    """
    import tvm

    capability = cuda_capability(target)
    if capability is None:
        raise ValueError(f"not a cuda-smXX target: {target!r}")
    arch = "sm_{}{}".format(*capability)
    return tvm.target.Target({"kind": "cuda", "arch": arch, "host": {"kind": "llvm"}})


def codegen_reason(target: str) -> str | None:
    """Why this host cannot build a `target` artifact (TVM is importable), or None."""
    import tvm

    if cuda_capability(target) is None:
        return f"tvm: unknown target {target!r}; expected cpu-... or cuda-smXX"
    if tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        return "tvm: this TVM build has no CUDA code generator (target.build.cuda)"
    if tvm.runtime.enabled("cuda"):  # tvm.compile compiles the CUDA C here, not at load
        reason = compiler_reason()
        if reason is not None:
            return f"tvm: cannot compile CUDA C for {target} ({reason})"
    return None


def run_reason(target: str, compiles: bool) -> str | None:
    """Why a `target` artifact cannot be loaded and run here, or None. `compiles`: the
    artifact holds CUDA C, which TVM compiles when it loads."""
    import tvm

    found = sorted({d.target for d in cuda_devices()})
    if not found:
        return f"tvm: unavailable for {target} (no CUDA device; its CUDA code can be generated here, not run)"
    if target not in found:
        return f"tvm: unavailable for {target} (no {target} device on this host; it has {found})"
    if not tvm.runtime.enabled("cuda"):
        return f"tvm: unavailable for {target} (TVM's CUDA runtime is not loaded: {_runtime_load_error()})"
    if compiles:
        reason = compiler_reason()
        if reason is not None:
            return f"tvm: unavailable for {target} (the artifact holds CUDA C; {reason})"
    return None


def compiler_reason() -> str | None:
    """Why TVM's tvm_callback_cuda_compile would fail here, or None; it reads the mode per call."""
    from tvm.support import nvcc

    mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc").lower()
    if mode == "nvcc":
        return None if shutil.which("nvcc") else "TVM_CUDA_COMPILE_MODE=nvcc, but nvcc is not on PATH"
    if mode != "nvrtc":
        return f"TVM_CUDA_COMPILE_MODE={mode!r}; TVM knows nvrtc and nvcc"
    try:
        bindings = importlib.util.find_spec("cuda.bindings")
    except ModuleNotFoundError:
        bindings = None
    if bindings is None:
        return "TVM's NVRTC mode needs the cuda-bindings package; or set TVM_CUDA_COMPILE_MODE=nvcc"
    try:
        root = Path(nvcc.find_cuda_path())
    except RuntimeError:
        return "NVRTC needs the CUDA toolkit's headers: set CUDA_PATH"
    if not (root / "include" / "cuda_runtime.h").exists():
        return f"NVRTC needs the CUDA toolkit's headers; {root}/include has no cuda_runtime.h (set CUDA_PATH)"
    return None


def code_form() -> str:
    """What tvm.compile puts in the CUDA module on this host: see the module docstring."""
    import tvm

    forced = os.environ.get("TVM_COMPILE_FORCE_FALLBACK", "").lower() not in ("", "0", "false")
    return BINARY if tvm.runtime.enabled("cuda") and not forced else SOURCE


def build(
    program: Any, target: Any, *, channels_last: bool = True, split_k: bool = True, matmul: Any = None
) -> Any:
    """Import and compile with TVM's CUDA pipeline: LegalizeOps, FoldConstant, fusion, then
    dlight's default GPU schedules (Matmul, GEMV, Reduction, GeneralReduction, Fallback), so an
    untuned build binds every loop to GPU threads. Returns the VM executable.

    dlight's Matmul rule also takes each convolution, as an implicit GEMM: rows are output pixels,
    columns output channels, the reduction runs over (kernel y, kernel x, input channel). With
    `channels_last` (NHWC data, OHWI weights) that reduction is contiguous in memory in both
    operands, so the tiles it stages in shared memory load coalesced. With `split_k`, deep
    convolutions whose tiles would leave most of the GPU idle split their reduction
    (compiler/backends/tvm_split_k.py). `matmul`: a `dlight.gpu.Matmul.Config` in place of TVM's
    CUDA one. benchmarks/tvm_cuda.py times each choice against eager PyTorch.
    """
    import tvm

    from compiler.backends.tvm_convert import channels_last_convs, import_program

    mod = import_program(program)
    if channels_last:
        mod = channels_last_convs(mod)
    return tvm.compile(mod, target, relax_pipeline=_pipeline(target, split_k, matmul))


def _pipeline(target: Any, split_k: bool, matmul: Any) -> Any:
    """TVM's default CUDA pipeline (tvm.relax.backend.cuda.pipeline), with split-K convolutions
    and `matmul` (or TVM's own config) for dlight's Matmul rule."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cuda import pipeline as cuda
    from tvm.s_tir import dlight as dl

    from compiler.backends.tvm_split_k import legalize_conv2d

    config = matmul or dl.gpu.Matmul().get_configs(target)

    class _Matmul(dl.gpu.Matmul):
        def get_configs(self, target: Any) -> Any:
            return config

    # dlight's tiles: rows (output pixels) x columns (output channels) per thread block.
    rows = config.vthread_x * config.block_size_x * config.micro_size_x
    cols = config.vthread_y * config.block_size_y * config.micro_size_y
    legalize = [
        relax.transform.LegalizeOps({"relax.nn.conv2d": legalize_conv2d(rows, cols)} if split_k else None),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        dl.ApplyDefaultSchedule(
            _Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
        ),
    ]
    passes = cuda.library_dispatch_passes(target) + legalize + cuda.dataflow_lower_passes(target)
    sequence = tvm.transform.Sequential(passes + cuda.finalize_passes(target))

    @tvm.transform.module_pass(opt_level=0)
    def pipeline(mod: Any, _context: Any) -> Any:
        with target:  # as TVM's own pipeline: dlight reads the current target
            return sequence(mod)

    return pipeline


def cuda_modules(library: Any) -> list[Any]:
    """The CUDA modules imported by a compiled library (the host module imports them)."""
    found = []
    pending = [library]
    while pending:
        module = pending.pop()
        if module.kind == "cuda":
            found.append(module)
        pending.extend(module.imports)
    return found


def device(target: str) -> Any:
    """The first device CUDA numbers with this architecture. Asked of CUDA, not nvidia-smi:
    their orders differ unless CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    import tvm

    want = "{}.{}".format(*(cuda_capability(target) or (0, 0)))
    index = 0
    while tvm.cuda(index).exist:
        if tvm.cuda(index).compute_version == want:
            return tvm.cuda(index)
        index += 1
    raise BackendUnavailableError(f"tvm: unavailable for {target} (CUDA sees no {target} device)")


def _runtime_load_error() -> str:
    """Why libtvm_runtime_cuda.so did not load: TVM ignores the error, the dynamic loader says it."""
    import tvm

    library = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    if not library.exists():
        return f"this TVM has no {library.name}"
    try:
        ctypes.CDLL(str(library), mode=os.RTLD_LOCAL)
    except OSError as exc:
        return str(exc)
    return "tvm.runtime.enabled('cuda') is False"
