"""TensorRT on a real GPU: compile, verify, pack, load back and run every test model, fp32 and fp16.

Skipped where there is no CUDA device or no torch_tensorrt (CI, and every CPU host);
scripts/gpu_check.sh runs it on a GPU host, then the whole service end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.artifact import Artifact
from compiler.backends import get_backend
from compiler.hardware import cuda_devices
from compiler.pipeline import CompileOptions, compile_and_check
from compiler.spec import InputSpec
from service.records import ModelConfig
from tests.client import expected
from tests.models import MODELS

TENSORRT = get_backend("tensorrt")
TARGET = cuda_devices()[0].target if cuda_devices() else "cuda-sm90"
UNAVAILABLE = TENSORRT.unavailable_reason(TARGET)
MAX_BATCH = 8

pytestmark = pytest.mark.skipif(
    UNAVAILABLE is not None,
    reason=f"needs a CUDA device and torch_tensorrt; run scripts/gpu_check.sh on a GPU host ({UNAVAILABLE})",
)


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


def test_options_change_the_engine_not_the_interface() -> None:
    model = MODELS["mlp"]
    spec = InputSpec.from_dicts(model.inputs, MAX_BATCH)
    artifact = TENSORRT.compile(model.torchscript(), spec, TARGET, {"precision": "fp16", "opt_batch_size": 2})
    assert artifact.meta["opt_batch_size"] == 2
    assert artifact.meta["output_dtypes"] == ["float32"]
    assert artifact.target == TARGET
