"""Redis mode: two API processes and a worker share one Redis; a SIGKILLed worker's job comes back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.client import Samples, by_backend, expected, predict, sample, scrape, upload, value, wait_settled
from tests.models import MODELS
from tests.servers import KilnProcess, KilnServer, RedisServer, wait_until

pytestmark = pytest.mark.timeout(1800)

# Short, so a dead worker's job is redelivered within seconds of a new worker starting.
HEARTBEAT_S = "3"
# As short: a job whose message was lost is enqueued again seconds after it was recorded.
REQUEUE_S = "2"


class Cluster:
    def __init__(self, redis_url: str, root: Path) -> None:
        self.env = {
            "KILN_REDIS_URL": redis_url,
            "KILN_QUEUE_HEARTBEAT_TIMEOUT_S": HEARTBEAT_S,
            "KILN_QUEUE_REQUEUE_S": REQUEUE_S,
            "KILN_THREADS": "1",
            "KILN_COMPILE_WORKERS": "2",
            # Short, so an API lets go of a version deleted through the other within a second.
            "KILN_DELETION_SWEEP_S": "0.5",
        }
        self.root = root
        self.api1 = KilnServer(self.env, root / "api1.log")
        self.api2 = KilnServer(self.env, root / "api2.log")
        self.worker = self.new_worker()

    def new_worker(self) -> KilnProcess:
        return KilnProcess(["worker"], self.env, self.root / "worker.log")


@pytest.fixture(scope="module")
def cluster(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    c = Cluster(redis_server.url, tmp_path_factory.mktemp("cluster"))
    for proc in (c.api1, c.api2, c.worker):
        proc.start()
    yield c
    for proc in (c.worker, c.api2, c.api1):
        proc.stop()


@pytest.fixture(scope="module")
def api1(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.api1.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def api2(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.api2.url, timeout=120) as client:
        yield client


def test_upload_on_one_api_predict_on_another(
    api1: httpx.Client, api2: httpx.Client, cluster: Cluster
) -> None:
    versions = {}
    for name, model in MODELS.items():
        response = upload(api1, model, max_batch_size=8, backends=["tvm"])
        assert response.status_code == 202, response.text
        versions[name] = response.json()["version"]
    for name, model in MODELS.items():
        try:
            variants = wait_settled(api2, name, versions[name], timeout=900)
        except TimeoutError:
            print(cluster.worker.tail(60))
            raise
        tvm = by_backend(variants, "tvm")
        assert tvm["status"] == "ready", tvm["error"]
        for batch in (1, 7):
            x = sample(model, batch)
            response = predict(api2, name, x, backend="tvm")
            assert response.status_code == 200, response.text
            assert response.json()["variant"]["id"] == tvm["id"]
            out = np.asarray(response.json()["outputs"]["output0"], dtype=np.float32)
            np.testing.assert_allclose(out, expected(model, x), rtol=1e-4, atol=1e-5)
    # API 1 answers too, from the same store.
    assert predict(api1, "mlp", sample(MODELS["mlp"], 1)).status_code == 200


def test_identical_reupload_is_deduplicated_across_apis(api1: httpx.Client, api2: httpx.Client) -> None:
    response = upload(api2, MODELS["mlp"], max_batch_size=8, backends=["tvm"])
    assert response.status_code == 200, response.text
    assert response.json()["deduplicated"] is True
    copy = upload(api2, MODELS["mlp"], name="mlp-again", max_batch_size=8, backends=["tvm"])
    tvm = by_backend(wait_settled(api1, "mlp-again", copy.json()["version"], timeout=120), "tvm")
    assert tvm["status"] == "ready" and tvm["cache_hit"] is True


def compiling_encoder(api1: httpx.Client, name: str, max_batch_size: int) -> tuple[int, str]:
    """The encoder uploaded under `name` with a config no earlier test used (so the artifact
    cache cannot answer it), once its TVM compile has started: its version and job id."""
    response = upload(api1, MODELS["encoder"], name=name, max_batch_size=max_batch_size, backends=["tvm"])
    assert response.status_code == 202, response.text
    job_id = by_backend(response.json()["variants"], "tvm")["job_id"]

    def compiling() -> bool:
        job = api1.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] != "succeeded", "the compile finished before the worker could be stopped"
        return bool(job["stage"] == "compiling")

    wait_until(compiling, 120, "the compile to start", interval=0.05)
    return response.json()["version"], job_id


def compiled_by_a_new_worker(
    api1: httpx.Client, cluster: Cluster, name: str, version: int, job_id: str
) -> dict[str, Any]:
    """The job, once a new worker has compiled its variant."""
    cluster.worker = cluster.new_worker()
    cluster.worker.start()
    tvm = by_backend(wait_settled(api1, name, version, timeout=600), "tvm")
    assert tvm["status"] == "ready", tvm["error"]
    job: dict[str, Any] = api1.get(f"/v1/jobs/{job_id}").json()
    return job


def test_sigkilled_worker_job_is_redelivered(api1: httpx.Client, cluster: Cluster) -> None:
    version, job_id = compiling_encoder(api1, "encoder-kill", 6)
    cluster.worker.kill()
    time.sleep(1)
    job = api1.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "running" and job["attempts"] == 1

    job = compiled_by_a_new_worker(api1, cluster, "encoder-kill", version, job_id)
    assert job["status"] == "succeeded" and job["attempts"] == 2


def test_a_stopped_worker_gives_its_compile_back_at_once(api1: httpx.Client, cluster: Cluster) -> None:
    """SIGTERM, as a rollout stops a pod: the worker ran the compile to its end, past the pod's
    grace period, to be SIGKILLed, and the job came back a heartbeat later, counted an attempt."""
    version, job_id = compiling_encoder(api1, "encoder-stop", 5)
    began = time.monotonic()
    cluster.worker.stop()
    assert time.monotonic() - began < 10, cluster.worker.tail()
    job = api1.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] != "succeeded" and job["attempts"] == 0, job  # a restart is no attempt

    job = compiled_by_a_new_worker(api1, cluster, "encoder-stop", version, job_id)
    assert job["status"] == "succeeded" and job["attempts"] == 1, job


def test_a_worker_holds_no_more_jobs_than_it_compiles_at_once(api1: httpx.Client, cluster: Cluster) -> None:
    """Dramatiq takes twice its threads' messages by default: a worker busy with an hour of
    tuning held the next job that long while other workers sat idle."""
    import redis

    client = redis.Redis.from_url(cluster.env["KILN_REDIS_URL"])
    backends = ["tvm", "onnxruntime", "openvino"]  # three jobs at once for KILN_COMPILE_WORKERS=2
    response = upload(api1, MODELS["mlp"], name="mlp-prefetch", max_batch_size=5, backends=backends)
    assert response.status_code == 202, response.text
    held = []
    while any(
        v["status"] not in {"ready", "failed", "rejected"}
        for v in api1.get("/v1/models/mlp-prefetch/versions/1").json()["variants"]
    ):
        acks = [k for k in client.scan_iter("kiln-queue:__acks__.*") if not k.endswith(b".DQ")]
        held.append(sum(client.scard(k) for k in acks))
        time.sleep(0.02)
    assert 0 < max(held) <= 2, held  # those compiling, and no third held back from another worker
    assert all(v["status"] == "ready" for v in wait_settled(api1, "mlp-prefetch", 1))


def test_a_job_whose_message_was_lost_is_enqueued_again(api1: httpx.Client, cluster: Cluster) -> None:
    """The API recorded the job, and its message never reached a worker: the API died, or Redis
    went away, between the two. A worker's redelivery pass finds it and enqueues it again."""
    import redis

    cluster.worker.stop()
    response = upload(api1, MODELS["mlp"], name="mlp-lost", max_batch_size=4, backends=["onnxruntime"])
    assert response.status_code == 202, response.text
    ort = by_backend(response.json()["variants"], "onnxruntime")
    queue = f"kiln-queue:compile.{ort['target']}"
    client = redis.Redis.from_url(cluster.env["KILN_REDIS_URL"])
    assert client.delete(queue, f"{queue}.msgs") == 2  # the message, gone

    cluster.worker = cluster.new_worker()
    cluster.worker.start()
    variants = wait_settled(api1, "mlp-lost", response.json()["version"], timeout=300)
    assert by_backend(variants, "onnxruntime")["status"] == "ready", by_backend(variants, "onnxruntime")
    job = api1.get(f"/v1/jobs/{ort['job_id']}").json()
    assert job["status"] == "succeeded" and job["attempts"] == 2  # enqueued again, then run
    assert "has no message in the queue: enqueueing it again" in cluster.worker.log.read_text()


