"""TensorRT, TVM and TorchScript on a real GPU: compile, verify, pack, load back and run every
test model (TensorRT in fp32 and fp16).

Each backend's tests skip where it cannot run for this GPU (CI, and every CPU host): TensorRT
needs a CUDA device and torch_tensorrt; TVM needs a CUDA device, TVM's CUDA runtime and a CUDA C
compiler for TVM (cuda-bindings for NVRTC, or nvcc with TVM_CUDA_COMPILE_MODE=nvcc); TorchScript
on the GPU, the baseline GPU variants are timed against, needs a CUDA build of torch.
scripts/gpu_check.sh runs them on a GPU host, then the whole service end to end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.artifact import Artifact
from compiler.backends import get_backend, tvm_cuda
from compiler.backends.torchscript import TorchScriptRunner
from compiler.hardware import cuda_devices
from compiler.pipeline import CompileOptions, compile_and_check
from compiler.runner import Runner
from compiler.spec import InputSpec
from service.records import ModelConfig
from tests.client import expected
from tests.models import MODELS, TestModel

TENSORRT = get_backend("tensorrt")
TVM = get_backend("tvm")
TORCHSCRIPT = get_backend("torchscript")
TARGET = cuda_devices()[0].target if cuda_devices() else "cuda-sm90"
UNAVAILABLE = TENSORRT.unavailable_reason(TARGET)
TVM_UNAVAILABLE = TVM.unavailable_reason(TARGET)
TORCHSCRIPT_UNAVAILABLE = TORCHSCRIPT.unavailable_reason(TARGET)
MAX_BATCH = 8
ROOT = Path(__file__).resolve().parent.parent

needs_tensorrt = pytest.mark.skipif(
    UNAVAILABLE is not None,
    reason=f"needs a CUDA device and torch_tensorrt; run scripts/gpu_check.sh on a GPU host ({UNAVAILABLE})",
)
needs_tvm_cuda = pytest.mark.skipif(
    TVM_UNAVAILABLE is not None,
    reason="needs a CUDA device, TVM's CUDA runtime and a CUDA C compiler for TVM; run "
    f"scripts/gpu_check.sh on a GPU host ({TVM_UNAVAILABLE})",
)


needs_cuda_torch = pytest.mark.skipif(
    TORCHSCRIPT_UNAVAILABLE is not None,
    reason=f"needs a CUDA device and a CUDA build of torch; run scripts/gpu_check.sh on a GPU host "
    f"({TORCHSCRIPT_UNAVAILABLE})",
)


@needs_tensorrt
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_compile_verify_and_reload(name: str, precision: str) -> None:
    model = MODELS[name]
    config = ModelConfig.model_validate(model.config(max_batch_size=MAX_BATCH))
    rtol, atol = config.tolerance({"precision": precision})
    spec = InputSpec.from_dicts(model.inputs, MAX_BATCH)
    options = CompileOptions(rtol=rtol, atol=atol, threads=1, backend_options={"precision": precision})

    # Verification against TorchScript on CPU happens inside; a miss raises VerificationError.
    result = compile_and_check(model.torchscript(), spec, "tensorrt", TARGET, options)
    assert result.artifact.meta["precision"] == precision
    assert set(result.latency_ms) == {1, MAX_BATCH}

    runner = TENSORRT.load(Artifact.unpack(result.artifact.pack()))
    for batch in (1, 5, MAX_BATCH):
        x = np.random.default_rng(batch).standard_normal(spec.inputs[0].concrete_shape(batch))
        x = x.astype(np.float32)
        out = runner.run({"x": x})["output0"]
        assert out.dtype == np.float32  # fp16 engines still answer in the model's dtypes
        np.testing.assert_allclose(out, expected(model, x), rtol=rtol, atol=atol)


@needs_tensorrt
def test_options_change_the_engine_not_the_interface() -> None:
    model = MODELS["mlp"]
    spec = InputSpec.from_dicts(model.inputs, MAX_BATCH)
    artifact = TENSORRT.compile(model.torchscript(), spec, TARGET, {"precision": "fp16", "opt_batch_size": 2})
    assert artifact.meta["opt_batch_size"] == 2
    assert artifact.meta["output_dtypes"] == ["float32"]
    assert artifact.target == TARGET


def assert_like_eager(runner: Runner, model: TestModel, spec: InputSpec, rtol: float, atol: float) -> None:
    for batch in (1, 5, MAX_BATCH):
        x = np.random.default_rng(batch).standard_normal(spec.inputs[0].concrete_shape(batch))
        x = x.astype(np.float32)
        np.testing.assert_allclose(runner.run({"x": x})["output0"], expected(model, x), rtol=rtol, atol=atol)


@needs_tvm_cuda
@pytest.mark.parametrize("name", sorted(MODELS))
def test_tvm_cuda_compile_verify_and_reload(name: str) -> None:
    model = MODELS[name]
    config = ModelConfig.model_validate(model.config(max_batch_size=MAX_BATCH))
    rtol, atol = config.tolerance({})
    spec = InputSpec.from_dicts(model.inputs, MAX_BATCH)
    options = CompileOptions(rtol=rtol, atol=atol, threads=1)

    result = compile_and_check(model.torchscript(), spec, "tvm", TARGET, options)
    meta = result.artifact.meta
    assert (meta["tvm_target"]["kind"], meta["cuda_code"]) == ("cuda", tvm_cuda.BINARY)
    assert set(result.latency_ms) == {1, MAX_BATCH}
    assert_like_eager(TVM.load(Artifact.unpack(result.artifact.pack())), model, spec, rtol, atol)


@needs_tvm_cuda
def test_tvm_cuda_source_artifact_compiles_as_it_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a host without TVM's CUDA runtime builds (CUDA C, no cubin) runs on this GPU."""
    model = MODELS["mlp"]
    spec = InputSpec.from_dicts(model.inputs, MAX_BATCH)
    monkeypatch.setenv("TVM_COMPILE_FORCE_FALLBACK", "1")  # TVM's switch: codegen as if no CUDA runtime
    artifact = TVM.compile(model.torchscript(), spec, TARGET, {})
    monkeypatch.delenv("TVM_COMPILE_FORCE_FALLBACK")
    assert artifact.meta["cuda_code"] == tvm_cuda.SOURCE
    assert_like_eager(TVM.load(Artifact.unpack(artifact.pack())), model, spec, 1e-4, 1e-5)


