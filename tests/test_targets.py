"""Targets: GPU detection, fingerprints, the TensorRT import guard on this CPU-only host, and
routing by target with two real workers that announce different targets on one Redis."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from compiler import hardware
from compiler.artifact import Artifact
from compiler.backends import family_reason, get_backend
from compiler.backends.tensorrt import _check_options
from compiler.errors import BackendUnavailableError, ConversionError
from compiler.hardware import CudaDevice, cpu_target, parse_nvidia_smi, visible
from compiler.spec import InputSpec
from service.jobs import variant_key
from service.records import (
    ModelConfig,
    Options,
    VariantRecord,
    VariantStatus,
    VersionRecord,
    WorkerRecord,
    now,
)
from service.registry import Registry
from service.settings import Settings
from service.store import open_store
from service.store.local import LocalStore
from tests.client import by_backend, upload, wait_settled
from tests.models import MODELS
from tests.servers import ROOT, KilnProcess, KilnServer, wait_until

MLP = MODELS["mlp"]
H100_ROWS = "0, NVIDIA H100 80GB HBM3, 9.0, 81559 MiB\n1, NVIDIA H100 80GB HBM3, 9.0, 81559 MiB\n"
NO_GPU = "tensorrt: unavailable (no CUDA device)"

# Detection ---------------------------------------------------------------------------------


def test_parse_nvidia_smi() -> None:
    text = (
        H100_ROWS
        + "2, NVIDIA GeForce RTX 3090, 8.6, 24576\n"  # --format=csv,noheader,nounits
        + "3, Tesla T4, Rev. A, 7.5, 15360 MiB\n"  # a comma inside the name
        + "4, Old GPU, [N/A], 4096 MiB\n"  # a driver too old to know compute_cap
        + "No devices were found\n\n"
    )
    devices = parse_nvidia_smi(text)
    assert devices == [
        CudaDevice(0, "NVIDIA H100 80GB HBM3", (9, 0), 81559),
        CudaDevice(1, "NVIDIA H100 80GB HBM3", (9, 0), 81559),
        CudaDevice(2, "NVIDIA GeForce RTX 3090", (8, 6), 24576),
        CudaDevice(3, "Tesla T4, Rev. A", (7, 5), 15360),
    ]
    assert [d.target for d in devices] == ["cuda-sm90", "cuda-sm90", "cuda-sm86", "cuda-sm75"]
    assert CudaDevice(0, "B200", (10, 0), None).target == "cuda-sm100"
    assert parse_nvidia_smi("") == []


def test_cuda_visible_devices_renumbers_as_cuda_does() -> None:
    devices = parse_nvidia_smi(H100_ROWS + "2, NVIDIA A100-SXM4-40GB, 8.0, 40960 MiB\n")
    assert visible(devices, None) == devices
    assert [(d.index, d.target) for d in visible(devices, "2,0") or []] == [
        (0, "cuda-sm80"),
        (1, "cuda-sm90"),
    ]
    assert visible(devices, "") == []
    assert visible(devices, "-1") == []
    assert [d.target for d in visible(devices, "2,7,0") or []] == ["cuda-sm80"]  # stops at 7
    assert visible(devices, "GPU-5f1c2f3a") is None  # UUIDs: CUDA itself must be asked


def fake_nvidia_smi(directory: Path, output: str, code: int = 0) -> None:
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fresh_detection() -> Iterator[None]:
    hardware.cuda_devices.cache_clear()
    yield
    hardware.cuda_devices.cache_clear()


def test_local_targets_from_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_detection: None
) -> None:
    fake_nvidia_smi(tmp_path, H100_ROWS + "2, NVIDIA A100-SXM4-40GB, 8.0, 40960 MiB\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert hardware.local_targets() == [cpu_target(), "cuda-sm90", "cuda-sm80"]


def test_failing_nvidia_smi_falls_back_to_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_detection: None
) -> None:
    fake_nvidia_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate with the driver\n", 9)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert hardware.cuda_devices() == []  # this torch is a CPU build
    assert hardware.local_targets() == [cpu_target()]


def test_settings_targets_override_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().host_targets() == hardware.local_targets()
    monkeypatch.setenv("KILN_TARGETS", '["cuda-sm90"]')
    assert Settings().host_targets() == ["cuda-sm90"]


# The TensorRT backend on a host without CUDA or torch_tensorrt ----------------------------


def test_llvm_drops_the_vector_features_a_vm_hides(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Zen 4 guest without AVX-512: LLVM's `znver4` would emit AVX-512 and the code would
    die of SIGILL, so the TVM target turns those features off."""
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    zen4_guest = {"sse4_2", "avx", "avx2", "fma", "f16c"}
    monkeypatch.setattr(hardware, "cpu_flags", lambda: zen4_guest)
    missing = hardware.llvm_missing_features()
    assert "-avx512f" in missing and "-avx512vnni" in missing and "-avx512bf16" in missing
    assert not {"-avx", "-avx2", "-fma", "-f16c"} & set(missing)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: zen4_guest | {"avx512f", "avx512_vnni"})
    assert "-avx512f" not in hardware.llvm_missing_features()
    monkeypatch.setattr(hardware.platform, "machine", lambda: "aarch64")
    assert hardware.llvm_missing_features() == []