def test_log_settings_reach_every_api_and_worker(
    api1: httpx.Client, api2: httpx.Client, cluster: Cluster
) -> None:
    """Triton's logging extension, changed through one API, applies in the other and in the
    worker, each reading it from Redis."""

    def announced(proc: KilnProcess) -> bool:
        return any(
            line["message"].startswith("log settings now") and "'log_verbose_level': 1," in line["message"]
            for line in proc.json_lines()
        )

    response = api1.post("/v2/logging", json={"log_verbose_level": 1})
    assert response.status_code == 200 and response.json()["log_verbose_level"] == 1, response.text
    try:
        for proc in (cluster.api1, cluster.api2, cluster.worker):
            wait_until(lambda p=proc: announced(p), 10, f"{proc.log.name} to apply the change")
        assert api2.get("/v2/logging").json()["log_verbose_level"] == 1
    finally:
        api1.post("/v2/logging", json={"log_verbose_level": 0})


def series_of(http: httpx.Client, model: str) -> dict[str, set[str | None]]:
    """The versions of `model` each Kiln series names (None: a series of the model alone)."""
    samples: Samples = scrape(http)
    found: dict[str, set[str | None]] = {}
    for name, rows in samples.items():
        for labels, _ in rows:
            if labels.get("model") == model:
                found.setdefault(name, set()).add(labels.get("version"))
    return found


