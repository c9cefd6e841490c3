"""What a process lets go of when models and versions are deleted, in the process that deleted
them and, by a periodic sweep, in every other; the sweep also finishes the deletions that were
cut short."""

from __future__ import annotations

import logging

from service.periodic import Periodic
from service.registry import CLAIM_S
from service.runtime import Runtime
from service.store import StoreUnavailableError

log = logging.getLogger("kiln.deletions")


def forget_deleted(runtime: Runtime, name: str) -> None:
    """Blocking (store I/O): free this process's runners, batchers and routes of the model's
    versions that the store no longer has, and drop their statistics and series (Stats.forget)."""
    held = runtime.stats.versions(name)  # before the read: see Stats.forget
    stored = runtime.registry.version_numbers(name)
    runtime.stats.forget(name, held, stored)  # first: from now no load of theirs is kept
    for number in held - stored:
        runtime.unload(name, number)


class DeletionSweep(Periodic):
    """Every `interval_s`, finishes the deletions that were cut short (Registry.finish_deletions),
    and forgets the deleted versions of the models this process has series of. The process that
    deleted them forgot them at once; the others would keep their runners until evicted, and
    their statistics and series (Triton's and `kiln_*`) until they restart."""

    def __init__(self, runtime: Runtime, interval_s: float) -> None:
        super().__init__("kiln-deletion-sweep", interval_s)
        self.runtime = runtime

    def run_once(self) -> None:
        try:
            for name in self.runtime.registry.finish_deletions(CLAIM_S):
                log.warning("finished a deletion of versions of %s that was cut short", name)
        except StoreUnavailableError as exc:  # the next pass looks again
            log.debug("unfinished deletions not looked for: %s", exc)
        for name in sorted(self.runtime.stats.models()):
            try:
                forget_deleted(self.runtime, name)
            except StoreUnavailableError as exc:  # the next pass looks again
                log.debug("deleted versions not looked for: %s", exc)
                return
            except Exception:  # a bug: logged, and the others are still looked at
                log.exception("looking for deleted versions of %s failed", name)