def test_tvm_target_for_this_host_has_only_its_features() -> None:
    pytest.importorskip("tvm")
    from compiler.backends.tvm import host_target

    config = json.loads(str(host_target(2)))
    flags = hardware.cpu_flags()
    assert config["mcpu"] == hardware.llvm_cpu() and config["num-cores"] == 2
    if "avx512f" not in flags and hardware.platform.machine() == "x86_64":
        assert "-avx512f" in config["mattr"]


def test_tensorrt_import_guard_on_this_host() -> None:
    backend = get_backend("tensorrt")
    assert backend.name == "tensorrt"
    assert backend.version() == "torch-tensorrt-not-installed"
    assert backend.unavailable_reason("cuda-sm90") == NO_GPU
    assert backend.unavailable_reason(cpu_target()) == NO_GPU
    spec = InputSpec.parse(["x:float32[-1,64]"], 8)
    with pytest.raises(BackendUnavailableError, match=r"no CUDA device"):
        backend.compile(MLP.torchscript(), spec, "cuda-sm90", {})
    with pytest.raises(BackendUnavailableError, match=r"no CUDA device"):
        backend.load(Artifact("tensorrt", "cuda-sm90", spec, b""))


def test_tensorrt_reasons_with_a_gpu_but_a_cpu_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_detection: None
) -> None:
    fake_nvidia_smi(tmp_path, H100_ROWS)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    backend = get_backend("tensorrt")
    assert backend.unavailable_reason(cpu_target()) == (
        f"tensorrt: unavailable (targets only cuda-smXX; got '{cpu_target()}')"
    )
    assert "no cuda-sm80 device on this host" in (backend.unavailable_reason("cuda-sm80") or "")
    assert "is a CPU build" in (backend.unavailable_reason("cuda-sm90") or "")


def test_torchscript_on_a_gpu_target_needs_that_gpu_and_a_cuda_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_detection: None
) -> None:
    backend = get_backend("torchscript")
    assert backend.unavailable_reason("any") is None
    assert backend.unavailable_reason(cpu_target()) is None
    assert backend.unavailable_reason("cuda-sm90") == (
        f"torchscript: unavailable for cuda-sm90 (torch {torch.__version__} is a CPU build)"
    )
    spec = InputSpec.parse(["x:float32[-1,64]"], 8)
    with pytest.raises(BackendUnavailableError, match="CUDA sees no cuda-sm90 device"):
        backend.load(Artifact("torchscript", "cuda-sm90", spec, MLP.torchscript()))
    # Two H100s and a CUDA build of torch: sm90 is there, sm80 is not.
    fake_nvidia_smi(tmp_path, H100_ROWS)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert backend.unavailable_reason("cuda-sm90") is None
    assert backend.unavailable_reason("cuda-sm80") == (
        "torchscript: unavailable for cuda-sm80 (no cuda-sm80 device on this host; it has ['cuda-sm90'])"
    )


