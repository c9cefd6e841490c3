"""The TVM backend: TorchScript -> Relax -> one self-contained shared library, for the host CPU
(`cpu-...` targets) or an NVIDIA GPU (`cuda-smXX`, in compiler/backends/tvm_cuda.py).

TVM is imported inside the methods, so that a host without it still gets a readable
`unavailable_reason` instead of an ImportError from the backend registry.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compiler.artifact import Artifact
from compiler.backends import options_reason, tvm_cuda
from compiler.backends.base import export_for, threads_of
from compiler.benchmark import benchmark_batches
from compiler.dims import dims_meta
from compiler.errors import BackendUnavailableError, ConversionError
from compiler.hardware import llvm_cpu, llvm_missing_features
from compiler.runner import output_names
from compiler.spec import InputSpec


class TVMRunner:
    backend = "tvm"

    def __init__(
        self, vm: Any, spec: InputSpec, num_outputs: int, batch_sizes: Sequence[int] = (), device: Any = None
    ) -> None:
        # A tuned library has one static function per batch size (`b1`, `b8`); others have `main`.
        self._functions = [(size, vm[f"b{size}"]) for size in sorted(batch_sizes)]
        self._main = vm["main"] if not batch_sizes else None
        self.spec = spec
        # None: the host CPU, inputs and outputs shared with numpy; a GPU: copied to it and back.
        self._device = device
        self.names = output_names(num_outputs)
        # One VirtualMachine is not safe to enter from two threads at once.
        self._lock = threading.Lock()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tvm

        arrays = [inputs[n] for n in self.spec.names]
        function, batch, size = self._main, 0, 0
        if function is None:  # a spec without batched inputs has `b1` alone, and pads nothing
            batch = self.spec.check(inputs)
            size, function = next((s, f) for s, f in self._functions if s >= batch)
            arrays = [
                _pad(a, size) if t.batched else a for t, a in zip(self.spec.inputs, arrays, strict=True)
            ]
        if self._device is None:
            args = [_to_tvm(tvm, a) for a in arrays]
        else:
            args = [tvm.runtime.tensor(np.ascontiguousarray(a), self._device) for a in arrays]
        with self._lock:
            result = function(*args)
        tensors = _flatten(result, tvm.runtime.Tensor)
        if self._device is None:  # numpy shares the outputs' memory, as `_shared` hands it out
            outputs = [_shared(np.from_dlpack(t), arrays) for t in tensors]
        else:
            outputs = [t.numpy() for t in tensors]
        # Cut back what leads with the padded size: a padded build's outputs all do
        # (`_static_batches`), and one of a static batch of 1 may have a 0-d output.
        if batch:
            outputs = [o[:batch] if o.ndim and o.shape[0] == size else o for o in outputs]
        return dict(zip(self.names, outputs, strict=True))


def _shared(output: np.ndarray, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """An output read-only: most are fresh per call, but a constant one (a weight returned as it
    is) is the module's own memory, which a caller's write changed for every later call. One that
    is an input, or a view of one, is copied: it would change with the caller's input array."""
    if any(np.may_share_memory(output, array) for array in inputs):
        output = output.copy()
    output.flags.writeable = False
    return output


def _pad(array: np.ndarray, size: int) -> np.ndarray:
    """Zero rows up to a static batch size; the extra outputs are sliced off after the run."""
    if array.shape[0] == size:
        return array
    padded = np.zeros((size, *array.shape[1:]), array.dtype)
    padded[: array.shape[0]] = array
    return padded


