"""Scratch space on the temporary disk, each piece locked by the process that owns it, so that
one a dead process left behind (SIGKILL; or SIGTERM, which uvicorn ends the process with once its
lifespan is over, before any `finally` of a request or a compile still running) can be told apart
from one in use, by any process on any host sharing the disk, and removed."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

log = logging.getLogger("kiln.scratch")

CHILD_PREFIX = "kiln-child-"  # a compile's or an upload check's $TMPDIR
UPLOAD_PREFIX = "kiln-upload-"  # an upload's bytes while its model is checked
_OWNER = ".owner"  # in a scratch directory: the file its owner holds locked
_SCRATCH = re.compile(f"^({re.escape(CHILD_PREFIX)}|{re.escape(UPLOAD_PREFIX)})")
# A piece younger than this is left alone: its owner may not have locked it yet.
_YOUNG_S = 10.0


@contextlib.contextmanager
def scratch_dir() -> Iterator[str]:
    """A directory of this process's, removed after use; or by `sweep` once the process died."""
    with (
        tempfile.TemporaryDirectory(prefix=CHILD_PREFIX, ignore_cleanup_errors=True) as tmp,
        open(os.path.join(tmp, _OWNER), "wb") as owner,
    ):
        fcntl.flock(owner, fcntl.LOCK_SH)
        yield tmp


@contextlib.contextmanager
def scratch_file() -> Iterator[IO[bytes]]:
    """A named file of this process's, removed after use; or by `sweep` once the process died."""
    with tempfile.NamedTemporaryFile(prefix=UPLOAD_PREFIX) as tmp:
        fcntl.flock(tmp, fcntl.LOCK_SH)
        yield tmp


def sweep() -> int:
    """Remove the scratch pieces whose owner is dead; how many. The kernel drops a lock with its
    process however it ends, so a lock taken here means no process holds the piece."""
    removed = 0
    root = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for path in root.iterdir():
            if _SCRATCH.match(path.name) and abandoned(path):
                with contextlib.suppress(OSError):
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
                    removed += 1
    if removed:
        log.info("removed %d scratch files and directories that dead processes left in %s", removed, root)
    return removed


def abandoned(path: Path) -> bool:
    """Whether no live process holds the file (or the directory's owner file) locked, and it is
    old enough that its maker has had time to lock it."""
    # A directory without its owner's file was made by an older Kiln, or is being made now.
    lock = path / _OWNER if path.is_dir() else path
    try:
        if time.time() - path.stat().st_mtime < _YOUNG_S:
            return False
        with open(lock, "rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held, gone meanwhile, or not ours to read
        return False
    return True