def test_tensorrt_options_are_checked() -> None:
    spec = InputSpec.parse(["x:float32[-1,64]"], 8)
    assert _check_options({"threads": 4}, spec) == ("fp32", 4)
    assert _check_options({"precision": "fp16", "opt_batch_size": 8}, spec) == ("fp16", 8)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"precison": "fp16"}, "unknown option"),
        ({"precision": "int8"}, "option precision must be fp32 or fp16"),
        ({"opt_batch_size": 9}, r"opt_batch_size must be an integer in 1\.\.8"),
    ]
    for options, message in bad:
        with pytest.raises(ConversionError, match=message):
            _check_options(options, spec)
    with pytest.raises(ConversionError, match="dynamic dimension other than the batch"):
        _check_options({}, InputSpec.parse(["x:float32[-1,-1,16]"], 8))


def test_family_reasons() -> None:
    assert family_reason("tensorrt", "cuda-sm90") is None
    assert family_reason("tvm", "cuda-sm90") is None  # a GPU worker's TVM speaks for itself
    assert family_reason("onnxruntime", "cuda-sm90") == (
        "onnxruntime: cuda targets are not supported (only cpu)"
    )
    assert family_reason("tensorrt", cpu_target()) is not None


def test_fp16_tolerance_and_artifact_keys() -> None:
    config = ModelConfig.model_validate(MLP.config(max_batch_size=8))
    version = VersionRecord(name="mlp", version=1, sha256="0" * 64, config=config, outputs=[], variant_ids=[])

    def variant(options: Options) -> VariantRecord:
        return VariantRecord(
            id="v",
            model="mlp",
            version=1,
            backend="tvm",
            target="cpu-x",
            options=options,
            status=VariantStatus.queued,
        )

    assert config.tolerance({}) == (1e-4, 1e-5)
    assert config.tolerance({"precision": "fp16"}) == (1e-2, 1e-2)
    options: list[Options] = [{}, {"precision": "fp32"}, {"precision": "fp16"}]
    keys = {variant_key(version, variant(o), 2) for o in options}
    assert len(keys) == 3
    # Built with and timed at another thread count: another artifact (it was the same).
    assert variant_key(version, variant({}), 1) != variant_key(version, variant({}), 2)


def test_live_targets_ignore_stale_workers(tmp_path: Path) -> None:
    registry = Registry(LocalStore(tmp_path))
    registry.announce_worker(WorkerRecord(id="a-1", targets=["cpu-x"], backends={}))
    registry.announce_worker(WorkerRecord(id="b-2", targets=["cuda-sm90"], backends={}, last_seen=now() - 60))
    assert registry.live_targets(max_age_s=15) == {"cpu-x"}
    registry.remove_worker("a-1")
    assert registry.live_targets(max_age_s=3600) == {"cuda-sm90"}
    # A doc silent for a day is a killed worker's: it is dropped, not read by every upload forever.
    registry.announce_worker(WorkerRecord(id="c-3", targets=["cpu-y"], backends={}, last_seen=now() - 86401))
    assert registry.live_targets(max_age_s=10**6) == {"cuda-sm90"}
    assert {d["id"] for d in registry.store.list_docs("worker")} == {"b-2"}


def test_kiln_targets_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "targets"],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", "KILN_TARGETS": json.dumps([cpu_target(), "cuda-sm90"])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "CUDA devices: none found" in done.stdout
    assert "KILN_TARGETS overrides" in done.stdout
    assert NO_GPU in done.stdout
    assert "tvm: unavailable for cuda-sm90 (no CUDA device" in done.stdout


