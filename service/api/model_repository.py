"""A Triton model repository deployed as the API starts (KILN_MODEL_REPOSITORY, or `kiln serve
--model-repository`), as `tritonserver --model-repository` serves one, and as KServe's storage
initializer leaves a model repository at /mnt/models for its serving runtime.

Each model directory goes through the loads `kiln import-triton` sends (service/triton_repository.py),
applied in this process (service/api/triton_load.py): a file and configuration already deployed
are found as the version they made, so a restart deploys nothing new and a changed file becomes
a new version, and the model's newest version in the repository serves requests naming none.
With a poll interval (KILN_MODEL_REPOSITORY_POLL_S, tritonserver's --repository-poll-secs) the
model directories that changed since are deployed again, and the models that come of it loaded;
a model directory removed is unloaded, as tritonserver unloads it."""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path

from service.api.deps import Services
from service.api.repository import in_service, out_of_service
from service.api.triton_load import load_request, load_with
from service.errors import BadRequestError, NotFoundError
from service.periodic import Periodic
from service.store import StoreUnavailableError
from service.triton_repository import CONFIG, RepositoryError, model_dirs, version_loads

log = logging.getLogger("kiln.repository")

LOCK = "model-repository"
# How soon a replica killed while it deploys (Redis mode) lets the next one deploy.
LOCK_EXPIRE_S = 30.0


# A model directory as last deployed: each file's path, size and modification time.
Fingerprint = frozenset[tuple[str, int, int]]


class Repository:
    """A model repository this process deploys, and what it deployed of each model directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Read and written under the store's lock: each model directory as last deployed (or
        # tried), and the models deployed from it, which its removal unloads.
        self._deployed: dict[str, Fingerprint] = {}
        self._served: set[str] = set()
        # Model directories whose last deploy left their model out, and why: the index lists
        # them UNAVAILABLE with it, as Triton's does.
        self.failures: dict[str, str] = {}

    def deploy(self, svc: Services, stopping: threading.Event, changed: bool = False) -> list[str]:
        """Blocking: every model directory's versions (only the directories that `changed`
        since this process deployed them, and those it deployed that are gone unloaded), oldest
        first, each failure logged, until `stopping` is set; the names of the models that serve.
        One process at a time: replicas (or `--workers`) that start together would each record a
        new version of the same files, where the later ones now find it. A directory that failed
        is not tried again until it changes."""
        if not self.path.is_dir():
            if not changed:
                log.error("the model repository %s is not a directory: nothing deployed", self.path)
            return []
        dirs, others = model_dirs(self.path)
        for other in [] if changed else others:
            log.warning("%s holds no config.pbtxt: not a model, skipped", other)
        if changed and not self._changed(dirs):
            return []  # the lock, which every replica polls for, is not taken for nothing
        served = []
        with svc.registry.store.lock(LOCK, LOCK_EXPIRE_S):
            for name in sorted(self._deployed.keys() - {d.name for d in dirs}):
                if stopping.is_set():
                    break
                if (self.path / name / CONFIG).is_file():
                    continue  # back while this waited for the lock: left serving
                if name in self._served:
                    removed(svc, name)
                    self._served.discard(name)
                del self._deployed[name]
                self.failures.pop(name, None)
            for model_dir in dirs:
                if changed and self._deployed.get(model_dir.name) == fingerprint(model_dir):
                    continue
                if self._deploy(svc, model_dir, stopping) is None:
                    served.append(model_dir.name)
        return served

    def reload(self, svc: Services, name: str) -> bool:
        """Blocking: Triton's load of a model of the repository (the directory read again, new
        versions and configuration deployed), False where `name` is none of its models; a
        BadRequestError that says why where the model does not serve."""
        try:
            found = self.path.is_dir() and name in {d.name for d in model_dirs(self.path)[0]}
        except OSError:  # the repository cannot be read: its models are not there to load
            found = False
        if not found:
            self.failures.pop(name, None)  # its directory is gone
            return False
        with svc.registry.store.lock(LOCK, LOCK_EXPIRE_S):
            why = self._deploy(svc, self.path / name, threading.Event())
        if why is not None:
            raise BadRequestError(f"model {name!r} did not load from {self.path / name}: {why}")
        return True

    def _deploy(self, svc: Services, model_dir: Path, stopping: threading.Event) -> str | None:
        """Under the store's lock: deploy_model, and what came of it recorded."""
        now = fingerprint(model_dir)
        why = deploy_model(svc, model_dir, stopping)
        name = model_dir.name
        if why is None:
            self.failures.pop(name, None)
        else:
            self.failures[name] = why
        # Served from this repository, or by an earlier deploy of it where this one failed:
        # either way, the directory's removal unloads it (not a model of the same name uploaded
        # through the API alone).
        if svc.registry.deployed_from_repository(name):
            self._served.add(name)
        if not stopping.is_set():
            self._deployed[name] = now
        return why

    def _changed(self, dirs: list[Path]) -> bool:
        """Read outside the lock, so possibly while a deploy writes it: a directory seen as
        changed is looked at again under the lock."""
        gone = self._deployed.keys() - {d.name for d in dirs}
        return bool(gone) or any(self._deployed.get(d.name) != fingerprint(d) for d in dirs)


