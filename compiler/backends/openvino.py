"""The OpenVINO backend: TorchScript -> ExportedProgram -> an OpenVINO model on the CPU plugin.

OpenVINO's PyTorch frontend converts the ExportedProgram of compiler.frontend directly (no ONNX
in between). The artifact holds the model as OpenVINO IR (its XML and weights), not a compiled
blob: the CPU plugin compiles at load for the CPU it finds, since a target names the CPU's
family and vector width, not every extension the plugin may use (AMX, say).

Option `precision`: "fp32" (the default; OpenVINO's CPU plugin would otherwise pick bf16 on a
CPU that has it) or "bf16", which runs convolutions and matrix products in bfloat16 on a CPU
with native bf16 (AVX512-BF16, AMX), verified at the config's bf16 tolerance. A worker whose
CPU lacks native bf16 refuses to build that variant, and a host whose CPU lacks it refuses to
load one: a target's name does not say whether its CPUs have bf16, and there the plugin would run
such a variant in fp32, at a speed no race measured. The runtime then serves the next best.

The plugin writes by index unchecked (compiler.backends.hazards) and computes some arithmetic
otherwise than torch past the values verification draws (compiler.backends.openvino_numerics):
such programs are refused before conversion.
"""

from __future__ import annotations

import functools
import logging
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compiler.artifact import Artifact
from compiler.backends import ANY_TARGET, family_reason
from compiler.backends.base import export_for, threads_of
from compiler.backends.hazards import refuse_indexed_writes
from compiler.backends.openvino_numerics import numerics_reason
from compiler.backends.torchscript import backend as torchscript
from compiler.dims import dims_meta
from compiler.errors import BackendUnavailableError, ConversionError
from compiler.runner import output_names
from compiler.spec import InputSpec

PRECISIONS = {"fp32": "f32", "bf16": "bf16"}


class OpenVINORunner:
    backend = "openvino"

    def __init__(self, compiled: Any, spec: InputSpec) -> None:
        self._compiled = compiled
        self._tensor = _openvino().Tensor
        self._names = spec.names
        self.names = output_names(len(compiled.outputs))
        # An infer request runs one call at a time; the batcher's threads each get their own.
        self._requests = threading.local()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self._compiled.create_infer_request()
        # Tensors set one by one rather than through `infer(inputs)`, whose conversions took
        # 35 us of a small MLP's 57 here. They share the arrays' memory, and the request keeps no
        # reference to them, so `arrays` holds them until `infer` returns; sharing needs them
        # contiguous and writable, which `np.require` copies them to only when they are not.
        arrays = [np.require(inputs[name], requirements=["C", "W"]) for name in self._names]
        for i, array in enumerate(arrays):
            request.set_input_tensor(i, self._tensor(array, shared_memory=True))
        request.infer()
        # Copied out: the request reuses its output buffers on its next call.
        return {name: request.get_output_tensor(i).data.copy() for i, name in enumerate(self.names)}


class OpenVINOBackend:
    name = "openvino"

    def version(self) -> str:
        # The frontend that converts torch's graph ships with OpenVINO; torch shapes that graph.
        return f"{_openvino().__version__}+torch-{torch.__version__}"

    def unavailable_reason(self, target: str) -> str | None:
        if (family := family_reason(self.name, target)) is not None:
            return family
        try:
            _openvino()
        except Exception as exc:  # a broken install raises more than ImportError
            return f"openvino: cannot import openvino ({type(exc).__name__}: {exc})"
        return None

    def compile(self, model: bytes, spec: InputSpec, target: str, options: dict[str, Any]) -> Artifact:
        program = export_for(self, model, spec, self.unavailable_reason(target))
        threads = threads_of(options)
        precision = str(options.get("precision", "fp32"))
        if precision == "bf16" and not has_native_bf16():
            raise BackendUnavailableError("openvino: precision bf16 needs a CPU with native bf16")
        refuse_indexed_writes(self.name, program.graph)
        if (reason := numerics_reason(program)) is not None:
            raise ConversionError(f"openvino: {reason}")
        try:
            model_xml, weights = _to_ir(program, spec)
            meta = {
                "threads": threads,
                "precision": precision,
                "xml_bytes": len(model_xml),
                **dims_meta(program, spec),
            }
            artifact = Artifact(self.name, target, spec, model_xml + weights, meta)
            runner = self.load(artifact)  # an op the CPU plugin lacks fails here, not at serving time
            _check_wide_ints(model, spec, runner)
        except ConversionError as exc:
            raise ConversionError(f"openvino: {exc}") from exc
        except Exception as exc:  # the frontend and the plugin raise many types with C++ traces
            raise ConversionError(f"openvino: {_reason(exc)}") from exc
        return artifact

    def load(self, artifact: Artifact) -> OpenVINORunner:
        if artifact.meta["precision"] == "bf16" and not has_native_bf16():
            raise BackendUnavailableError(
                "openvino: this variant runs in bf16, which this host's CPU lacks (AVX512-BF16 or AMX)"
            )
        ov = _openvino()
        split = int(artifact.meta["xml_bytes"])
        weights = np.frombuffer(artifact.payload, np.uint8, offset=split)
        model = _core().read_model(artifact.payload[:split].decode(), ov.Tensor(weights))
        config = {
            # Set explicitly, as every runtime's threads are, so variants compare fairly.
            "INFERENCE_NUM_THREADS": int(artifact.meta["threads"]),
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": PRECISIONS[artifact.meta["precision"]],
            # Pinned threads would fight the other runtimes' pools in the same process.
            "ENABLE_CPU_PINNING": False,
        }
        return OpenVINORunner(_core().compile_model(model, "CPU", config), artifact.spec)


