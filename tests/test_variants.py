"""POST /v1/models/{name}/versions/{v}/variants: an uploaded version compiled for more backends,
for targets that joined after its upload, and its failed variants compiled again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from compiler.backends.openvino import has_native_bf16
from compiler.hardware import cpu_target
from service.api.schemas import CompileIn
from service.records import ModelConfig, VariantStatus, WorkerRecord, options_key
from service.registry import Registry
from service.settings import Settings
from service.store import open_store
from tests.client import by_backend, expected, predict, sample, upload, wait_settled
from tests.models import MODELS
from tests.servers import KilnServer, embedded_server, running

MLP = MODELS["mlp"]
NO_GPU = "tensorrt: unavailable (no CUDA device)"


def add(http: httpx.Client, name: str, version: int, **body: Any) -> httpx.Response:
    return http.post(f"/v1/models/{name}/versions/{version}/variants", json=body)


def test_what_a_request_asks_to_compile() -> None:
    config = ModelConfig.model_validate(MLP.config(backends=["tvm"], tuning_trials=64))
    tuned = {"name": "tvm", "options": {"tuning_trials": 64}}
    assert [r.model_dump() for r in CompileIn().requests(config)] == [{"name": "tvm", "options": {}}, tuned]
    more = CompileIn(backends=["onnxruntime"], tuning_trials=500).requests(config)
    assert [(r.name, r.options) for r in more] == [("onnxruntime", {}), ("tvm", {"tuning_trials": 500})]
    assert CompileIn(tuning_trials=64).requests(config) == CompileIn().requests(config)  # not twice
    # Asked for whatever backends lists; it was dropped unless they listed tvm.
    for backends in [["onnxruntime"], []]:
        alone = ModelConfig.model_validate(MLP.config(backends=backends, tuning_trials=64))
        assert [r.model_dump() for r in alone.backend_requests()][len(backends) :] == [tuned], backends
    # JSON's 64.0 is the same option as 64, so the same variant.
    same = CompileIn.model_validate({"backends": [{"name": "tvm", "options": {"tuning_trials": 64.0}}]})
    assert [options_key(r.options) for r in same.requests(config)] == ['{"tuning_trials": 64}']


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("variants")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[KilnServer]:
    with embedded_server(root, KILN_THREADS="1") as srv:
        yield srv


def test_a_version_compiles_another_backend_and_its_failures_again(
    http: httpx.Client, server: KilnServer, root: Path
) -> None:
    response = upload(http, MLP, name="more", max_batch_size=4, backends=["onnxruntime"])
    assert response.status_code == 202, response.text
    ort = by_backend(wait_settled(http, "more", 1), "onnxruntime")
    assert ort["status"] == "ready", ort["error"]

    nothing = add(http, "more", 1)
    assert nothing.status_code == 200, nothing.text
    assert nothing.json() == {
        "name": "more",
        "version": 1,
        "queued": [],
        "skipped": [
            {"backend": "onnxruntime", "options": {}, "target": cpu_target(), "reason": "already ready"}
        ],
        "unserved_targets": [],
    }

    added = add(http, "more", 1, backends=["tvm", "tensorrt"])
    assert added.status_code == 202, added.text
    [queued] = added.json()["queued"]
    assert (queued["backend"], queued["target"], queued["status"]) == ("tvm", cpu_target(), "queued")
    assert [(s["backend"], s["reason"]) for s in added.json()["skipped"]] == [("tensorrt", NO_GPU)]
    variants = wait_settled(http, "more", 1)
    assert [v["backend"] for v in variants] == ["torchscript", "onnxruntime", "tvm"]
    tvm = by_backend(variants, "tvm")
    assert tvm["id"] == queued["id"] and tvm["status"] == "ready", tvm["error"]
    assert tvm["max_abs_error"] is not None and tvm["latency_ms_by_batch"].keys() == {"1", "4"}
    assert http.get(f"/v1/jobs/{queued['job_id']}").json()["status"] == "succeeded"
    x = sample(MLP, 3)
    out = predict(http, "more", x)
    assert out.status_code == 200, out.text
    np.testing.assert_allclose(
        np.array(out.json()["outputs"]["output0"]), expected(MLP, x), rtol=1e-4, atol=1e-5
    )

    # A compile that died (killed for memory, say) left its variant failed. Most failures
    # recur, so it is compiled again only when asked: as the same variant under a new job, here
    # from the artifact cache, while the earlier job keeps its record.
    registry = Registry(open_store(Settings(data_dir=root / "data", redis_url=None)))
    registry.update_variant(ort["id"], status=VariantStatus.failed, error="the compile was killed")
    kept = add(http, "more", 1)
    assert kept.status_code == 200 and kept.json()["queued"] == [], kept.text
    [reason] = [s["reason"] for s in kept.json()["skipped"]]
    assert reason == "already failed: the compile was killed (retry_failed compiles it again)"
    retried = add(http, "more", 1, retry_failed=True)
    assert retried.status_code == 202, retried.text
    [again] = retried.json()["queued"]
    assert (again["id"], again["status"], again["error"]) == (ort["id"], "queued", None)
    assert (again["latency_ms"], again["max_abs_error"], again["raced_at"]) == (None, None, None)
    assert again["job_id"] != ort["job_id"] and http.get(f"/v1/jobs/{ort['job_id']}").status_code == 200
    assert retried.json()["skipped"] == []  # tvm is not the version's own
    ort = by_backend(wait_settled(http, "more", 1), "onnxruntime")
    assert (ort["status"], ort["cache_hit"], ort["error"], ort["job_id"]) == (
        "ready",
        True,
        None,
        again["job_id"],
    )


def test_openvino_builds_an_fp32_and_a_bf16_variant(http: httpx.Client) -> None:
    """Both are verified: fp32 at the default tolerance, bf16 at its own, and really in bf16 (its
    error is far above fp32's). A CPU without native bf16 refuses that one by name."""
    bf16 = {"name": "openvino", "options": {"precision": "bf16"}}
    response = upload(http, MODELS["cnn"], name="ov", max_batch_size=4, backends=["openvino", bf16])
    assert response.status_code == 202, response.text
    variants = [v for v in wait_settled(http, "ov", 1) if v["backend"] == "openvino"]
    fp32, low = sorted(variants, key=lambda v: len(v["options"]))
    assert (fp32["options"], fp32["status"]) == ({}, "ready"), fp32["error"]
    assert fp32["max_abs_error"] <= 1e-5 and fp32["latency_ms_by_batch"].keys() == {"1", "4"}
    assert low["options"] == {"precision": "bf16"}
    if has_native_bf16():
        assert low["status"] == "ready", low["error"]
        # Verification allows atol + rtol * |y| (5e-2 each); this CNN's outputs are below 1.
        assert 100 * fp32["max_abs_error"] < low["max_abs_error"] <= 0.1
    else:
        assert low["status"] == "failed" and "needs a CPU with native bf16" in low["error"]
    x = sample(MODELS["cnn"], 3)
    out = predict(http, "ov", x, backend="openvino")
    assert out.status_code == 200, out.text
    np.testing.assert_allclose(
        np.array(out.json()["outputs"]["output0"]), expected(MODELS["cnn"], x), rtol=5e-2, atol=5e-2
    )


def test_what_cannot_be_compiled_is_refused_by_name(http: httpx.Client) -> None:
    assert upload(http, MLP, name="refused", backends=[]).status_code == 202
    cases = [
        ({"backends": ["tvm", "nope"]}, 422, "backends: unknown backend(s) ['nope']"),
        ({"backends": ["tvm", {"name": "tvm"}]}, 422, "backends: an entry is repeated"),
        ({"targets": ["cuda-sm90"]}, 422, "targets: ['cuda-sm90'] are not this host's"),
        ({"max_batch_size": 8}, 422, "max_batch_size"),
        ({"tuning_trials": -1}, 422, "tuning_trials"),
        ({"backends": [{"name": "inductor", "options": {"mode": "max"}}]}, 422, "known: none"),
        ({"backends": [{"name": "openvino", "options": {"precision": "fp16"}}]}, 422, "fp32 or bf16"),
        (  # the version's max_batch_size is the server default, 8
            {"backends": [{"name": "tensorrt", "options": {"opt_batch_size": 16}}]},
            422,
            "option opt_batch_size must be an integer in 1..8 (the largest batch); got 16",
        ),
    ]
    for body, status, message in cases:
        response = add(http, "refused", 1, **body)
        assert (response.status_code, message in response.json()["detail"]) == (status, True), response.text
    assert add(http, "refused", 9).status_code == 404
    assert "no model named 'nope'" in add(http, "nope", 1).json()["detail"]
    # Nothing was added by the refusals.
    assert [v["backend"] for v in http.get("/v1/models/refused/versions/1").json()["variants"]] == [
        "torchscript"
    ]


def test_a_target_that_joined_after_the_upload_gets_its_variants(redis_url: str, tmp_path: Path) -> None:
    """Uploaded with targets ["auto"] while only this host compiled; a GPU worker joins, and an
    empty request plans the version's backends for its target too, once, except the tuned TVM
    variant, which is for cpu targets, and TorchScript on the GPU, the baseline there."""
    api = KilnServer({"KILN_REDIS_URL": redis_url, "KILN_THREADS": "1"}, tmp_path / "api.log")
    registry = Registry(open_store(Settings(redis_url=redis_url)))
    with running(api), httpx.Client(base_url=api.url, timeout=120) as http:
        response = upload(
            http, MLP, name="joined", backends=["tvm", "tensorrt"], targets=["auto"], tuning_trials=16
        )
        assert response.status_code == 202, response.text
        before = response.json()["variants"]
        assert ("tvm", "cuda-sm90") not in {(v["backend"], v["target"]) for v in before}

        registry.announce_worker(WorkerRecord(id="gpu-1", targets=["cuda-sm90"], backends={}))
        added = add(http, "joined", 1)
        assert added.status_code == 202, added.text
        queued = {(v["backend"], v["target"]): v for v in added.json()["queued"]}
        assert set(queued) == {("torchscript", "cuda-sm90"), ("tvm", "cuda-sm90"), ("tensorrt", "cuda-sm90")}
        for v in queued.values():
            job = http.get(f"/v1/jobs/{v['job_id']}").json()
            assert (job["status"], job["target"], job["variant_id"]) == ("queued", "cuda-sm90", v["id"])
        skipped = {(s["backend"], s["target"]): s["reason"] for s in added.json()["skipped"]}
        # No worker consumes this host's queue here: its variants wait, and are not queued twice.
        assert skipped[("tvm", cpu_target())] == "already queued"
        tuned = [s for s in added.json()["skipped"] if s["options"] == {"tuning_trials": 16}]
        reasons = {s["target"]: s["reason"] for s in tuned}
        assert reasons[cpu_target()] == "already queued"
        assert reasons["cuda-sm90"].startswith("tvm: tuning_trials is for cpu targets;")
        assert add(http, "joined", 1).status_code == 200
        version = http.get("/v1/models/joined/versions/1").json()
        assert len(version["variants"]) == len(before) + 3
        assert {v["target"] for v in version["variants"]} == {"any", cpu_target(), "cuda-sm90"}
    registry.store.close()