class RepositoryPoller(Periodic):
    """Deploys the model directories that changed, every `interval_s` once the startup deploy
    is done, and loads their models."""

    def __init__(self, repository: Repository, svc: Services, interval_s: float) -> None:
        super().__init__("kiln-repository-poll", interval_s)
        self.repository = repository
        self.svc = svc

    def run_once(self) -> None:
        if not self.svc.preload.finished:  # it deploys everything, then loads it
            return
        try:
            names = self.repository.deploy(self.svc, self._stop, changed=True)
        except StoreUnavailableError as exc:  # the next poll tries again
            log.warning("the model repository was not polled: %s", exc)
            return
        except Exception:  # the poll goes on: one bad turn must not end it
            log.exception("polling the model repository failed")
            return
        for name in names:
            if self._stop.is_set() or self.svc.runtime.over_budget():
                break  # the rest load at their first request
            self.svc.preload.warm(name)  # why one does not load is logged


def fingerprint(model_dir: Path) -> Fingerprint:
    """The files version_loads may read: those in the model's directory and in the directories
    in it, links followed as it follows them, and no deeper, as it names files by plain names.
    A walk of the whole tree followed a version directory's links to itself (`1/a -> .`,
    `1/b -> .`) down 2^40 paths, and held the deploy."""
    found = set()
    for folder in (model_dir, *_entries(model_dir, dirs=True)):
        for path in _entries(folder, dirs=False):
            with contextlib.suppress(OSError):  # gone meanwhile: the next poll sees it
                stat = path.stat()
                found.add((str(path.relative_to(model_dir)), stat.st_size, stat.st_mtime_ns))
    return frozenset(found)


def _entries(folder: Path, dirs: bool) -> list[Path]:
    """The folder's directories but hidden ones, or its files; none where it cannot be read."""
    try:
        return [p for p in folder.iterdir() if p.is_dir() == dirs and not (dirs and p.name.startswith("."))]
    except OSError:
        return []


