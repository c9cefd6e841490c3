"""`kiln compile` works offline: compile, verify, benchmark and write a loadable artifact; and bad
arguments to any command are named before any work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from compiler.artifact import Artifact
from compiler.backends import get_backend
from tests.client import expected, sample
from tests.models import MODELS, TUNABLE, UNCONVERTIBLE
from tests.servers import ROOT


def kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_compile_writes_a_verified_artifact(tmp_path: Path) -> None:
    model = MODELS["mlp"]
    source, out = tmp_path / "mlp.pt", tmp_path / "mlp.kiln"
    source.write_bytes(model.torchscript())
    done = kiln("compile", str(source), "--input", "x:float32[-1,64]", "--backend", "tvm", "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified: max abs error" in done.stdout and "speed-up" in done.stdout
    artifact = Artifact.unpack(out.read_bytes())
    assert artifact.backend == "tvm" and artifact.spec.max_batch_size == 8
    assert artifact.meta["report"]["max_abs_error"] < 1e-5
    x = sample(model, 5)
    got = get_backend("tvm").load(artifact).run({"x": x})["output0"]
    np.testing.assert_allclose(got, expected(model, x), rtol=1e-4, atol=1e-5)


def test_compile_failure_is_one_readable_line(tmp_path: Path) -> None:
    source = tmp_path / "svd.pt"
    source.write_bytes(UNCONVERTIBLE.torchscript())
    done = kiln("compile", str(source), "--input", "x:float32[-1,16]", "-o", str(tmp_path / "x.kiln"))
    assert done.returncode == 1
    assert "ConversionError: tvm: no converter for torch op" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "x.kiln").exists()


def test_compile_rejects_a_bad_spec(tmp_path: Path) -> None:
    source = tmp_path / "mlp.pt"
    source.write_bytes(MODELS["mlp"].torchscript())
    done = kiln("compile", str(source), "--input", "x:float33[-1,64]")
    assert done.returncode == 1
    assert "InvalidSpecError" in done.stdout and "unknown dtype 'float33'" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_bad_arguments_are_named_before_any_work(tmp_path: Path) -> None:
    """Each is one message naming the option, not a traceback, and comes before any request or
    compile (an output directory that does not exist is not found after an hour of tuning)."""
    source = tmp_path / "mlp.pt"
    source.write_bytes(MODELS["mlp"].torchscript())
    url = "http://127.0.0.1:9"  # nothing listens: none of these may get as far as asking it
    for args, message in [
        (
            ["upload", str(source), "--name", "m", "--input", "bad", "--url", url],
            "cannot parse input spec 'bad'",
        ),
        (["predict", "m", "--data", f"@{tmp_path / 'nope.json'}", "--url", url], "cannot read"),
        (
            ["compile", str(source), "--input", "x:float32[-1,64]", "-o", str(tmp_path / "no" / "x.kiln")],
            "is not a",
        ),
    ]:
        done = kiln(*args)
        assert done.returncode == 2, done.stdout + done.stderr
        assert message in done.stderr and "Traceback" not in done.stdout + done.stderr


def test_compile_with_tuning_writes_a_static_batch_artifact(tmp_path: Path) -> None:
    model = TUNABLE[0]
    source, out = tmp_path / "tunable.pt", tmp_path / "tunable.kiln"
    source.write_bytes(model.torchscript())
    args = ["--input", "x:float32[-1,32]", "--max-batch-size", "2", "--tuning-trials", "16", "-o", str(out)]
    done = kiln("compile", str(source), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    # Two kernels (the shared layer and the head) per batch size, 16 trials each at least.
    assert "tuned: 64 trials over 4 kernels" in done.stdout
    artifact = Artifact.unpack(out.read_bytes())
    assert artifact.meta["batch_sizes"] == [1, 2] and "new_tuning_records" not in artifact.meta
    runner = get_backend("tvm").load(artifact)
    for batch in (1, 2):
        x = sample(model, batch)
        np.testing.assert_allclose(runner.run({"x": x})["output0"], expected(model, x), rtol=1e-4, atol=1e-5)
