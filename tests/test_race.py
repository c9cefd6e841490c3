"""The race: ready variants re-timed side by side, in interleaved rounds, so that the router
compares numbers measured under the same load rather than at each variant's compile time."""

from __future__ import annotations

import io
import itertools
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch

from compiler.backends import get_backend
from compiler.benchmark import LONG_FILL, at_worst, benchmark, long_latency
from compiler.race import race
from compiler.spec import TRACE_FILL, InputSpec
from service.races import race_version
from service.records import VariantRecord, VariantStatus, VersionRecord
from service.registry import ARTIFACT_BLOB, Registry
from service.settings import Settings
from service.store.local import LocalStore
from tests.models import MODELS
from tests.registries import ready_version, reference

MLP = MODELS["mlp"]
SPEC = InputSpec.from_dicts(MLP.inputs, 8)


class Sleeper:
    """A runner that takes `ms` per call and logs who ran at which batch size."""

    backend = "test"

    def __init__(self, name: str, ms: float, calls: list[tuple[str, int]]) -> None:
        self.name, self.ms, self.calls = name, ms, calls

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append((self.name, len(inputs["x"])))
        time.sleep(self.ms / 1000)
        return {"output0": inputs["x"]}


class Tripler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(3.0)
        return x + 1


def test_a_model_that_writes_to_its_inputs_changes_no_other_call_s() -> None:
    """TorchScript runs on views of its inputs: one array shared by every call was tripled each
    time, overflowed to inf within the race, and the compiled variants refused it."""
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(Tripler()), buffer)
    spec = InputSpec.from_dicts([{"name": "x", "dtype": "float32", "shape": [-1, 16]}], 1)
    torchscript = get_backend("torchscript")
    seen: list[float] = []

    class Watcher:
        backend = "test"

        def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            seen.append(float(np.abs(inputs["x"]).max()))
            return {"output0": inputs["x"]}

    runners = {
        "tripler": torchscript.load(torchscript.compile(buffer.getvalue(), spec, "any", {})),
        "watcher": Watcher(),
    }
    race(runners, spec, (1,), rounds=2, round_s=0.05, pause_s=0.0, warmup_s=0.05)
    assert len(seen) > 100 and len(set(seen)) == 1 and np.isfinite(seen[0]), seen[-3:]


def test_rounds_interleave_and_time_every_runner() -> None:
    calls: list[tuple[str, int]] = []
    runners = {"slow": Sleeper("slow", 4.0, calls), "fast": Sleeper("fast", 0.0, calls)}
    timings = race(runners, SPEC, (1, 8), rounds=3, round_s=0.02, pause_s=0.0, warmup_s=0.0)
    assert timings.keys() == {"slow", "fast"} and all(t.keys() == {1, 8} for t in timings.values())
    assert all(ms >= 4.0 for ms in timings["slow"].values())
    assert all(ms < 2.0 for ms in timings["fast"].values())
    # Each round runs every runner at every batch before the next starts, one runner later.
    runs = [key for i, key in enumerate(calls) if i == 0 or calls[i - 1] != key]
    slow_first = [("slow", 1), ("slow", 8), ("fast", 1), ("fast", 8)]
    assert runs == slow_first + slow_first[2:] + slow_first[:2] + slow_first
    with pytest.raises(ValueError, match="at least one round"):
        race(runners, SPEC, (1,), rounds=0, round_s=0.01)


def test_every_runner_warms_up_at_every_batch_before_the_rounds() -> None:
    calls: list[tuple[str, int]] = []
    runners = {name: Sleeper(name, 2.0, calls) for name in ("a", "b")}
    race(runners, SPEC, (1, 8), rounds=1, round_s=0.001, pause_s=0.0, warmup_s=0.1)
    # The two are close, so head-to-head rounds follow these 8 runs of calls.
    runs = [(key, len(list(group))) for key, group in itertools.groupby(calls)][:8]
    # 0.1 s of 2 ms calls: about 50 untimed at each runner and batch, then one round of 5 each.
    assert [key for key, _ in runs] == [("a", 1), ("a", 8), ("b", 1), ("b", 8)] * 2
    assert all(count >= 25 for _, count in runs[:4]) and [count for _, count in runs[4:]] == [5] * 4


