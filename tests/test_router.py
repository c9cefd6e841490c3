"""Routing picks the fastest verified variant, and never a failed, rejected or slower one."""

from __future__ import annotations

import pytest

from service.errors import NotFoundError
from service.records import ModelConfig, TensorConfig, VariantRecord, VariantStatus, VersionRecord
from service.registry import ModelView
from service.router import ANY_TARGET, choose_variant, latency_at, serving_version

HOST = "cpu-x86_64-test-avx2"
GPU = "cuda-sm90"


def variant(
    backend: str,
    status: VariantStatus = VariantStatus.ready,
    ms: dict[int, float] | None = None,
    base: dict[int, float] | None = None,
    target: str | None = None,
    options: dict[str, str | int | float | bool] | None = None,
) -> VariantRecord:
    """`target` by default: TorchScript's on the CPU (`any`) for torchscript, else HOST."""
    target = target or (ANY_TARGET if backend == "torchscript" else HOST)
    return VariantRecord(
        id=f"{backend}-{status}-{target}",
        model="m",
        version=1,
        backend=backend,
        target=target,
        status=status,
        latency_ms_by_batch=ms or {},
        baseline_latency_ms_by_batch=base or {},
        options=options or {},
    )


def test_latency_between_the_timed_batches() -> None:
    """On the line between the timed sizes; a padded variant's, the larger size's."""
    table = {1: 1.0, 8: 8.0}
    assert [latency_at(table, b) for b in (1, 3, 8, 32)] == [1.0, 3.0, 8.0, 8.0]
    assert [latency_at(table, b, padded=True) for b in (1, 3, 8)] == [1.0, 8.0, 8.0]
    assert latency_at({}, 1) is None


def test_a_padded_variant_serves_only_the_sizes_it_is_faster_at() -> None:
    """A tuned tvm build pads a batch of 8 up to its static batch of 64, and costs what 64 does:
    faster than TorchScript at 1 and at 64, 3 times slower at 8. An untuned build of the same
    ratios at both timed sizes runs each batch at its own size, and is faster at every one."""
    ts = variant("torchscript")
    base = {1: 0.096, 64: 1.864}
    tuned = variant("tvm", ms={1: 0.077, 64: 1.261}, base=base, options={"tuning_trials": 64})
    assert [choose_variant([ts, tuned], {HOST}, b) for b in (1, 8, 48, 64)] == [tuned, ts, tuned, tuned]
    untuned = variant("tvm", ms={1: 0.077, 64: 1.261}, base=base)
    assert {choose_variant([ts, untuned], {HOST}, b).backend for b in (1, 8, 48, 64)} == {"tvm"}


def test_torchscript_serves_until_a_faster_variant_is_ready() -> None:
    ts = variant("torchscript")
    queued = variant("tvm", VariantStatus.compiling)
    assert choose_variant([ts, queued], {HOST}, 1) is ts


def test_faster_verified_variant_replaces_torchscript() -> None:
    ts = variant("torchscript")
    tvm = variant("tvm", ms={1: 1.0, 8: 4.0}, base={1: 2.0, 8: 8.0})
    assert choose_variant([ts, tvm], {HOST}, 1) is tvm
    assert choose_variant([ts, tvm], {HOST}, 8) is tvm


def test_slower_variant_never_serves_by_default() -> None:
    ts = variant("torchscript")
    slow = variant("tvm", ms={1: 3.0, 8: 4.0}, base={1: 2.0, 8: 8.0})
    assert choose_variant([ts, slow], {HOST}, 1) is ts
    assert choose_variant([ts, slow], {HOST}, 8) is slow  # faster at large batches only


def test_failed_rejected_and_foreign_variants_never_serve() -> None:
    ts = variant("torchscript")
    fast = {1: 0.1}
    slow_base = {1: 9.0}
    failed = variant("tvm", VariantStatus.failed, fast, slow_base)
    rejected = variant("onnx", VariantStatus.rejected, fast, slow_base)
    foreign = variant("tensorrt", ms=fast, base=slow_base, target="cuda-sm90")
    assert choose_variant([ts, failed, rejected, foreign], {HOST}, 1) is ts


