"""Dynamic dims that the model ties: token ids and their mask share one length, and a table of
32 positions bounds it. Export infers the ties, the compiled variants serve inside them, and
TorchScript answers the rest, as the upload would.

Real compiles of the models in tests.models; the serving test sets latencies by hand (as
test_runtime does) so that the compiled variant is the one routed to.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from compiler.artifact import Artifact
from compiler.backends import get_backend, load_artifact
from compiler.dims import OutsideDimsError
from compiler.errors import ConversionError, ModelRunError
from compiler.frontend import export_program
from compiler.inspect import inspect_model
from compiler.pipeline import CompileOptions, compile_and_check
from compiler.spec import InputSpec
from compiler.verify import verify
from service.registry import Registry
from service.runtime import Runtime
from service.settings import Settings
from service.store.local import LocalStore
from tests.client import expected as torch_expected
from tests.client import sample
from tests.models import MODELS, SIGNAL, TOKENS, TestModel
from tests.registries import ready_version, reference

pytestmark = pytest.mark.timeout(600)

HOST = "cpu-x86_64-test-avx2"
SPEC = InputSpec.from_dicts(TOKENS.inputs, 4)
TIED = {"axes": {"ids": {"1": "s15"}, "mask": {"1": "s15"}}, "ranges": {"s15": [2, 32]}}


def tokens(length: int, mask_length: int | None = None, batch: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(length)
    ids = rng.integers(0, 100, (batch, length)).astype(np.int64)
    mask = (rng.random((batch, mask_length or length)) < 0.8).astype(np.int64)
    return {"ids": ids, "mask": mask}


def expected(inputs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.inference_mode():
        out: np.ndarray = TOKENS.module()(*(torch.from_numpy(inputs[n]) for n in ("ids", "mask"))).numpy()
    return out


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino", "tvm"])
def test_tied_dims_compile_and_bound_their_variant(backend: str) -> None:
    options = CompileOptions(threads=1)
    result = compile_and_check(TOKENS.torchscript(), SPEC, backend, HOST, options, [tokens(1), tokens(12)])
    dims = result.artifact.meta["dims"]
    assert {k: dims[k] for k in TIED} == TIED
    runner = load_artifact(Artifact.unpack(result.artifact.pack()))
    for length in (2, 20, 32):
        x = tokens(length)
        np.testing.assert_allclose(runner.run(x)["output0"], expected(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(
        OutsideDimsError, match=r"cannot take these inputs: input 'ids' dim 1 is 33, outside 2 to 32"
    ):
        runner.run(tokens(33))
    with pytest.raises(OutsideDimsError, match=r"input 'ids' dim 1 is 1, outside 2 to 32"):
        runner.run(tokens(1))
    with pytest.raises(
        OutsideDimsError, match=r"'mask' dim 1 is 9 and input 'ids' dim 1 is 8, where they must be equal"
    ):
        runner.run(tokens(8, 9))


@pytest.mark.parametrize(("backend", "name"), [("onnxruntime", "lstm"), ("tvm", "mlp")])
def test_a_compiled_variant_refuses_what_it_was_not_verified_on(backend: str, name: str) -> None:
    """A batch of 0 aborted the whole server in ONNX Runtime's LSTM ("terminate called without
    an active exception"), and TVM raises on it; NaN and infinity go through relu otherwise than
    in torch. The compiled variant refuses them, and TorchScript answers them, as uploaded."""
    model = MODELS[name]
    spec = InputSpec.from_dicts(model.inputs, 4)
    artifact = get_backend(backend).compile(model.torchscript(), spec, HOST, {"threads": 1})
    runner = load_artifact(Artifact.unpack(artifact.pack()))
    x = sample(model, 2)
    np.testing.assert_allclose(
        runner.run({"x": x})["output0"], torch_expected(model, x), rtol=1e-4, atol=1e-5
    )
    with pytest.raises(OutsideDimsError, match=r"input 'x' is empty \(shape \[0, "):
        runner.run({"x": x[:0]})
    for value in (np.nan, np.inf):
        x[1, 3] = value
        with pytest.raises(OutsideDimsError, match="input 'x' holds NaN or infinity"):
            runner.run({"x": x})
    uploaded = get_backend("torchscript").compile(model.torchscript(), spec, HOST, {})
    assert load_artifact(uploaded).run({"x": x[:0]})["output0"].shape[0] == 0


def test_verification_leaves_out_samples_of_sizes_the_variant_does_not_serve() -> None:
    artifact = get_backend("onnxruntime").compile(TOKENS.torchscript(), SPEC, HOST, {"threads": 1})
    candidate = load_artifact(artifact)
    reference = get_backend("torchscript").load(
        get_backend("torchscript").compile(TOKENS.torchscript(), SPEC, HOST, {})
    )
    report = verify(candidate, reference, SPEC, 1e-4, 1e-5, [tokens(1), tokens(12)])
    # Batches 1, 3 and 4 at TRACE_FILL, batch 3 at ODD_FILL, and the sample of 12; not that of 1.
    assert report.passed and report.cases == 5


def test_a_dim_bounded_from_below_is_kept_to() -> None:
    spec = InputSpec.from_dicts(SIGNAL.inputs, 4)
    artifact = get_backend("onnxruntime").compile(SIGNAL.torchscript(), spec, HOST, {"threads": 1})
    # A window of 5 bounds the length from below.
    dims = artifact.meta["dims"]
    assert (dims["axes"], dims["ranges"]) == ({"x": {"2": "s38"}}, {"s38": [5, None]})
    with pytest.raises(OutsideDimsError, match="input 'x' dim 2 is 4, outside 5 or more"):
        load_artifact(artifact).run({"x": np.ones((1, 1, 4), np.float32)})


def test_a_dim_of_1_is_served_by_torchscript() -> None:
    """Export traces a dim above 1 and takes it to stay so, even where it reports 1 as its
    smallest: a model that branches on a length of 1 took the other branch."""

    class Branch(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[1] == 1:
                return x * 2.0
            return x * 3.0

    spec = InputSpec.from_dicts([{"name": "x", "dtype": "float32", "shape": [-1, -1]}], 4)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(Branch()), buf)
    artifact = get_backend("onnxruntime").compile(buf.getvalue(), spec, HOST, {"threads": 1})
    assert artifact.meta["dims"]["ranges"] == {"s48": [2, None]}
    runner = load_artifact(artifact)
    np.testing.assert_array_equal(runner.run({"x": np.ones((2, 3), np.float32)})["output0"], 3.0)
    with pytest.raises(OutsideDimsError, match="input 'x' dim 1 is 1, outside 2 or more"):
        runner.run({"x": np.ones((2, 1), np.float32)})


def test_one_inputs_length_read_for_anothers_is_served_only_where_they_are_equal() -> None:
    """Dims traced at one size were one symbol to the converter, and `x[:, :y.shape[1]]` read x's
    length for y's. Traced apart, the program takes y longer than x, which verification's inputs
    (all of one length) are not; traced at one size, x and y are exported as one dim, which the
    variant keeps to: TorchScript answers the rest."""

    class CropSum(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x[:, : y.shape[1]].sum(1) + y.sum(1)

    two = [{"name": n, "dtype": "float32", "shape": [-1, -1]} for n in ("x", "y")]
    spec = InputSpec.from_dicts(two, 4)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(CropSum()), buf)
    result = compile_and_check(buf.getvalue(), spec, "onnxruntime", HOST, CompileOptions(threads=1))
    runner = load_artifact(Artifact.unpack(result.artifact.pack()))
    x = np.ones((1, 8), np.float32)
    np.testing.assert_array_equal(runner.run({"x": x, "y": x})["output0"], [16.0])
    with pytest.raises(
        OutsideDimsError, match="input 'y' dim 1 is 3 and input 'x' dim 1 is 8, where they must be"
    ):
        runner.run({"x": x, "y": x[:, :3]})  # TorchScript: 6, where the one-size graph reads 11


def test_a_dim_the_model_fixes_is_named_by_input_and_axis() -> None:
    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(x.shape[0], 4, 2)

    spec = InputSpec.from_dicts([{"name": "x", "dtype": "float32", "shape": [-1, -1]}], 4)
    with pytest.raises(
        ConversionError, match=r"the export fixes input 'x' dim 1 at 8, which the input spec marks"
    ):
        export_program(torch.jit.script(Fixed()), spec)


def onnxruntime_faster(tmp_path: Path, model: TestModel, spec: InputSpec) -> Iterator[Runtime]:
    """`model` v1: ONNX Runtime measured faster than TorchScript at every batch size."""
    registry = Registry(LocalStore(tmp_path / "store"))
    ort = get_backend("onnxruntime").compile(model.torchscript(), spec, HOST, {"threads": 1}).pack()
    baseline = {1: 1.0, 4: 4.0}
    variants = {"torchscript": reference(baseline), "onnxruntime": (HOST, ort, {1: 0.5, 4: 2.0})}
    ready_version(registry, model, variants, baseline, max_batch_size=4)
    rt = Runtime(registry, Settings(data_dir=tmp_path, targets=[HOST]))
    yield rt
    rt.close()


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    yield from onnxruntime_faster(tmp_path, TOKENS, SPEC)


def test_requests_outside_the_variants_sizes_are_answered_by_torchscript(runtime: Runtime) -> None:
    def predict(x: dict[str, np.ndarray], backend: str | None = None) -> tuple[str, np.ndarray]:
        prediction = asyncio.run(runtime.predict("tokens", None, x, backend=backend))
        return prediction.variant.backend, prediction.outputs["output0"]

    for length, served_by in ((8, "onnxruntime"), (32, "onnxruntime"), (1, "torchscript")):
        x = tokens(length)
        backend, out = predict(x)
        assert backend == served_by, length
        np.testing.assert_allclose(out, expected(x), rtol=1e-4, atol=1e-5)
    # Asked for by name, the variant says why it cannot answer.
    with pytest.raises(
        OutsideDimsError, match="the onnxruntime variant cannot take these inputs: input 'ids' dim 1 is 1"
    ):
        predict(tokens(1), backend="onnxruntime")


def test_a_convolution_over_a_dynamic_length_uploads(tmp_path: Path) -> None:
    path = tmp_path / "signal.pt"
    path.write_bytes(SIGNAL.torchscript())
    spec_doc = {"inputs": SIGNAL.inputs, "max_batch_size": 4}
    inspected = inspect_model(str(path), spec_doc, [], lambda event: None)
    assert inspected["outputs"] == [
        {"name": "output0", "dtype": "float32", "shape": [-1, 4], "batched": True, "rows_apart": True}
    ]


def test_inputs_the_model_cannot_take_are_the_requests_error(runtime: Runtime) -> None:
    # 40 tokens: past the table of 32 positions, in the variant's bounds and in the model's.
    with pytest.raises(
        ModelRunError, match=r"the model failed on these inputs: RuntimeError: The size of tensor"
    ):
        asyncio.run(runtime.predict("tokens", None, tokens(40)))
    # A mask of another length than the ids: the model's failure too, after the variant's refusal.
    with pytest.raises(ModelRunError, match="the model failed on these inputs"):
        asyncio.run(runtime.predict("tokens", None, tokens(8, 9)))


@pytest.fixture
def lstm_runtime(tmp_path: Path) -> Iterator[Runtime]:
    lstm = MODELS["lstm"]
    yield from onnxruntime_faster(tmp_path, lstm, InputSpec.from_dicts(lstm.inputs, 4))


def test_empty_and_non_finite_requests_are_answered_by_torchscript(lstm_runtime: Runtime) -> None:
    """A v2 request of shape [0, 8, 16] reached ONNX Runtime's LSTM, which aborted the server."""

    def predict(x: np.ndarray, backend: str | None = None) -> tuple[str, np.ndarray]:
        prediction = asyncio.run(lstm_runtime.predict("lstm", None, {"x": x}, backend=backend))
        return prediction.variant.backend, prediction.outputs["output0"]

    x = sample(MODELS["lstm"], 2)
    assert predict(x)[0] == "onnxruntime"
    backend, out = predict(x[:0])
    assert (backend, out.shape[0]) == ("torchscript", 0)
    x[1, 2, 3] = np.nan
    backend, out = predict(x)
    assert backend == "torchscript"
    np.testing.assert_allclose(out, torch_expected(MODELS["lstm"], x), rtol=1e-5, atol=1e-6, equal_nan=True)
    with pytest.raises(
        OutsideDimsError, match="the onnxruntime variant cannot take these inputs: input 'x' holds"
    ):
        predict(x, backend="onnxruntime")