def stats_versions(http: httpx.Client, model: str) -> set[str]:
    stats = http.get("/v2/models/stats").json()["model_stats"]
    return {s["version"] for s in stats if s["name"] == model}


def test_a_deleted_version_leaves_the_statistics_series_and_runners_of_every_api(
    api1: httpx.Client, api2: httpx.Client
) -> None:
    """As Triton's go with a model it unloads: at once on the API that deleted, and within
    KILN_DELETION_SWEEP_S on the other, which served it too; then a deleted model's per-model
    series, also on an API that had served only its version deleted before."""
    name, x = "mlp-deleted", sample(MODELS["mlp"], 1)
    # Another compiled setting is another version; the first keeps its answers in memory.
    assert upload(api1, MODELS["mlp"], name=name, max_batch_size=8, response_cache=True, backends=[])
    assert upload(api1, MODELS["mlp"], name=name, max_batch_size=4, backends=[]).json()["version"] == 2
    for api, versions in ((api1, (1, 2)), (api2, (1,))):
        for version in versions:
            for _ in range(2):  # v1's second is a cache hit
                assert predict(api, name, x, version=version).status_code == 200
        # Statistics list every version ready, at 0 where it served nothing; series only those served.
        assert stats_versions(api, name) == {"1", "2"}
        found = series_of(api, name)
        assert found["nv_inference_request_success"] == {str(v) for v in versions}
        assert found["nv_cache_num_hits_per_model"] == {str(v) for v in versions}
        assert found["kiln_request_duration_seconds_count"] == {str(v) for v in versions}
        assert found["kiln_batch_size_count"] == found["kiln_response_cache_lookups_total"] == {None}
    loaded = value(scrape(api2), "kiln_loaded_runners")

    assert api1.delete(f"/v1/models/{name}/versions/1").status_code == 200
    # The deleting API at once; the other at its next sweep. Version 2 and the model stay.
    assert stats_versions(api1, name) == {"2"}
    wait_until(
        lambda: series_of(api2, name).get("nv_inference_request_success") is None, 10, "v1's series gone"
    )
    assert stats_versions(api2, name) == {"2"}
    for api, left in ((api1, {"2"}), (api2, set())):
        found = series_of(api, name)
        assert set.union(*found.values()) == {*left, None}, found
        assert found["kiln_batch_size_count"] == {None}
    wait_until(
        lambda: value(scrape(api2), "kiln_loaded_runners") == loaded - 1, 10, "v1's runner freed there"
    )
    assert predict(api2, name, x, version=1).status_code == 404

    assert api1.delete(f"/v1/models/{name}").status_code == 200
    for api in (api1, api2):
        wait_until(lambda api=api: series_of(api, name) == {}, 10, "the model's series gone")
        assert stats_versions(api, name) == set()
    # Uploaded again, it takes the next number (never reused) and its series start over.
    assert upload(api1, MODELS["mlp"], name=name, max_batch_size=8, backends=[]).json()["version"] == 3
    assert predict(api2, name, x).status_code == 200
    assert series_of(api2, name)["nv_inference_request_success"] == {"3"}
    assert value(scrape(api2), "kiln_batch_size_count", model=name) == 1
