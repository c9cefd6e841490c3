"""The ONNX Runtime backend: TorchScript -> ExportedProgram -> ONNX -> an ORT session on the CPU.

ONNX comes from torch's dynamo exporter, fed the ExportedProgram of compiler.frontend (batch dim
symbolic). The legacy TorchScript exporter is not used: it fails on nn.TransformerEncoderLayer
(no ONNX symbolic for aten::is_autocast_enabled). onnxruntime is imported inside the methods, so
the registry imports this module cheaply and a broken install reads as `unavailable_reason`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from compiler.artifact import Artifact
from compiler.backends import family_reason
from compiler.backends.base import export_for, threads_of
from compiler.dims import dims_meta
from compiler.errors import ConversionError
from compiler.runner import output_names
from compiler.spec import InputSpec


class ONNXRuntimeRunner:
    backend = "onnxruntime"

    def __init__(self, session: Any) -> None:
        # InferenceSession.run is thread-safe: the batcher may call it from several threads.
        self._session = session
        # The exporter drops inputs the graph never reads, so feed exactly the session's inputs.
        self._inputs = [i.name for i in session.get_inputs()]
        self.names = output_names(len(session.get_outputs()))

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {name: np.ascontiguousarray(inputs[name]) for name in self._inputs}
        outputs = self._session.run(None, feeds)
        return dict(zip(self.names, outputs, strict=True))


class ONNXRuntimeBackend:
    name = "onnxruntime"

    def version(self) -> str:
        import onnxruntime
        import onnxscript

        # The exporter (torch, onnxscript) shapes the graph as much as the runtime runs it.
        return f"{onnxruntime.__version__}+torch-{torch.__version__}+onnxscript-{onnxscript.__version__}"

    def unavailable_reason(self, target: str) -> str | None:
        if (family := family_reason(self.name, target)) is not None:
            return family
        try:
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401
        except Exception as exc:  # a broken install raises more than ImportError
            return f"onnxruntime: cannot import onnxruntime/onnxscript ({_reason(exc)})"
        return None

    def compile(self, model: bytes, spec: InputSpec, target: str, options: dict[str, Any]) -> Artifact:
        program = export_for(self, model, spec, self.unavailable_reason(target))
        threads = threads_of(options)
        try:
            onnx_program = torch.onnx.export(
                program,
                dynamo=True,
                input_names=spec.names,
                output_names=output_names(len(program.graph_signature.user_outputs)),
                external_data=False,  # weights inside the one payload
                verbose=False,
            )
            assert onnx_program is not None  # dynamo=True always returns the program
            payload = onnx_program.model_proto.SerializeToString()
            # An op ONNX has but ORT's CPU provider lacks fails here, not at serving time.
            session = _session(payload, threads)
        except Exception as exc:  # the exporter and ORT raise many types with long reports
            raise ConversionError(f"onnxruntime: {_reason(exc)}") from exc
        opset = next(o.version for o in onnx_program.model_proto.opset_import if o.domain == "")
        meta = {
            "threads": threads,
            "opset": opset,
            "inputs": [i.name for i in session.get_inputs()],
            "outputs": [o.name for o in session.get_outputs()],
            **dims_meta(program, spec),
        }
        return Artifact(self.name, target, spec, payload, meta)

    def load(self, artifact: Artifact) -> ONNXRuntimeRunner:
        return ONNXRuntimeRunner(_session(artifact.payload, int(artifact.meta["threads"])))


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # Set explicitly, as every runtime's threads are, so variants compare fairly; ORT's pools are
    # per session, so this touches no other runner. One graph, run op after op: no inter-op pool.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _reason(exc: BaseException) -> str:
    """One line: the innermost cause (the exporter wraps it in a multi-page report), ANSI-free."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


_ANSI = re.compile(r"\x1b\[[0-9;]*m")

backend = ONNXRuntimeBackend()