def test_runners_close_to_the_leader_race_on_head_to_head() -> None:
    calls: list[tuple[str, int]] = []
    ms = {"leader": 4.0, "close": 4.4, "far": 20.0}
    runners = {name: Sleeper(name, t, calls) for name, t in ms.items()}
    timings = race(runners, SPEC, (1, 8), rounds=2, round_s=0.001, pause_s=0.0, warmup_s=0.0)
    assert all(timings[name][b] >= t for name, t in ms.items() for b in (1, 8))
    # Five calls a measurement past its budget: two to warm up, three timed.
    measured = {key: calls.count(key) // 5 for key in set(calls)}
    # Two rounds of all three, then at each batch 4 more of the two within CLOSE of each other.
    assert measured == {(name, b): 2 if name == "far" else 6 for name in ms for b in (1, 8)}
    extra = [key for i, key in enumerate(calls[5 * 2 * 3 * 2 :]) if i % 5 == 0]
    head_to_head = ["leader", "close", "close", "leader"] * 2
    assert extra == [(name, b) for b in (1, 8) for name in head_to_head]


def test_close_calls_take_no_longer_than_the_rounds_before_them() -> None:
    calls: list[tuple[str, int]] = []
    runners = {name: Sleeper(name, 20.0, calls) for name in ("a", "b")}
    race(runners, SPEC, (1, 8), rounds=2, round_s=0.001, pause_s=0.0, warmup_s=0.0)
    # 2 rounds of 4 measurements; the 16 close-call ones allowed stop after about as long again.
    assert 8 + 6 <= len(calls) // 5 <= 8 + 10


TARGET = Settings().host_targets()[0]
COMPILED = ("onnxruntime", "tvm")
# Compile-time claims no runtime meets: a millionth of TorchScript's time.
STALE = {1: 1e-9, 8: 8e-9}
STALE_BASELINE = {1: 1e-3, 8: 8e-3}


@pytest.fixture(scope="module")
def artifacts() -> dict[str, bytes]:
    pytest.importorskip("onnxruntime")
    model = MLP.torchscript()
    return {b: get_backend(b).compile(model, SPEC, TARGET, {"threads": 1}).pack() for b in COMPILED}


@pytest.fixture
def registry(tmp_path: Path, artifacts: dict[str, bytes]) -> Registry:
    """Model `mlp` v1 with ready TorchScript, ONNX Runtime and TVM variants whose compile-time
    numbers are stale: both claim to be a million times faster than TorchScript."""
    registry = Registry(LocalStore(tmp_path / "store"))
    variants = {"torchscript": reference(STALE), **{b: (TARGET, artifacts[b], STALE) for b in COMPILED}}
    ready_version(registry, MLP, variants, STALE_BASELINE, max_batch_size=8)
    return registry


def mlp_v1(registry: Registry) -> tuple[VersionRecord, dict[str, VariantRecord]]:
    version = registry.get_version("mlp", 1)
    return version, {v.id: v for v in registry.variants_of(version)}


def test_a_race_replaces_stale_compile_time_numbers(registry: Registry) -> None:
    version, _ = mlp_v1(registry)
    race_version(registry, Settings(threads=1, race_rounds=2), version, TARGET)
    _, variants = mlp_v1(registry)
    ort, tvm, ts = variants["onnxruntime"], variants["tvm"], variants["torchscript"]
    assert ort.raced_at is not None and tvm.raced_at is not None
    # One TorchScript timing for both: their ratios compare runs under the same load.
    assert ort.baseline_latency_ms_by_batch == tvm.baseline_latency_ms_by_batch
    baseline = ort.baseline_latency_ms_by_batch
    assert baseline.keys() == {1, 8} and baseline != STALE_BASELINE
    for raced in (ort, tvm):
        assert raced.latency_ms == raced.latency_ms_by_batch[1]
        # Measured, not the claims: nothing runs this MLP 100x faster than TorchScript does.
        assert all(raced.latency_ms_by_batch[b] > baseline[b] / 100 for b in (1, 8))
    # TorchScript is no contestant, but its row shows what its rivals were compared against.
    assert ts.raced_at is None and ts.latency_ms_by_batch == baseline


def test_a_race_that_fails_keeps_the_compile_time_numbers(registry: Registry) -> None:
    version, before = mlp_v1(registry)
    # The child cannot unpack it: the race fails there, and the worker logs it and goes on.
    registry.store.put_blob(ARTIFACT_BLOB.format(key="tvm"), [b"not an artifact"])
    race_version(registry, Settings(threads=1), version, TARGET)
    _, after = mlp_v1(registry)
    for name in COMPILED:
        assert after[name].raced_at is None
        assert after[name].latency_ms_by_batch == before[name].latency_ms_by_batch == STALE


def test_a_store_failure_during_a_race_does_not_raise(registry: Registry) -> None:
    version, _ = mlp_v1(registry)
    registry.store.close()  # every later read raises
    race_version(registry, Settings(threads=1), version, TARGET)


def test_no_race_for_one_compiled_variant_or_zero_rounds(registry: Registry) -> None:
    version, _ = mlp_v1(registry)
    race_version(registry, Settings(threads=1, race_rounds=0), version, TARGET)
    assert mlp_v1(registry)[1]["onnxruntime"].raced_at is None
    registry.update_variant("tvm", status=VariantStatus.failed)
    race_version(registry, Settings(threads=1), version, TARGET)
    assert mlp_v1(registry)[1]["onnxruntime"].raced_at is None


def test_an_earlier_race_finishing_last_does_not_overwrite_a_later_one(registry: Registry) -> None:
    version, _ = mlp_v1(registry)
    later = {1: 5.0, 8: 6.0}
    for name in COMPILED:  # what a race that started after this one wrote meanwhile
        registry.update_variant(name, latency_ms_by_batch=later, raced_at=time.time() + 3600)
    race_version(registry, Settings(threads=1, race_rounds=1), version, TARGET)
    assert all(mlp_v1(registry)[1][name].latency_ms_by_batch == later for name in COMPILED)


def test_a_variant_far_slower_than_torchscript_is_not_raced(registry: Registry) -> None:
    version, _ = mlp_v1(registry)
    # Untuned TVM can take 15 s a call where TorchScript takes 1: it cannot win, timing it would
    # take longest, and without it ONNX Runtime is left alone with nothing to race.
    registry.update_variant("tvm", latency_ms_by_batch={1: 1.0, 8: 8.0})
    race_version(registry, Settings(threads=1), version, TARGET)
    assert all(mlp_v1(registry)[1][name].raced_at is None for name in COMPILED)


class ByLength:
    """A runner whose time follows its input's length: `short` ms at TRACE_FILL, `long` at
    LONG_FILL; or, `refuses`, one that cannot run long inputs."""

    backend = "test"

    def __init__(self, short: float, long: float, refuses: bool = False) -> None:
        self.short, self.long, self.refuses = short, long, refuses

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        length = inputs["x"].shape[1]
        if length == LONG_FILL and self.refuses:
            raise ValueError("at most 16 positions")
        time.sleep((self.short if length == TRACE_FILL else self.long) / 1000)
        return {"output0": inputs["x"][:, :1]}


def test_a_variant_that_wins_short_inputs_and_loses_long_ones_is_weighed_at_its_worst() -> None:
    """Timed at 8 tokens alone, a TVM build of an attention 7x faster than TorchScript there was
    served for 2048 tokens, 2.3x slower."""
    spec = InputSpec.from_dicts([{"name": "x", "dtype": "float32", "shape": [-1, -1]}], 2)
    variant, torchscript = ByLength(short=0.5, long=20.0), ByLength(short=5.0, long=10.0)
    baseline = benchmark(torchscript, spec).latency_ms
    weighed = at_worst(
        benchmark(variant, spec).latency_ms,
        long_latency(variant, spec),
        baseline,
        long_latency(torchscript, spec),
    )
    assert all(weighed[b] > 1.5 * baseline[b] for b in baseline), (weighed, baseline)  # twice as slow, long
    faster = ByLength(short=0.5, long=2.0)  # faster at both: weighed at its worse ratio, still a win
    kept = at_worst(
        benchmark(faster, spec).latency_ms,
        long_latency(faster, spec),
        baseline,
        long_latency(torchscript, spec),
    )
    assert all(kept[b] < 0.5 * baseline[b] for b in baseline), (kept, baseline)
    # A model that cannot run long inputs, or a spec without such dims, is weighed as timed.
    assert long_latency(ByLength(1.0, 1.0, refuses=True), spec) == {}
    assert (
        long_latency(
            torchscript, InputSpec.from_dicts([{"name": "x", "dtype": "float32", "shape": [-1, 8]}], 2)
        )
        == {}
    )
