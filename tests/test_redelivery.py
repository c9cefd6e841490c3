"""Jobs whose message never reached the broker, or left it, are enqueued again, once; a job that
keeps ending without settling its variant fails it after MAX_ATTEMPTS deliveries."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.jobs import MAX_ATTEMPTS, run_compile_job
from service.queue import DramatiqQueue
from service.records import JobStatus, VariantStatus
from service.redelivery import requeue_lost
from service.registry import Registry
from service.settings import Settings
from service.store import StoreUnavailableError
from service.store.local import LocalStore
from service.store.redis import RedisStore
from tests.models import MODELS
from tests.registries import ready_version, reference, rejected_tvm
from tests.servers import free_port

HOST = "cpu-x86_64-test-avx2"
BASELINE = {1: 1.0, 8: 8.0}


def test_lost_jobs_are_enqueued_again_once_and_only_those(redis_url: str) -> None:
    registry = Registry(RedisStore(redis_url))
    version, tvm = rejected_tvm(registry, MODELS["mlp"], HOST, BASELINE, "old-job")
    [(_, new_job), (_, retry_job)] = registry.add_variants(version, [("onnxruntime", {}, HOST)], [tvm])
    # The job the retry replaced, never settled: its variant belongs to another job now.
    registry.store.put_doc("job", "old-job", {**retry_job.model_dump(mode="json"), "id": "old-job"})
    queue = DramatiqQueue(Settings(redis_url=redis_url))
    queue.enqueue(retry_job)  # its API enqueued it; new_job's died first

    assert requeue_lost(registry, queue, older_than_s=60) == []  # its API may still be at it
    assert queue.held([HOST]) == {retry_job.id}
    assert requeue_lost(registry, queue, older_than_s=0) == [new_job.id]
    assert queue.held([HOST]) == {new_job.id, retry_job.id}
    assert requeue_lost(registry, queue, older_than_s=0) == []
    client = queue.broker.client
    assert client.llen(f"{queue.broker.namespace}:compile.{HOST}") == 2  # one message per job
    queue.close()


def test_a_queue_outage_at_enqueue_is_a_503_that_says_the_job_is_kept(redis_url: str) -> None:
    registry = Registry(RedisStore(redis_url))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    [(_, job)] = registry.add_variants(registry.get_version(mlp.name, 1), [("onnxruntime", {}, HOST)], [])
    queue = DramatiqQueue(Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    with pytest.raises(StoreUnavailableError, match="the job is recorded"):
        queue.enqueue(job)


def test_a_job_that_never_settles_fails_its_variant_after_max_attempts(tmp_path: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    [(variant, job)] = registry.add_variants(
        registry.get_version(mlp.name, 1), [("onnxruntime", {}, HOST)], []
    )
    registry.update_job(job.id, status=JobStatus.running, attempts=MAX_ATTEMPTS)
    run_compile_job(registry, Settings(data_dir=tmp_path / "data"), job.id)
    failed = registry.get_variant(variant.id)
    assert failed is not None and failed.status == VariantStatus.failed
    assert failed.error is not None and failed.error.startswith(f"gave up after {MAX_ATTEMPTS} attempts")
    done = registry.get_job(job.id)
    assert (done.status, done.attempts) == (JobStatus.failed, MAX_ATTEMPTS)
