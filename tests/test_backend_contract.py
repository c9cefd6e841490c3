"""One contract for every compiled CPU backend, on real compiles of the test models.

Each (backend, model) compiles once through the whole pipeline (convert, pack/unpack, load,
verify against TorchScript, benchmark); its packed artifact then runs at batch 1 and 7. An op a
backend cannot convert must fail as a one-line ConversionError, never a traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import io
import logging
import sys

import numpy as np
import pytest
import torch

from compiler.artifact import Artifact
from compiler.backends import get_backend
from compiler.backends import openvino as openvino_backend
from compiler.errors import BackendUnavailableError, ConversionError, VerificationError
from compiler.hardware import cpu_target
from compiler.pipeline import CompileOptions, CompileResult, compile_and_check
from compiler.runner import Runner
from compiler.spec import InputSpec
from compiler.verify import verification_batches
from tests.models import MODELS, UNCONVERTIBLE

RTOL, ATOL = 1e-4, 1e-5
MAX_BATCH = 8
OPTIONS = CompileOptions(rtol=RTOL, atol=ATOL, threads=1)
ALL_MODELS = {**MODELS, UNCONVERTIBLE.name: UNCONVERTIBLE}


def _tvm() -> object:
    try:
        importlib.import_module("compiler.backends.tvm")
    except Exception:  # mid-rewrite or absent: the other backends' contract still runs
        return pytest.param("tvm", marks=pytest.mark.skip(reason="tvm backend not present"))
    return "tvm"


BACKENDS = ["onnxruntime", "inductor", "openvino", _tvm()]
# Inductor has no kernel of its own for svdvals but calls ATen's, so that model really compiles.
SUPPORTS_SVDVALS = {"inductor"}

Results = dict[tuple[str, str], CompileResult]


def spec_of(model: str) -> InputSpec:
    return InputSpec.from_dicts(ALL_MODELS[model].inputs, MAX_BATCH)


@functools.cache
def reference(model: str) -> Runner:
    torchscript = get_backend("torchscript")
    return torchscript.load(torchscript.compile(ALL_MODELS[model].torchscript(), spec_of(model), "any", {}))


def error_bound(model: str) -> float:
    """Passing verification means every element was within ATOL + RTOL * |expected| on its cases."""
    spec = spec_of(model)
    rng = np.random.default_rng(0)  # the cases compiler.verify draws
    cases = [spec.random_inputs(b, rng) for b in verification_batches(spec)]
    scale = max(float(np.abs(out).max()) for case in cases for out in reference(model).run(case).values())
    return ATOL + RTOL * scale


def compile_checked(backend: str, model: str) -> CompileResult:
    return compile_and_check(ALL_MODELS[model].torchscript(), spec_of(model), backend, cpu_target(), OPTIONS)


@pytest.fixture(scope="module")
def results() -> Results:
    """Compiles take seconds to a minute each: every (backend, model) compiles once per module."""
    return {}


def compiled(results: Results, backend: str, model: str) -> CompileResult:
    if (backend, model) not in results:
        results[backend, model] = compile_checked(backend, model)
    return results[backend, model]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiles_verifies_and_benchmarks(results: Results, backend: str, model: str) -> None:
    result = compiled(results, backend, model)
    assert result.artifact.backend == backend
    assert set(result.latency_ms) == set(result.baseline_latency_ms) == {1, MAX_BATCH}
    assert all(ms > 0 for ms in result.latency_ms.values())
    assert 0.0 <= result.max_abs_error <= error_bound(model)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_artifact_runs_at_batch_1_and_7(results: Results, backend: str, model: str) -> None:
    artifact = Artifact.unpack(compiled(results, backend, model).artifact.pack())
    threads = torch.get_num_threads()
    runner = get_backend(backend).load(artifact)
    for batch in (1, 7):
        inputs = artifact.spec.random_inputs(batch, np.random.default_rng(batch))
        if batch == 7:  # what a runner must also take: arrays neither C-ordered nor writable
            inputs = {name: read_only(np.asfortranarray(x)) for name, x in inputs.items()}
        got, want = runner.run(inputs), reference(model).run(inputs)
        assert list(got) == list(want)
        for name, expected in want.items():
            assert got[name].dtype == expected.dtype
            np.testing.assert_allclose(got[name], expected, rtol=RTOL, atol=ATOL, err_msg=name)
    # A runner loaded in the API process must not retune the threads every other runner shares.
    assert torch.get_num_threads() == threads


def read_only(x: np.ndarray) -> np.ndarray:
    x.setflags(write=False)
    return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_unsupported_op_is_a_one_line_conversion_error(backend: str) -> None:
    if backend in SUPPORTS_SVDVALS:
        assert compile_checked(backend, UNCONVERTIBLE.name).max_abs_error <= error_bound(UNCONVERTIBLE.name)
        return
    root = logging.getLogger()
    logging_before = (root.level, list(root.filters), list(root.handlers))
    with pytest.raises(ConversionError) as info:
        compile_checked(backend, UNCONVERTIBLE.name)
    # A failed conversion leaves the process's logging as it was (OpenVINO's set it to ERROR).
    assert (root.level, root.filters, root.handlers) == logging_before
    message = str(info.value)
    assert message.startswith(f"{backend}: ")
    assert "svd" in message
    assert "\n" not in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_version_and_targets(backend: str) -> None:
    implementation = get_backend(backend)
    assert implementation.name == backend
    assert implementation.version()
    assert implementation.unavailable_reason(cpu_target()) is None
    reason = implementation.unavailable_reason("cuda-sm90")
    assert reason is not None and reason.startswith(f"{backend}: ")


def test_openvino_sends_no_telemetry(results: Results) -> None:
    """Without a consent file OpenVINO reports each import and conversion to Google Analytics
    from a forked process; the backend makes it use its no-op stub."""
    compiled(results, "openvino", "mlp")
    assert sys.modules["openvino_telemetry"] is None
    used = sys.modules["openvino.tools.ovc.telemetry_utils"].tm
    assert used.__name__ == "openvino.tools.ovc.telemetry_stub"


def test_openvino_loads_a_bf16_variant_only_where_the_cpu_has_bf16(
    results: Results, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target's name does not say whether its CPUs have bf16: a host without it refuses the
    variant by name, and the runtime serves the next best, rather than a variant run in fp32 at
    a speed no race measured."""
    artifact = compiled(results, "openvino", "mlp").artifact
    bf16 = dataclasses.replace(artifact, meta={**artifact.meta, "precision": "bf16"})
    backend = get_backend("openvino")
    monkeypatch.setattr(openvino_backend, "has_native_bf16", lambda: False)
    with pytest.raises(BackendUnavailableError, match="runs in bf16, which this host's CPU lacks"):
        backend.load(bf16)
    backend.load(artifact)  # fp32 loads anywhere
    monkeypatch.undo()
    if openvino_backend.has_native_bf16():
        assert backend.load(bf16).run({"x": np.ones((2, 64), np.float32)}).keys() == {"output0"}


