"""Flows 1-3 and 5 in embedded mode: one `kiln serve`, no Redis, real TVM compiles."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.client import by_backend, expected, predict, sample, upload, wait_settled
from tests.models import MODELS, UNCONVERTIBLE
from tests.servers import KilnServer, embedded_server, wait_until

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    with embedded_server(
        tmp_path_factory.mktemp("embedded"), KILN_COMPILE_WORKERS="2", KILN_THREADS="1"
    ) as srv:
        yield srv


def test_no_access_log_by_default(http: httpx.Client, server: KilnServer) -> None:
    assert http.get("/healthz").status_code == 200
    loggers = {line["logger"] for line in server.json_lines()}
    assert "kiln.api" in loggers and "uvicorn.access" not in loggers


@pytest.fixture(scope="module")
def uploaded(http: httpx.Client, server: KilnServer) -> dict[str, list[dict[str, object]]]:
    """Upload every test model at once, then wait: the compiles overlap."""
    versions = {}
    for name, model in MODELS.items():
        response = upload(http, model, max_batch_size=8, backends=["tvm"])
        assert response.status_code == 202, response.text
        body = response.json()
        assert body["deduplicated"] is False
        # Serve on upload: TorchScript is ready before any compile has finished.
        assert by_backend(body["variants"], "torchscript")["status"] == "ready"
        assert by_backend(body["variants"], "tvm")["status"] == "queued"
        versions[name] = body["version"]
    try:
        return {name: wait_settled(http, name, v, timeout=900) for name, v in versions.items()}
    except TimeoutError:
        print(server.tail(80))
        raise


@pytest.mark.parametrize("name", list(MODELS))
def test_tvm_variant_ready_and_matches_torch(
    http: httpx.Client, uploaded: dict[str, list[dict[str, object]]], name: str
) -> None:
    tvm = by_backend(uploaded[name], "tvm")
    assert tvm["status"] == "ready", tvm["error"]
    assert isinstance(tvm["max_abs_error"], float) and tvm["max_abs_error"] <= 1e-4
    assert tvm["latency_ms_by_batch"].keys() == {"1", "8"}
    model = MODELS[name]
    for batch in (1, 7):
        x = sample(model, batch)
        response = predict(http, name, x, backend="tvm")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["variant"]["backend"] == "tvm"
        assert body["variant"]["id"] == tvm["id"]
        out = np.asarray(body["outputs"]["output0"], dtype=np.float32)
        assert out.shape[0] == batch
        np.testing.assert_allclose(out, expected(model, x), rtol=1e-4, atol=1e-5)


def test_default_route_serves_fastest_verified(
    http: httpx.Client, uploaded: dict[str, list[dict[str, object]]]
) -> None:
    for name in MODELS:
        model = http.get(f"/v1/models/{name}").json()
        tvm = by_backend(model["versions"][-1]["variants"], "tvm")
        faster = tvm["latency_ms_by_batch"]["1"] < tvm["baseline_latency_ms_by_batch"]["1"]
        assert model["active"]["backend"] == ("tvm" if faster else "torchscript")
        body = predict(http, name, sample(MODELS[name], 1)).json()
        assert body["variant"]["id"] == model["active"]["variant_id"]


def test_ready_variants_race_and_the_router_reads_the_race(
    http: httpx.Client, uploaded: dict[str, list[dict[str, object]]]
) -> None:
    pytest.importorskip("onnxruntime")
    # `tvm` is an artifact-cache hit (the `uploaded` mlp has these bytes and config) and
    # onnxruntime compiles: the race follows whichever turns ready second.
    backends = ["tvm", "onnxruntime"]
    response = upload(http, MODELS["mlp"], name="mlp-raced", max_batch_size=8, backends=backends)
    assert response.status_code == 202, response.text
    wait_settled(http, "mlp-raced", 1, timeout=300)
    deadline = time.monotonic() + 120
    while True:
        variants = http.get("/v1/models/mlp-raced/versions/1").json()["variants"]
        compiled = [v for v in variants if v["backend"] != "torchscript"]
        if all(v["raced_at"] for v in compiled) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [v["status"] for v in compiled] == ["ready", "ready"], compiled
    assert all(v["raced_at"] for v in compiled), compiled
    tvm, ort = by_backend(compiled, "tvm"), by_backend(compiled, "onnxruntime")
    assert tvm["baseline_latency_ms_by_batch"] == ort["baseline_latency_ms_by_batch"]
    assert by_backend(variants, "torchscript")["latency_ms_by_batch"] == tvm["baseline_latency_ms_by_batch"]
    base = tvm["baseline_latency_ms_by_batch"]["1"]
    ratios = {v["backend"]: v["latency_ms_by_batch"]["1"] / base for v in compiled}
    fastest = min(ratios, key=ratios.__getitem__)
    time.sleep(1.5)  # the runtime's cached route lives KILN_ROUTE_TTL_S (1 s)
    body = predict(http, "mlp-raced", sample(MODELS["mlp"], 1)).json()
    assert body["variant"]["backend"] == (fastest if ratios[fastest] < 1 else "torchscript"), (ratios, body)


def test_identical_reupload_starts_no_compile(
    http: httpx.Client, uploaded: dict[str, list[dict[str, object]]]
) -> None:
    model = MODELS["mlp"]
    again = upload(http, model, max_batch_size=8, backends=["tvm"])
    assert again.status_code == 200, again.text
    body = again.json()
    assert body["deduplicated"] is True
    assert body["version"] == 1
    assert len(http.get("/v1/models/mlp").json()["versions"]) == 1

    # The same bytes under another name: a new version, whose compile is an artifact cache hit.
    copy = upload(http, model, name="mlp-copy", max_batch_size=8, backends=["tvm"])
    assert copy.status_code == 202, copy.text
    variants = wait_settled(http, "mlp-copy", copy.json()["version"], timeout=120)
    tvm = by_backend(variants, "tvm")
    original = by_backend(uploaded["mlp"], "tvm")
    assert tvm["status"] == "ready" and tvm["cache_hit"] is True
    assert tvm["latency_ms_by_batch"] == original["latency_ms_by_batch"]
    job = http.get(f"/v1/jobs/{tvm['job_id']}").json()
    assert job["status"] == "succeeded" and job["cache_hit"] is True and job["attempts"] == 1


def test_new_upload_is_a_new_version(
    http: httpx.Client, uploaded: dict[str, list[dict[str, object]]]
) -> None:
    response = upload(http, MODELS["mlp"], name="mlp-versions", max_batch_size=8, backends=[])
    assert response.status_code == 202
    response = upload(http, MODELS["mlp"], name="mlp-versions", max_batch_size=4, backends=[])
    assert response.status_code == 202
    assert response.json()["version"] == 2
    x = sample(MODELS["mlp"], 2)
    body = predict(http, "mlp-versions", x).json()
    assert body["model_version"] == 2
    assert predict(http, "mlp-versions", x, version=1).json()["model_version"] == 1


def two_versions(http: httpx.Client, name: str, x: np.ndarray) -> None:
    """Versions 1 and 2 of the MLP under `name` (they differ in max_batch_size); 2 serves."""
    for max_batch_size in (8, 4):
        response = upload(http, MODELS["mlp"], name=name, max_batch_size=max_batch_size, backends=[])
        assert response.status_code == 202, response.text
    assert predict(http, name, x).json()["model_version"] == 2


def test_deleting_a_version_rolls_back_to_the_one_before(
    http: httpx.Client, uploaded: dict[str, list[dict[str, object]]]
) -> None:
    name, x = "mlp-rollback", sample(MODELS["mlp"], 2)
    two_versions(http, name, x)
    deleted = http.delete(f"/v1/models/{name}/versions/2")
    assert deleted.status_code == 200 and deleted.json()["version"] == 2
    body = predict(http, name, x).json()
    assert body["model_version"] == 1
    np.testing.assert_allclose(body["outputs"]["output0"], expected(MODELS["mlp"], x), rtol=1e-5, atol=1e-6)
    assert http.get(f"/v1/models/{name}/versions/2").status_code == 404
    assert [v["version"] for v in http.get(f"/v1/models/{name}").json()["versions"]] == [1]
    assert http.delete(f"/v1/models/{name}/versions/2").status_code == 404
    # The last version takes the model with it; numbers are never reused.
    assert http.delete(f"/v1/models/{name}/versions/1").status_code == 200
    assert http.get(f"/v1/models/{name}").status_code == 404
    again = upload(http, MODELS["mlp"], name=name, max_batch_size=8, backends=[])
    assert again.status_code == 202 and again.json()["version"] == 3


def test_a_default_version_rolls_back_and_keeps_the_newer_one(http: httpx.Client) -> None:
    name, x = "mlp-default", sample(MODELS["mlp"], 2)
    two_versions(http, name, x)

    def set_default(version: object) -> httpx.Response:
        return http.put(f"/v1/models/{name}/default-version", json={"version": version})

    pinned = set_default(1)
    assert pinned.status_code == 200, pinned.text
    assert pinned.json()["default_version"] == 1 and pinned.json()["active"]["version"] == 1
    body = predict(http, name, x).json()
    assert body["model_version"] == 1
    np.testing.assert_allclose(body["outputs"]["output0"], expected(MODELS["mlp"], x), rtol=1e-5, atol=1e-6)
    assert predict(http, name, x, version=2).json()["model_version"] == 2  # still served when asked
    v2 = http.get(f"/v2/models/{name}").json()
    assert v2["versions"] == ["1", "2"]
    assert http.get(f"/v2/models/{name}/config").json()["max_batch_size"] == 8  # version 1's, not 2's
    tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    infer = {"inputs": [tensor]}
    assert http.post(f"/v2/models/{name}/infer", json=infer).json()["model_version"] == "1"
    index = [
        (e["version"], e["state"]) for e in http.post("/v2/repository/index").json() if e["name"] == name
    ]
    assert index == [("1", "READY"), ("2", "READY")]  # each serves when asked for by number
    # A third upload does not take over while the default is set.
    assert upload(http, MODELS["mlp"], name=name, max_batch_size=2, backends=[]).status_code == 202
    assert predict(http, name, x).json()["model_version"] == 1

    refused = http.delete(f"/v1/models/{name}/versions/1")
    assert refused.status_code == 409
    assert f"PUT /v1/models/{name}/default-version" in refused.json()["detail"]
    assert predict(http, name, x).json()["model_version"] == 1  # nothing was deleted

    unknown = set_default(7)
    assert unknown.status_code == 404 and "has no version 7" in unknown.json()["detail"]
    assert http.put("/v1/models/nope/default-version", json={"version": 1}).status_code == 404
    for bad in ({}, {"version": 0}, {"version": "latest"}):
        assert http.put(f"/v1/models/{name}/default-version", json=bad).status_code == 422, bad
    assert http.get(f"/v1/models/{name}").json()["default_version"] == 1  # none of those changed it

    cleared = set_default(None)
    assert cleared.status_code == 200 and cleared.json()["default_version"] is None
    assert predict(http, name, x).json()["model_version"] == 3
    assert http.delete(f"/v1/models/{name}/versions/1").status_code == 200
    assert http.delete(f"/v1/models/{name}").status_code == 200


def test_a_model_deleted_mid_compile_leaves_no_artifact(
    http: httpx.Client, server: KilnServer, uploaded: dict[str, list[dict[str, object]]]
) -> None:
    """The compile outlives its model: it stores no artifact that nothing references and no
    deletion would collect, and ends quietly rather than as an error."""
    blobs = Path(server.env["KILN_DATA_DIR"]) / "blobs"
    before = {p for p in blobs.rglob("*") if p.is_file()}
    # max_batch_size 5: a spec no earlier upload compiled, so this is no artifact-cache hit
    response = upload(http, MODELS["mlp"], name="mlp-doomed", max_batch_size=5, backends=["tvm"])
    job_id = by_backend(response.json()["variants"], "tvm")["job_id"]

    stages: list[str] = []

    def started() -> bool:
        stages.append(http.get(f"/v1/jobs/{job_id}").json()["stage"])
        return stages[-1] != "queued"

    wait_until(started, 120, "the compile to start", interval=0.02)
    assert http.delete("/v1/models/mlp-doomed").status_code == 200
    assert stages[-1] in ("compiling", "verifying", "benchmarking"), f"deleted too late: {stages[-1]}"

    def job_lines() -> list[str]:
        return [line["message"] for line in server.json_lines() if job_id in line["message"]]

    # Stopped as its next check finds the model gone, or, finished first, dropping what it made.
    quiet = ("stopped the compile", "dropping the artifact")
    ends = (*quiet, "unexpectedly", "ready")
    wait_until(lambda: any(end in m for m in job_lines() for end in ends), 120, "the job to end")
    assert any(end in m for m in job_lines() for end in quiet), job_lines()
    assert {p for p in blobs.rglob("*") if p.is_file()} == before


def test_failed_conversion_keeps_torchscript_serving(http: httpx.Client, server: KilnServer) -> None:
    response = upload(http, UNCONVERTIBLE, max_batch_size=4, backends=["tvm"])
    assert response.status_code == 202, response.text
    variants = wait_settled(http, UNCONVERTIBLE.name, response.json()["version"])
    tvm = by_backend(variants, "tvm")
    assert tvm["status"] == "failed"
    assert tvm["error"] and tvm["error"].startswith("tvm: ")
    job = http.get(f"/v1/jobs/{tvm['job_id']}").json()
    assert job["status"] == "failed" and job["error"] == tvm["error"]
    x = sample(UNCONVERTIBLE, 2)
    body = predict(http, UNCONVERTIBLE.name, x).json()
    assert body["variant"]["backend"] == "torchscript"
    np.testing.assert_allclose(body["outputs"]["output0"], expected(UNCONVERTIBLE, x), rtol=1e-5, atol=1e-5)


def test_delete_removes_metadata_and_unreferenced_artifacts(
    http: httpx.Client, server: KilnServer, uploaded: dict[str, list[dict[str, object]]]
) -> None:
    data = Path(server.env["KILN_DATA_DIR"])
    artifacts_before = sorted((data / "blobs").rglob("*"))
    response = upload(http, MODELS["cnn"], name="cnn-doomed", max_batch_size=8, backends=["tvm"])
    wait_settled(http, "cnn-doomed", response.json()["version"])
    assert http.delete("/v1/models/cnn-doomed").status_code == 200
    assert http.get("/v1/models/cnn-doomed").status_code == 404
    assert predict(http, "cnn-doomed", sample(MODELS["cnn"], 1)).status_code == 404
    # "cnn" still references the shared model blob and artifact: nothing it needs was removed.
    assert sorted((data / "blobs").rglob("*")) == artifacts_before
    assert predict(http, "cnn", sample(MODELS["cnn"], 1), backend="tvm").status_code == 200
