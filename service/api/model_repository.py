"""A Triton model repository deployed as the API starts (KILN_MODEL_REPOSITORY, or `kiln serve
--model-repository`), as `tritonserver --model-repository` serves one, and as KServe's storage
initializer leaves a model repository at /mnt/models for its serving runtime.

Each model directory goes through the loads `kiln import-triton` sends (service/triton_repository.py),
applied in this process (service/api/triton_load.py): a file and configuration already deployed
are found as the version they made, so a restart deploys nothing new and a changed file becomes
a new version."""

from __future__ import annotations

import logging
from pathlib import Path

from service.api.deps import Services
from service.api.triton_load import load_request, load_with
from service.store import StoreUnavailableError
from service.triton_repository import RepositoryError, model_dirs, version_loads

log = logging.getLogger("kiln.repository")

LOCK = "model-repository"
# A Redis-mode deploy past this long loses its lock to the next replica waiting for it.
LOCK_EXPIRE_S = 3600.0


def deploy(svc: Services, repository: Path) -> list[str]:
    """Blocking: every model directory's versions, oldest first, each failure logged; the names
    of the models that serve. One process at a time: replicas (or `--workers`) that start
    together would each record a new version of the same files, where the later ones now find it."""
    if not repository.is_dir():
        log.error("the model repository %s is not a directory: nothing deployed", repository)
        return []
    dirs, others = model_dirs(repository)
    for other in others:
        log.warning("%s holds no config.pbtxt: not a model, skipped", other)
    with svc.registry.store.lock(LOCK, LOCK_EXPIRE_S):
        return [model_dir.name for model_dir in dirs if deploy_model(svc, model_dir)]


def deploy_model(svc: Services, model_dir: Path) -> bool:
    """Whether the model serves: its versions loaded, oldest first, up to one that failed (the
    newer ones are left out, so that none serves in its place)."""
    try:
        loads = version_loads(model_dir)
    except RepositoryError as exc:
        log.error("model %r is not deployed: %s", model_dir.name, exc)
        return False
    for i, load in enumerate(loads):
        try:
            load_with(svc, load.model, load_request({"config": load.config}, load.contents()))
        except StoreUnavailableError:
            raise  # the whole deploy is tried again once the store answers
        except Exception as exc:  # one model's error must not keep the others from serving
            later = [str(v.version) for v in loads[i + 1 :]]
            log.error(
                "model %r version %d (%s) did not load: %s%s",
                load.model,
                load.version,
                model_dir / str(load.version),
                exc,
                f"; versions {', '.join(later)} were left out" if later else "",
            )
            return i > 0
    log.info("model %r deployed from %s: versions %s", loads[0].model, model_dir, [v.version for v in loads])
    return True
