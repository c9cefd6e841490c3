"""MetaSchedule tuning in the product: a tuned `tvm` variant, its progress in the job, and
tuning records shared through Redis across models and restarts (AOF on)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.client import expected, predict, sample, upload, wait_settled
from tests.models import TUNABLE, TestModel
from tests.servers import KilnProcess, KilnServer, RedisServer

pytestmark = pytest.mark.timeout(1800)

TRIALS = 16
# Tuned builds are static: one function for batch 1 and one for 4; batch 3 pads up to 4.
MAX_BATCH = 4


class Deployment:
    """One API and one worker on a Redis of its own, so the test may restart all three."""

    def __init__(self, root: Path) -> None:
        self.redis = RedisServer(root)
        env = {"KILN_REDIS_URL": self.redis.url, "KILN_THREADS": "1"}
        self.api = KilnServer(env, root / "api.log")
        self.worker = KilnProcess(["worker"], env, root / "worker.log")

    def start(self) -> None:
        for proc in (self.redis, self.api, self.worker):
            proc.start()

    def stop(self) -> None:
        for proc in (self.worker, self.api, self.redis):
            proc.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = Deployment(tmp_path_factory.mktemp("tuning"))
    d.start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def first(deployment: Deployment) -> dict[str, Any]:
    """Upload the first model with tuning and follow its tuned job to the end."""
    with httpx.Client(base_url=deployment.api.url, timeout=60) as http:
        return tune(http, TUNABLE[0])


def tune(http: httpx.Client, model: TestModel) -> dict[str, Any]:
    """Upload with tuning; return the tuned variant, its final job, and the job states seen on the way."""
    response = upload(http, model, tuning_trials=TRIALS, max_batch_size=MAX_BATCH)
    assert response.status_code == 202, response.text
    variants = response.json()["variants"]
    tuned = next(v for v in variants if v["options"] == {"tuning_trials": TRIALS})
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{tuned['job_id']}").json()
        seen.append(job)
        if job["status"] in {"succeeded", "failed"}:
            break
        time.sleep(0.2)
    settled = wait_settled(http, model.name, 1, timeout=60)
    return {"variant": next(v for v in settled if v["id"] == tuned["id"]), "job": seen[-1], "seen": seen}


def test_tuned_variant_is_verified_ready_and_shows_progress(
    deployment: Deployment, first: dict[str, Any]
) -> None:
    variant, job = first["variant"], first["job"]
    assert variant["status"] == "ready", variant["error"]
    assert variant["backend"] == "tvm" and variant["max_abs_error"] < 1e-4
    assert variant["latency_ms_by_batch"], "the worker times every ready variant"
    tuning = job["tuning"]
    assert tuning["trials_done"] >= TRIALS and tuning["trials_done"] == tuning["trials_total"]
    assert tuning["tasks"] and all(t["new_trials"] > 0 and not t["reused"] for t in tuning["tasks"])
    # Every kernel's schedule was checked against its untuned build, and none was wrong here.
    assert all(t["wrong_schedules"] == 0 for t in tuning["tasks"])
    partial = [j["tuning"] for j in first["seen"] if j["status"] == "running" and j["tuning"]]
    assert any(t["trials_done"] < t["trials_total"] for t in partial), "no progress was seen mid-tuning"

    # Verification ran the packed artifact at batch 1, an odd batch (padded) and the max.
    model = TUNABLE[0]
    with httpx.Client(base_url=deployment.api.url, timeout=60) as http:
        for batch in (1, 3, MAX_BATCH):
            x = sample(model, batch)
            response = predict(http, model.name, x)
            assert response.status_code == 200, response.text
            out = response.json()["outputs"]["output0"]
            np.testing.assert_allclose(out, expected(model, x), rtol=1e-4, atol=1e-5)


def shared_tasks(first: dict[str, Any], job: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks of `job` whose workload is one of the first model's kernels: the shared
    layer, once per compiled batch size."""
    hashes = {t["workload_hash"] for t in first["job"]["tuning"]["tasks"]}
    shared = [t for t in job["tuning"]["tasks"] if t["workload_hash"] in hashes]
    assert len(shared) == 2, job["tuning"]
    return shared


def test_second_model_reuses_the_shared_layer(deployment: Deployment, first: dict[str, Any]) -> None:
    with httpx.Client(base_url=deployment.api.url, timeout=60) as http:
        second = tune(http, TUNABLE[1])
    assert second["variant"]["status"] == "ready", second["variant"]["error"]
    shared = shared_tasks(first, second["job"])
    assert all(t["reused"] and t["new_trials"] == 0 for t in shared)
    others = [t for t in second["job"]["tuning"]["tasks"] if t not in shared]
    assert others and all(t["new_trials"] > 0 for t in others), "the new head was tuned"


def test_records_survive_a_restart_of_redis_and_the_server(
    deployment: Deployment, first: dict[str, Any]
) -> None:
    deployment.stop()
    deployment.start()
    with httpx.Client(base_url=deployment.api.url, timeout=60) as http:
        third = tune(http, TUNABLE[2])
    assert third["variant"]["status"] == "ready", third["variant"]["error"]
    assert all(t["reused"] and t["new_trials"] == 0 for t in shared_tasks(first, third["job"]))
