"""A Triton model repository deployed as the API starts (KILN_MODEL_REPOSITORY, or `kiln serve
--model-repository`), as `tritonserver --model-repository` serves one, and as KServe's storage
initializer leaves a model repository at /mnt/models for its serving runtime.

Each model directory goes through the loads `kiln import-triton` sends (service/triton_repository.py),
applied in this process (service/api/triton_load.py): a file and configuration already deployed
are found as the version they made, so a restart deploys nothing new and a changed file becomes
a new version."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from service.api.deps import Services
from service.api.triton_load import load_request, load_with
from service.store import StoreUnavailableError
from service.triton_repository import RepositoryError, model_dirs, version_loads

log = logging.getLogger("kiln.repository")

LOCK = "model-repository"
# How soon a replica killed while it deploys (Redis mode) lets the next one deploy.
LOCK_EXPIRE_S = 30.0


def deploy(svc: Services, repository: Path, stopping: threading.Event) -> list[str]:
    """Blocking: every model directory's versions, oldest first, each failure logged, until
    `stopping` is set; the names of the models that serve. One process at a time: replicas (or
    `--workers`) that start together would each record a new version of the same files, where
    the later ones now find it."""
    if not repository.is_dir():
        log.error("the model repository %s is not a directory: nothing deployed", repository)
        return []
    dirs, others = model_dirs(repository)
    for other in others:
        log.warning("%s holds no config.pbtxt: not a model, skipped", other)
    with svc.registry.store.lock(LOCK, LOCK_EXPIRE_S):
        return [model_dir.name for model_dir in dirs if deploy_model(svc, model_dir, stopping)]


def deploy_model(svc: Services, model_dir: Path, stopping: threading.Event) -> bool:
    """Whether the model serves: its versions loaded, oldest first, up to one that failed (the
    newer ones are left out, so that none serves in its place), and in service again if it was
    unloaded, as a restarted tritonserver serves its repository."""
    try:
        loads = version_loads(model_dir)
    except RepositoryError as exc:
        log.error("model %r is not deployed: %s", model_dir.name, exc)
        return False
    name, loaded = loads[0].model, []
    for i, load in enumerate(loads):
        if stopping.is_set():
            break
        try:
            load_with(svc, name, load_request({"config": load.config}, load.contents()))
        except StoreUnavailableError:
            raise  # the whole deploy is tried again once the store answers
        except Exception as exc:  # one model's error must not keep the others from serving
            later = [str(v.version) for v in loads[i + 1 :]]
            log.error(
                "model %r version %d (%s) did not load: %s%s",
                name,
                load.version,
                model_dir / str(load.version),
                exc,
                f"; versions {', '.join(later)} were left out" if later else "",
            )
            break
        loaded.append(load.version)
    if not loaded:
        return False
    svc.registry.set_unloaded(name, False)
    svc.runtime.reroute(name)
    log.info("model %r deployed from %s: versions %s", name, model_dir, loaded)
    return True