# Embedded mode: "auto" is this host's targets ---------------------------------------------


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("embedded-targets")
    server = KilnServer({"KILN_DATA_DIR": str(root / "data"), "KILN_THREADS": "1"}, root / "kiln.log")
    server.start()
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
    server.stop()


def test_embedded_auto_is_this_host_and_tensorrt_fails_at_once(embedded: httpx.Client) -> None:
    fp16 = {"name": "tensorrt", "options": {"precision": "fp16"}}
    response = upload(embedded, MLP, name="auto-mlp", backends=["tensorrt", fp16], targets=["auto"])
    assert response.status_code == 202, response.text
    variants = [v for v in response.json()["variants"] if v["backend"] == "tensorrt"]
    assert sorted(json.dumps(v["options"]) for v in variants) == ['{"precision": "fp16"}', "{}"]
    for v in variants:
        assert v["target"] == cpu_target()
        assert v["status"] == "failed" and v["error"] == NO_GPU and v["job_id"] is None


def test_embedded_rejects_foreign_targets_repeats_and_bad_options(embedded: httpx.Client) -> None:
    response = upload(embedded, MLP, name="gpu-mlp", backends=["tvm"], targets=["cuda-sm90"])
    assert response.status_code == 422, response.text
    assert "config.targets" in response.json()["detail"] and "cuda-sm90" in response.json()["detail"]
    response = upload(embedded, MLP, name="twice", backends=["tvm", {"name": "tvm"}])
    assert response.status_code == 422 and "repeated" in response.json()["detail"]
    # An option a backend would ignore, or a value it cannot take, names what to fix.
    bad = [
        (
            {"name": "onnxruntime", "options": {"precision": "fp16"}},
            "unknown option(s) ['precision']",
        ),
        ({"name": "tvm", "options": {"threads": 8}}, "known: ['tuning_trials']"),
        (
            {"name": "tvm", "options": {"tuning_trials": -5}},
            "tuning_trials must be an integer in 1..20000",
        ),
        ({"name": "tensorrt", "options": {"precision": "int8"}}, "option precision must be fp32 or fp16"),
        (
            {"name": "tensorrt", "options": {"opt_batch_size": 8}},
            "option opt_batch_size must be an integer in 1..4 (the largest batch); got 8",
        ),
    ]
    for entry, message in bad:
        response = upload(embedded, MLP, name="bad-options", backends=[entry], max_batch_size=4)
        assert response.status_code == 422 and message in response.json()["detail"], response.text
    assert embedded.get("/v1/models/bad-options").status_code == 404


# Redis mode: two workers with different targets ------------------------------------------


def worker_id(proc: KilnProcess) -> str:
    return f"{socket.gethostname()}-{proc.pid}"