class Ids(torch.nn.Module):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ids * 3 + 1


class Tokens(torch.nn.Module):
    """Token ids, as a BERT takes them: indices, never past the table's end; and their argmax."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(100, 8)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.embedding(ids).mean(dim=1)
        return pooled, pooled.argmax(dim=1)


def scripted(module: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    return buffer.getvalue()


def test_openvino_refuses_int64_inputs_it_would_truncate() -> None:
    """Its CPU plugin computes int64 in int32: ids past 2**31 came back wrong, and verification's
    small random integers passed them. Ids that index a table, which no such value can reach,
    and int64 outputs (an argmax) are built."""
    spec = InputSpec.from_dicts([{"name": "ids", "dtype": "int64", "shape": [-1, 4]}], MAX_BATCH)
    with pytest.raises(ConversionError, match=r"int64 inputs \['ids'\] past 2\*\*31 give other answers"):
        compile_and_check(scripted(Ids()), spec, "openvino", cpu_target(), OPTIONS)
    tokens = compile_and_check(scripted(Tokens()), spec, "openvino", cpu_target(), OPTIONS)
    assert tokens.max_abs_error < 1e-5
    exact = compile_and_check(scripted(Ids()), spec, "onnxruntime", cpu_target(), OPTIONS)
    big = np.array([[2**40, 2**33 + 5, -(2**35), 7]], np.int64)
    runner = get_backend("onnxruntime").load(exact.artifact)
    assert runner.run({"ids": big})["output0"].tolist() == (big * 3 + 1).tolist()


def test_a_run_that_raises_is_a_rejection() -> None:
    """A sample the model and its compiled variant fail on (an index past an embedding's end)
    rejects the variant with the reason, as a wrong answer would; it never escapes as itself."""
    lookup = torch.jit.script(torch.nn.Embedding(10, 4))
    buffer = io.BytesIO()
    torch.jit.save(lookup, buffer)
    spec = InputSpec.from_dicts([{"name": "x", "dtype": "int64", "shape": [-1, 5]}], MAX_BATCH)
    sample = {"x": np.array([[1, 2, 3, 4, 50]])}
    with pytest.raises(VerificationError, match=r"verification failed: a run raised .*out of range"):
        compile_and_check(buffer.getvalue(), spec, "onnxruntime", cpu_target(), OPTIONS, [sample])