def _to_tvm(tvm: Any, array: np.ndarray) -> Any:
    """A zero-copy view for TVM, which needs 64-byte alignment; tvm.runtime.tensor() costs ~30 us."""
    array = np.ascontiguousarray(array)
    if array.ctypes.data % _ALIGNMENT:
        raw = np.empty(array.nbytes + _ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % _ALIGNMENT
        aligned = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
        aligned[...] = array
        array = aligned
    return tvm.runtime.from_dlpack(array)


_ALIGNMENT = 64
# The revision of Kiln's own lowering, which the version (and so every artifact key) carries
# beside TVM's: artifacts built the old way must not be reused. 2: CUDA convolutions are
# channels-last and split-K.
LOWERING = 2


class TVMBackend:
    name = "tvm"

    def version(self) -> str:
        import tvm

        return f"{tvm.__version__}+kiln-lowering-{LOWERING}"

    def unavailable_reason(self, target: str) -> str | None:
        """For a cuda target: None only where the artifact can be built, loaded and verified,
        which takes a CUDA device. `compile` alone needs less: see `_codegen_reason`."""
        reason = self._codegen_reason(target)
        if reason is None and _is_cuda(target):
            return tvm_cuda.run_reason(target, compiles=False)
        return reason

    def _codegen_reason(self, target: str) -> str | None:
        """Why this host cannot build an artifact for `target`, or None. A cuda artifact can be
        generated on a host without a GPU (a cross-compile); it cannot be loaded there."""
        if not target.startswith("cpu-") and not _is_cuda(target):
            return f"tvm: unknown target {target!r}; expected cpu-... or cuda-smXX"
        try:
            import tvm  # noqa: F401
        except Exception as exc:  # a broken install raises more than ImportError
            return f"tvm: cannot import apache-tvm ({_first_line(exc)})"
        return tvm_cuda.codegen_reason(target) if _is_cuda(target) else None

    def compile(self, model: bytes, spec: InputSpec, target: str, options: dict[str, Any]) -> Artifact:
        """Options: `threads`; `tuning_trials` (0: untuned; cpu targets only), with
        `tuning_records` (earlier records for this target, as WorkloadRecords dicts) and
        `progress` (a callable). A cuda target builds where `_codegen_reason` allows, even
        without a GPU; its artifact then holds CUDA C (meta `cuda_code`)."""
        cuda = _is_cuda(target)
        threads = threads_of(options)
        trials = int(options.get("tuning_trials") or 0)
        if refused := options_reason("tvm", options, target):
            raise ConversionError(refused)
        # A cuda artifact is cross-compiled where it cannot run: only code generation is checked.
        reason = self._codegen_reason(target) if cuda else self.unavailable_reason(target)
        program = export_for(self, model, spec, reason)
        tvm_target = tvm_cuda.tvm_target(target) if cuda else host_target(threads)
        meta: dict[str, Any] = {
            "num_outputs": len(program.graph_signature.user_outputs),
            "tvm_target": json.loads(str(tvm_target)),  # str() of a Target is its JSON
            "tvm_version": self.version(),
            **dims_meta(program, spec),
        }
        if cuda:
            meta["cuda_code"] = tvm_cuda.code_form()
        try:
            if cuda:
                library = _export(tvm_cuda.build(program, tvm_target))
            elif trials > 0:
                library = _build_tuned(program, tvm_target, spec, trials, options, meta)
            else:
                library = _build(program, tvm_target)
        except ConversionError:
            raise
        except Exception as exc:  # TVM raises many types, with C++ traces
            raise ConversionError(f"tvm: {_first_line(exc)}") from exc
        return Artifact(self.name, target, spec, library, meta)

    def load(self, artifact: Artifact) -> TVMRunner:
        import tvm
        from tvm import relax

        device = None
        if _is_cuda(artifact.target):
            compiles = artifact.meta.get("cuda_code") == tvm_cuda.SOURCE
            reason = tvm_cuda.run_reason(artifact.target, compiles)
            if reason is not None:
                raise BackendUnavailableError(reason)
            device = tvm_cuda.device(artifact.target)
            # CUDA C in the artifact is compiled as it loads, for the target's architecture.
            with tvm.target.Target(artifact.meta["tvm_target"]):
                library = _load_module(tvm, artifact.payload)
        else:
            library = _load_module(tvm, artifact.payload)
        vm = relax.VirtualMachine(library, tvm.cpu() if device is None else device)
        batch_sizes = artifact.meta.get("batch_sizes", ())
        return TVMRunner(vm, artifact.spec, int(artifact.meta["num_outputs"]), batch_sizes, device)


def _is_cuda(target: str) -> bool:
    return target.startswith("cuda")


def _load_module(tvm: Any, payload: bytes) -> Any:
    # load_module dlopens a path; the mapping outlives the file, so delete it at once.
    with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as f:
        f.write(payload)
    try:
        return tvm.runtime.load_module(f.name)
    finally:
        os.unlink(f.name)


def host_target(threads: int) -> Any:
    """LLVM for this machine's CPU, less any vector feature the CPU model has and this host
    does not. TVM 0.27 only accepts the JSON form of a target."""
    import tvm

    config: dict[str, Any] = {"kind": "llvm", "mcpu": llvm_cpu(), "num-cores": threads}
    missing = llvm_missing_features()
    if missing:
        config["mattr"] = missing
    return tvm.target.Target(config)


def _build(program: Any, target: Any) -> bytes:
    """Import, compile and link to .so bytes; weights stay embedded so the file stands alone."""
    import tvm

    from compiler.backends.tvm_convert import import_program

    mod = import_program(program)
    return _export(tvm.compile(mod, target, relax_pipeline=_pipeline()))


def _build_tuned(
    program: Any, target: Any, spec: InputSpec, trials: int, options: dict[str, Any], meta: dict[str, Any]
) -> bytes:
    """One static function per batch size, MetaSchedule-tuned, with earlier records reused.

    Adds `batch_sizes`, `tuning` (what was tuned) and `new_tuning_records` (for the shared
    cache; the caller takes them out before the artifact is stored) to `meta`.
    """
    import tvm

    from compiler.backends.tvm_tune import WorkloadRecords, lower_for_tuning, tune_and_apply

    dynamic = [t.name for t in spec.inputs if -1 in t.shape[1:]]
    if dynamic:
        raise ConversionError(f"tvm: tuning needs static shapes past the batch dimension; {dynamic} have -1")
    sizes = benchmark_batches(spec)  # the sizes the worker times: the race compares like with like
    mod = tuning_module(program, sizes)
    known = [WorkloadRecords.from_dict(doc) for doc in options.get("tuning_records") or ()]
    progress = options.get("progress") or (lambda event: None)
    tuned, result = tune_and_apply(lower_for_tuning(mod, target), target, trials, known, progress)
    meta["batch_sizes"] = sizes
    meta["tuning"] = result.summary()
    meta["new_tuning_records"] = [r.to_dict() for r in result.new_records]
    return _export(tvm.compile(tuned, target))


def tuning_module(program: Any, sizes: Sequence[int]) -> Any:
    """The Relax module a tuned build tunes: static batch functions, convolutions channels-last.

    With channels innermost (NHWC data, OHWI weights) MetaSchedule's conv schedules vectorise
    over them. On ResNet-18 at batch 1 (AVX2, 2 cores, 320 trials) that ran in 37.8 ms against
    57.8 ms for NCHW, with eager PyTorch at 45 ms; the transposes around it are cheap.
    """
    from compiler.backends.tvm_convert import channels_last_convs, import_program

    return channels_last_convs(_static_batches(import_program(program), sizes))


def _static_batches(mod: Any, sizes: Sequence[int]) -> Any:
    """main(x: [n, ...]) -> b1(x: [1, ...]), b8(x: [8, ...]): MetaSchedule tunes static shapes only."""
    import tvm
    from tvm import relax, tirx

    main = mod["main"]
    # Tuning takes static shapes past the batch dim (`_build_tuned`), and an unbatched input's
    # first dim is static: the first symbolic first dim is the batch, that of the first batched input.
    batch = next((p.ty.shape[0] for p in main.params if isinstance(p.ty.shape[0], tirx.Var)), None)
    # A request is padded with rows up to a size: an output that does not lead with the batch
    # (a sum over it) cannot be cut back to the request's rows, and the padding changed it.
    if isinstance(batch, tirx.Var) and not _leads_with(main.ret_ty, batch):
        raise ConversionError(
            "tvm: a tuned build pads a request's batch up to a fixed size, so every output must lead "
            "with the batch dimension; this model has one that does not (a sum over the batch, say)"
        )
    functions = {}
    for size in sizes:
        bound = main.bind_symbolic_vars({batch: size}) if isinstance(batch, tirx.Var) else main
        # Bindings that do not depend on the batch (weight transposes) would otherwise be the
        # same Var objects in two functions, which FuseOps rejects ("appears at multiple
        # definition sites").
        fresh = relax.utils.copy_with_new_vars(bound)
        functions[f"b{size}"] = fresh.with_attr("global_symbol", f"b{size}")
    return tvm.IRModule(functions)


def _leads_with(ty: Any, batch: Any) -> bool:
    """Whether every tensor in a (nested tuple) type has `batch` as its first dim."""
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return all(_leads_with(field, batch) for field in ty.fields)
    shape = getattr(ty, "shape", None)
    return shape is not None and len(shape) > 0 and shape[0].same_as(batch)


def _export(executable: Any) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kiln-tvm-") as tmp:
        path = os.path.join(tmp, "model.so")
        executable.export_library(path)
        with open(path, "rb") as f:
            return f.read()


def _pipeline() -> Any:
    """tvm.compile's CPU default (relax.pipeline.default_build_pipeline) plus two passes.

    Untuned, TVM emits naive loops. FoldConstant pre-computes what depends only on weights (the
    transposes of Linear weights); the matmul schedule vectorises the kernels that dominate.
    The fusing cpu_generic pipeline is avoided, as tvm.compile does on CPU; dlight's CPU rules
    (GEMV, Reduction) measured no faster here, and slower on small reductions.
    """
    import tvm
    import tvm.s_tir.dlight as dl
    from tvm.relax import backend, transform

    passes = [
        backend.DispatchSampling(),
        backend.DispatchSortScan(),
        transform.LegalizeOps(),
        transform.FoldConstant(),
        dl.ApplyDefaultSchedule(_matmul_rule()),
        transform.RewriteDataflowReshape(),
        transform.ToNonDataflow(),
        transform.RemovePurityChecking(),
        transform.CallTIRRewrite(),
        transform.StaticPlanBlockMemory(),
        transform.LowerAllocTensor(),
        transform.KillAfterLastUse(),
        transform.LowerRuntimeBuiltin(),
        transform.ComputePrimValue(),
        transform.VMShapeLower(),
        transform.AttachGlobalSymbol(),
    ]
    return tvm.transform.Sequential(passes)


def _matmul_rule() -> Any:
    import tvm.s_tir.dlight as dl
    from tvm import s_tir

    class Matmul(dl.ScheduleRule):
        """Vectorise the output columns of PrimFuncs that are a single matmul block.

        Single-threaded on purpose: for these kernels a thread-pool launch costs more than it saves.
        """

        def apply(self, func: Any, target: Any, _: bool) -> Any:
            sch = s_tir.Schedule(func)
            try:
                return sch if _vectorise_matmul(sch) else None
            except s_tir.schedule.ScheduleError:  # an unusual matmul keeps TVM's plain loops
                return None

    return Matmul()


def _vectorise_matmul(sch: Any) -> bool:
    """Loops [rows..., j, k] -> [rows, j/L, k, L], the L lanes of j vectorised.

    Legalized matmuls read the right operand as [.., k, j], so lanes of j are contiguous, and
    FoldConstant has already transposed Linear weights into that layout.
    """
    from tvm import tirx

    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1 or str(sch.get(blocks[0]).name_hint) != "matmul":
        return False
    block = blocks[0]
    kinds = [var.iter_type for var in sch.get(block).iter_vars]
    loops = sch.get_loops(block)
    if len(loops) < 3 or len(loops) != len(kinds) or kinds[-1] != tirx.IterVar.CommReduce:
        return False
    if any(kind != tirx.IterVar.DataPar for kind in kinds[:-1]):
        return False
    *rows, j, k = loops
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    extent = sch.get(j).extent
    width = extent.value if isinstance(extent, tirx.IntImm) else 0
    lanes = next((n for n in (16, 8, 4) if width and width % n == 0), None)
    if lanes is None:
        sch.reorder(row, k, j)
    else:
        outer, inner = sch.split(j, [None, lanes])
        sch.reorder(row, outer, k, inner)
        sch.vectorize(inner)
    sch.decompose_reduction(block, k)
    return True


def _flatten(value: Any, tensor_type: type) -> list[Any]:
    """The VM returns a tensor or a (nested) array of them; flatten in order like TorchScript."""
    if isinstance(value, tensor_type):
        return [value]
    return [t for item in value for t in _flatten(item, tensor_type)]


def _first_line(exc: BaseException) -> str:
    """The first line that says what went wrong; TVM messages start with a C++ traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [
        line
        for line in lines
        if not line.startswith(("Traceback", "File ", "File\t", "0:", "[bt]")) and line != "^"
    ]
    text = useful[0] if useful else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


backend = TVMBackend()