def _check_wide_ints(model: bytes, spec: InputSpec, runner: OpenVINORunner) -> None:
    """The CPU plugin computes int64 in int32, and verification's small random integers cannot
    tell: int64 inputs past 2**31 must give TorchScript's answers, unless TorchScript takes none
    so large (they are indices, which no such value can reach)."""
    wide = [t.name for t in spec.inputs if t.dtype == "int64"]
    if not wide:
        return
    rng = np.random.default_rng(0)
    inputs = spec.random_inputs(1, rng)
    inputs.update({name: rng.integers(2**31, 2**40, inputs[name].shape, np.int64) for name in wide})
    reference = torchscript.load(torchscript.compile(model, spec, ANY_TARGET, {}))
    try:
        want = reference.run({k: v.copy() for k, v in inputs.items()})
    except Exception:
        return
    got = runner.run(inputs)
    if any(
        not (
            np.array_equal(got[n], w)
            if w.dtype.kind in "biu"
            else np.allclose(got[n], w, rtol=1e-4, atol=1e-5, equal_nan=True)
        )
        for n, w in want.items()
    ):
        raise ConversionError(
            f"int64 inputs {wide} past 2**31 give other answers than TorchScript's: the CPU plugin "
            "computes int64 in int32"
        )


def _openvino() -> Any:
    """OpenVINO with its usage telemetry off. Without a consent file it sends Google Analytics
    events, from a forked process, when imported and at each conversion; a server must not. With
    `openvino_telemetry` unimportable, OpenVINO uses its own no-op stub."""
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    import openvino

    return openvino


@functools.cache
def _core() -> Any:
    """One ov.Core per process: it holds the plugins, loaded once."""
    return _openvino().Core()


def has_native_bf16() -> bool:
    """Whether OpenVINO's CPU plugin computes in bf16 on this CPU (AVX512-BF16 or AMX)."""
    return "BF16" in _core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def _to_ir(program: Any, spec: InputSpec) -> tuple[bytes, bytes]:
    """The program as OpenVINO IR: its XML and its weights, kept in fp32."""
    ov = _openvino()
    model = _converted(_without_whole_slices(program))
    if len(model.inputs) != len(spec.inputs):
        raise ConversionError(f"the converted model takes {len(model.inputs)} inputs, not {len(spec.inputs)}")
    # The frontend leaves every dimension dynamic; only the batch is.
    shapes = [ov.PartialShape([-1, *t.shape[1:]]) for t in spec.inputs]
    model.reshape(dict(zip(model.inputs, shapes, strict=True)))
    with tempfile.TemporaryDirectory(prefix="kiln-openvino-") as tmp:
        xml = Path(tmp, "model.xml")
        ov.save_model(model, xml, compress_to_fp16=False)  # by default it halves the weights
        return xml.read_bytes(), xml.with_suffix(".bin").read_bytes()


_converting = threading.Lock()


def _converted(program: Any) -> Any:
    """`ov.convert_model`, with the root logger left as it was: a conversion sets it to ERROR with
    a filter of OpenVINO's, and puts it back only when it succeeds."""
    root = logging.getLogger()
    with _converting:  # two at once could restore each other's ERROR
        level, filters, handlers = root.level, list(root.filters), list(root.handlers)
        try:
            return _openvino().convert_model(program)
        finally:
            root.setLevel(level)
            root.filters, root.handlers = filters, handlers


def _without_whole_slices(program: Any) -> Any:
    """The program with every slice given only its input dropped: TorchScript's `x[:, -1]` leaves
    one, and OpenVINO's converter reads past its arguments (an LSTM head fails to convert)."""
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        if node.target is torch.ops.aten.slice.Tensor and len(node.args) == 1 and not node.kwargs:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    program.graph_module.recompile()
    return program


def _reason(exc: BaseException) -> str:
    """One line. OpenVINO's errors run to pages of C++ locations; a conversion's ends with a
    summary that names the ops it has no rule for and those whose conversion failed."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    after = lines[lines.index("Summary:") + 1 :] if "Summary:" in lines else []
    summary = [line.removeprefix("-- ") for line in after if line.startswith("-- ")]
    plain = [line for line in lines if not line.startswith(("Check ", "Exception "))]
    text = "; ".join(summary) or next(iter(plain), "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


backend = OpenVINOBackend()