def test_jobs_reach_only_workers_of_their_target(redis_url: str, tmp_path: Path) -> None:
    common = {
        "KILN_REDIS_URL": redis_url,
        "KILN_THREADS": "1",
        "KILN_WORKER_HEARTBEAT_S": "1",
        "KILN_WORKER_METRICS_PORT": "0",
    }
    api = KilnServer(common, tmp_path / "api.log")
    cpu = KilnProcess(
        ["worker"], {**common, "KILN_TARGETS": json.dumps([cpu_target()])}, tmp_path / "cpu.log"
    )
    gpu = KilnProcess(["worker"], {**common, "KILN_TARGETS": '["cuda-sm90"]'}, tmp_path / "gpu.log")
    registry = Registry(open_store(Settings(redis_url=redis_url)))
    try:
        for proc in (api, cpu, gpu):
            proc.start()
        wait_until(lambda: registry.live_targets(5) == {cpu_target(), "cuda-sm90"}, 180, "both workers")
        announced = {w.id: w for w in registry.live_workers(5)}
        assert announced[worker_id(gpu)].backends["cuda-sm90"]["tensorrt"] == NO_GPU
        assert announced[worker_id(cpu)].backends[cpu_target()]["tvm"] is None

        with httpx.Client(base_url=api.url, timeout=120) as http:
            response = upload(http, MLP, name="routed", max_batch_size=4, backends=["tvm"], targets=["auto"])
            assert response.status_code == 202, response.text
            planned = {v["target"]: v for v in response.json()["variants"] if v["backend"] == "tvm"}
            assert set(planned) == {cpu_target(), "cuda-sm90"}
            assert all(v["status"] == "queued" for v in planned.values())  # the workers decide
            assert response.json()["unserved_targets"] == []
            variants = wait_settled(http, "routed", response.json()["version"], timeout=600)
            settled = {v["target"]: v for v in variants if v["backend"] == "tvm"}
            jobs = {t: http.get(f"/v1/jobs/{v['job_id']}").json() for t, v in settled.items()}

        on_cpu, on_gpu = settled[cpu_target()], settled["cuda-sm90"]
        assert on_cpu["status"] == "ready", on_cpu["error"]
        assert on_gpu["status"] == "failed" and on_gpu["error"].startswith("tvm: "), on_gpu["error"]
        assert jobs[cpu_target()]["worker"] == worker_id(cpu) and jobs[cpu_target()]["attempts"] == 1
        assert jobs["cuda-sm90"]["worker"] == worker_id(gpu) and jobs["cuda-sm90"]["attempts"] == 1
        assert on_gpu["job_id"] not in cpu.tail(1000) and on_cpu["job_id"] not in gpu.tail(1000)
        assert by_backend(variants, "torchscript")["status"] == "ready"

        gpu.stop()  # a clean stop withdraws the announcement at once
        assert registry.live_targets(3600) == {cpu_target()}
        # With no worker for its target, a compile waits queued: the API and the CLI say so, and
        # the CLI does not wait for it.
        retry = ["add-variants", "routed", "1", "--target", "cuda-sm90", "--retry-failed", "--url", api.url]
        added = subprocess.run(
            [sys.executable, "-m", "service.cli", *retry],
            cwd=ROOT,
            env={**os.environ, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert added.returncode == 0, added.stdout + added.stderr
        assert "no live `kiln worker` for cuda-sm90: its variants stay queued" in added.stdout
        assert re.search(r"^tvm\s+cuda-sm90\s+queued", added.stdout, re.M), added.stdout
        with httpx.Client(base_url=api.url, timeout=120) as http:
            body = {"targets": ["cuda-sm90"], "backends": ["tensorrt"]}
            more = http.post("/v1/models/routed/versions/1/variants", json=body)
            assert more.status_code == 202, more.text
            assert more.json()["unserved_targets"] == ["cuda-sm90"]
    except BaseException:
        for proc in (api, cpu, gpu):
            print(f"--- {proc.log.name}\n{proc.tail(30)}")
        raise
    finally:
        for proc in (gpu, cpu, api):
            proc.stop()
        registry.store.close()


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "200000 100000\n"}, 2.0),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_a_containers_cpu_limit_is_read_from_its_cgroup(
    tmp_path: Path, files: dict[str, str], quota: float | None
) -> None:
    """cgroup v2's cpu.max, else v1's CFS files: a pod's CPU limit, which os.cpu_count ignores."""
    from compiler.threads import cgroup_cpu_quota

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota


def test_threads_follow_the_cpu_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1.5-CPU limit on a host of many cores: 2 threads (rounded up, never 0), not the cores."""
    from compiler import threads

    monkeypatch.delenv("KILN_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: 1.5)
    assert threads.available_cpus() == 2
    assert Settings().threads == 2
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: 0.1)
    assert threads.available_cpus() == 1
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: None)
    assert threads.available_cpus() == 64