def test_fastest_of_several() -> None:
    ts = variant("torchscript")
    a = variant("tvm", ms={1: 1.5}, base={1: 2.0})
    b = variant("ort", ms={1: 1.0}, base={1: 2.0})
    assert choose_variant([ts, a, b], {HOST}, 1) is b


def test_speedups_compare_runs_timed_under_different_load() -> None:
    """Timed on a busier machine, both the variant and its TorchScript baseline ran slower."""
    ts = variant("torchscript")
    busy = variant("tvm", ms={1: 1.2}, base={1: 2.4})
    quiet = variant("ort", ms={1: 1.0}, base={1: 1.6})
    assert choose_variant([ts, quiet, busy], {HOST}, 1) is busy


def test_pinned_backend() -> None:
    ts = variant("torchscript")
    slow = variant("tvm", ms={1: 3.0}, base={1: 2.0})
    assert choose_variant([ts, slow], {HOST}, 1, backend="tvm") is slow
    with pytest.raises(NotFoundError):
        choose_variant([ts, variant("tvm", VariantStatus.failed)], {HOST}, 1, backend="tvm")


def test_a_gpu_host_serves_from_its_gpu_once_torchscript_runs_there() -> None:
    """GPU variants are timed against the upload on the GPU, CPU ones against it on the CPU, so
    their speedups do not compare: a host with both serves from its GPU, where a compiled variant
    replaces TorchScript only if it beats TorchScript on that GPU."""
    cpu_ts = variant("torchscript")
    ort = variant("onnxruntime", ms={1: 1.0, 8: 4.0}, base={1: 10.0, 8: 40.0})
    gpu_tvm = variant("tvm", ms={1: 0.5, 8: 5.0}, base={1: 1.0, 8: 2.5}, target=GPU)
    gpu_ts = variant("torchscript", target=GPU)
    compiling = variant("torchscript", VariantStatus.compiling, target=GPU)
    # Until TorchScript is ready on the GPU, the GPU's variants have no baseline to serve against.
    assert choose_variant([cpu_ts, ort, gpu_tvm, compiling], {HOST, GPU}, 1) is ort
    assert choose_variant([cpu_ts, ort, gpu_tvm, gpu_ts], {HOST, GPU}, 1) is gpu_tvm
    # At batch 8 TVM is 2x slower than the upload on the GPU: the upload serves, and ORT's 0.1x
    # against the CPU's TorchScript does not count.
    assert choose_variant([cpu_ts, ort, gpu_tvm, gpu_ts], {HOST, GPU}, 8) is gpu_ts
    # A host without the GPU serves from its CPU.
    assert choose_variant([cpu_ts, ort, gpu_tvm, gpu_ts], {HOST}, 1) is ort


def version(n: int) -> VersionRecord:
    config = ModelConfig(name="m", inputs=[TensorConfig(name="x", dtype="float32", shape=[-1, 2])])
    return VersionRecord(name="m", version=n, sha256="0" * 64, config=config, outputs=[], variant_ids=[])


def test_newest_servable_version() -> None:
    old = (version(1), [variant("torchscript")])
    new = (version(2), [variant("tvm", VariantStatus.queued)])
    assert serving_version(ModelView("m", [old, new]), {HOST})[0].version == 1
    newest = (version(3), [variant("torchscript")])
    assert serving_version(ModelView("m", [new, newest, old]), {HOST})[0].version == 3
    with pytest.raises(NotFoundError):
        serving_version(ModelView("m", [new]), {HOST})


def test_the_default_version_serves_before_newer_ones() -> None:
    versions = [(version(n), [variant("torchscript")]) for n in (1, 2, 3)]
    assert serving_version(ModelView("m", versions, default_version=2), {HOST})[0].version == 2
    # Nothing of it is ready here: an error, not the version it rolled back from.
    unready = [versions[0], (version(2), [variant("tvm", VariantStatus.queued)]), versions[2]]
    with pytest.raises(NotFoundError, match="default version 2 has no variant ready"):
        serving_version(ModelView("m", unready, default_version=2), {HOST})