def deploy_model(svc: Services, model_dir: Path, stopping: threading.Event) -> str | None:
    """Why the model does not serve, or None where it does: its versions loaded, oldest first,
    up to one that failed (the newer ones are left out, so that none serves in its place), and
    in service again if it was unloaded, as a restarted tritonserver serves its repository."""
    try:
        loads = version_loads(model_dir)
    # OSError: a file pathlib could not look at (EACCES); UnicodeError: a name not in UTF-8.
    except (RepositoryError, OSError, UnicodeError) as exc:
        log.error("model %r is not deployed: %s", model_dir.name, exc)
        return str(exc)
    name, loaded, why = loads[0].model, [], "deploying it was cut short"  # Triton's version numbers
    try:
        since = svc.registry.last_unload(name)
        existed, inherited, before = hold(svc, name)
        number, recorded = 0, []  # Kiln's numbers: of the last one loaded, of those new

        for i, load in enumerate(loads):
            if stopping.is_set():
                break
            try:
                number = load_with(svc, name, load_request({"config": load.config}, load.contents()))
            except StoreUnavailableError:
                raise  # the whole deploy is tried again once the store answers
            except Exception as exc:  # one model's error must not keep the others from serving
                why = f"version {load.version} did not load: {exc}"
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
            if number > before:
                recorded.append(number)
        if existed or loaded:
            newest = number if len(loaded) == len(loads) else None
            # Older versions of the repository's recorded anew, past its newest (a version policy
            # that now loads them): versions that an upload through the API made do not count.
            anew = newest is not None and any(n > newest for n in recorded)
            settle(svc, name, newest, inherited, anew)
        if not loaded:
            return why
        if not in_service(svc, name, since):
            return "it was unloaded while it loaded"
    except NotFoundError as exc:  # deleted through the API meanwhile
        log.warning("model %r was not deployed: %s", name, exc)
        return str(exc)
    log.info("model %r deployed from %s: versions %s", name, model_dir, loaded)
    return None


def hold(svc: Services, name: str) -> tuple[bool, bool, int]:
    """Whether Kiln holds the model, a hold an earlier deploy left, and its newest version's
    number (0 for none). While its deploy goes on,
    the version that serves requests naming none is held as its default version, so that an
    older version recorded anew, under a newer number, does not serve meanwhile. The hold is
    recorded: a deploy that failed, or was cut short (a store outage, a crash), leaves it for
    the next to release."""
    try:
        view = svc.registry.get_model(name)
    except NotFoundError:
        return False, False, 0
    latest = view.versions[-1][0].version
    if view.default_version is None:
        svc.registry.set_repository_state(name, latest, held=True)
    return True, view.repository_hold, latest


def settle(svc: Services, name: str, newest: int | None, inherited: bool, anew: bool) -> None:
    """Which version serves requests naming none once the deploy is done. Where the repository's
    newest version (`newest`, Kiln's number; None when a version failed) changed since it last
    deployed, that one, as in Triton, though Kiln holds newer ones (their directories removed:
    a rollback). Otherwise a default version set through the API stays, and the hold is
    released: as a default version where this deploy recorded older repository versions anew,
    under newer numbers (`anew`: a version policy that now loads them), or where a hold an
    earlier deploy left (`inherited`) has versions newer than it, which that deploy left behind
    (a changed setting, reverted since); else none, and the newest serves (an upload through the
    API too). After a failure the hold stays while versions recorded meanwhile would serve in
    place of the one that served, as a Triton model whose reload failed."""
    view = svc.registry.get_model(name)
    latest = view.versions[-1][0].version
    if newest is not None and newest != view.repository_version:
        if view.repository_version is None and view.default_version is not None and not view.repository_hold:
            # First deployed from a repository (or by a Kiln before this), with a default version
            # set through the API: that stays until the repository changes.
            svc.registry.set_repository_state(name, view.default_version, False, newest)
            return
        svc.registry.set_repository_state(name, None if newest == latest else newest, False, newest)
        log.info("model %r: version %d serves requests naming none", name, newest)
    elif view.repository_hold and (newest is not None or view.default_version == latest):
        keep = view.default_version if inherited and view.default_version != latest else None
        svc.registry.set_repository_state(name, newest if anew else keep, held=False)


def removed(svc: Services, name: str) -> None:
    """A model directory deployed here is gone from the repository: the model is unloaded."""
    try:
        out_of_service(svc, name)
    except NotFoundError:  # it never deployed, or was deleted since
        return
    log.info("model %r is no longer in the model repository: unloaded", name)