@needs_cuda_torch
@pytest.mark.parametrize("name", sorted(MODELS))
def test_torchscript_on_the_gpu_is_verified_and_reloads_there(name: str) -> None:
    model = MODELS[name]
    rtol, atol = ModelConfig.model_validate(model.config(max_batch_size=MAX_BATCH)).tolerance({})
    spec = InputSpec.from_dicts(model.inputs, MAX_BATCH)
    options = CompileOptions(rtol=rtol, atol=atol, threads=1)

    # Verified against TorchScript on the CPU, and timed against itself on the GPU.
    result = compile_and_check(model.torchscript(), spec, "torchscript", TARGET, options)
    assert result.artifact.target == TARGET
    assert set(result.latency_ms) == set(result.baseline_latency_ms) == {1, MAX_BATCH}
    runner = TORCHSCRIPT.load(Artifact.unpack(result.artifact.pack()))
    assert isinstance(runner, TorchScriptRunner)
    assert runner.device is not None and runner.device.type == "cuda"
    assert_like_eager(runner, model, spec, rtol, atol)


@pytest.mark.skipif(TORCHSCRIPT_UNAVAILABLE is None, reason="this host has a CUDA torch and a GPU")
def test_the_gpu_check_refuses_a_host_without_a_gpu_and_says_why() -> None:
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    check = run("bash", "scripts/gpu_check.sh")
    assert check.returncode == 1
    assert "gpu_check: needs torch 2.13 built for CUDA 13 and a visible GPU" in check.stderr
    assert "is a CPU build" in check.stderr or "CUDA is not available" in check.stderr
    usage = run(sys.executable, "scripts/gpu_report.py", "--help")
    assert usage.returncode == 0 and "resnet18" in usage.stdout
    unknown = run(sys.executable, "scripts/gpu_report.py", "--models", "mlp,resnet50")
    assert unknown.returncode == 2 and "unknown models ['resnet50']" in unknown.stderr
