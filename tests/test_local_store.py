"""The local store's own failures and leftovers, beyond the contract that Redis shares."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.api import problems
from service.store import LocalStore, StoreUnavailableError


def test_a_lock_whose_file_fails_makes_the_store_unavailable(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock's file could not be made (the data dir out of space or inodes, read-only, its
    locks directory gone) or locked: a raw OSError made a 500, or a 503 that named /tmp as full;
    a compile's outage retries missed it."""
    store = LocalStore(data_dir)
    try:
        shutil.rmtree(data_dir / "locks")
        (data_dir / "locks").write_text("not a directory")
        with pytest.raises(StoreUnavailableError, match="Not a directory"), store.lock("m", 30):
            pytest.fail("held a lock it has no file for")
        (data_dir / "locks").unlink()
        (data_dir / "locks").mkdir()

        def failing(file: Any, operation: int) -> None:
            raise OSError(errno.ENOLCK, "No locks available")

        monkeypatch.setattr(fcntl, "flock", failing)
        with pytest.raises(StoreUnavailableError, match="No locks available"), store.lock("m", 30):
            pytest.fail("held a lock it could not take")
        monkeypatch.undo()
        # What the holder raises is its own, not the store's.
        with pytest.raises(OSError, match="the holder's"), store.lock("m", 30):
            raise OSError(errno.ENOSPC, "the holder's")
        with store.lock("m", 30):
            pass
    finally:
        store.close()


@pytest.mark.parametrize(
    ("filename", "named"),
    [
        ("/srv/kiln-data/locks/a.lock", "the server's disk holding /srv/kiln-data/locks/a.lock is full"),
        (None, f"the server's temporary disk ({tempfile.gettempdir()}) is full"),
        (f"{tempfile.gettempdir()}/kiln-upload-1", "temporary disk"),
    ],
)
def test_a_full_disk_is_named_by_the_path_that_failed(filename: str | None, named: str) -> None:
    app = FastAPI()
    problems.install(app)

    @app.get("/full")
    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    answer = TestClient(app).get("/full")
    assert answer.status_code == 503 and named in answer.json()["detail"]


def test_a_blob_half_written_by_a_killed_writer_is_removed_when_a_store_opens(data_dir: Path) -> None:
    """kill -9 mid-upload left blobs/<xx>/.tmp-* for good; one a live writer holds stays."""
    store = LocalStore(data_dir)
    writing, release = threading.Event(), threading.Event()

    def slow() -> Iterator[bytes]:
        yield b"first"
        writing.set()
        release.wait(30)
        yield b"last"

    writer = threading.Thread(target=store.put_blob, args=("live", slow()))
    writer.start()
    try:
        assert writing.wait(30)
        [live] = data_dir.glob("blobs/*/.tmp-*")
        dead = live.parent / ".tmp-dead"
        dead.write_bytes(b"half")  # as a writer killed mid-upload left it: no one holds its lock
        young = live.parent / ".tmp-young"
        young.write_bytes(b"")  # as just made, its writer about to lock it
        past = time.time() - 3600
        for tmp in (live, dead):
            os.utime(tmp, (past, past))
        LocalStore(data_dir).close()
        assert sorted(p.name for p in data_dir.glob("blobs/*/.tmp-*")) == sorted([live.name, young.name])
    finally:
        release.set()
        writer.join(30)
    assert store.get_blob("live") == b"firstlast"
    store.close()


def test_pending_bytes_a_killed_upload_left_are_removed_when_a_store_opens_past_their_expiry(
    data_dir: Path,
) -> None:
    """An embedded server killed between an upload's model bytes and its version record: they
    go once expired, when the next process opens the store, if no upload's write came first."""
    store = LocalStore(data_dir)
    store.put_blob("models/cut-off", [b"weights"], expire_s=0.3)
    store.put_blob("models/recorded", [b"weights"], expire_s=0.3)
    store.put_docs([("version", "m/1", {})], keep_blobs=["models/recorded"])
    LocalStore(data_dir).close()  # opened before they expire: they stay
    assert store.has_blob("models/cut-off")
    store.close()
    time.sleep(0.5)
    again = LocalStore(data_dir)
    assert not again.has_blob("models/cut-off") and again.list_blobs() == ["models/recorded"]
    assert [p.name for p in data_dir.glob("blobs/*/*")] == [again._path("models/recorded").name]
    again.close()


def test_a_read_does_not_wait_behind_a_write_waiting_for_the_database(data_dir: Path) -> None:
    """Another process held SQLite's write lock; a write of this one waited for it up to the busy
    timeout, and every read of the process behind it: GET /v1/models/x took 28.5 s."""
    store = LocalStore(data_dir)
    store.put_doc("model", "x", {"name": "x"})
    other = sqlite3.connect(data_dir / "kiln.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's write transaction, held
    writer = threading.Thread(target=store.put_doc, args=("model", "y", {"name": "y"}))
    try:
        writer.start()
        time.sleep(0.2)  # the write now waits for the other's transaction
        assert writer.is_alive()
        started = time.monotonic()
        assert store.get_doc("model", "x") == {"name": "x"}
        assert [d["name"] for d in store.list_docs("model")] == ["x"]
        assert time.monotonic() - started < 2
    finally:
        other.execute("ROLLBACK")
        other.close()
        writer.join(30)
    assert store.get_doc("model", "y") == {"name": "y"}  # the write went through once it could
    store.close()
