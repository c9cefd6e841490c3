"""The Store on local disk, the embedded default: blobs are files, the rest is SQLite.

Layout under `root`:
    blobs/{h[:2]}/{h}     a blob, where h = sha256(key); any key maps to a safe file name
    blobs/{h[:2]}/.tmp-*  a blob being written, flocked by its writer until published
    kiln.db               SQLite (WAL): the kept blobs' keys, the pending ones' expiries,
                          documents and counters
    locks/{h}.lock        a lock's file, h = sha256(its name)

Several processes (uvicorn workers, the compile pool) may share one root: files are
published with os.replace, and SQLite's locking serializes the writers.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

from service.scratch import abandoned
from service.store.base import BlobNotFoundError, Doc, StoreUnavailableError

log = logging.getLogger("kiln.store")

# A blob being written, beside where it is published.
_TEMP_PREFIX = ".tmp-"
# What a store's write fails with when the disk or the data dir, not the data written, is at fault.
_FAILING = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM)
# How long a writer waits for another process's write transaction before failing.
_BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (key TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pending_blobs (key TEXT PRIMARY KEY, expires_at REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS docs (
    kind TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (kind, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
"""


class LocalStore:
    def __init__(self, root: Path, *, chunk_size: int = 1 << 20) -> None:
        self._blobs = root / "blobs"
        self._blobs.mkdir(parents=True, exist_ok=True)
        self._locks = root / "locks"
        self._locks.mkdir(exist_ok=True)
        self._chunk_size = chunk_size
        # A connection for writes and one for reads, each behind a lock: store calls are short,
        # and SQLite runs one writer at a time anyway. Reads have their own so that, under WAL,
        # they never wait behind a write, which may wait out another process's transaction for
        # the busy timeout. Autocommit mode, so transactions are only the explicit ones.
        self._lock = threading.Lock()
        self._db = self._connect(root)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._read_lock = threading.Lock()
        self._reader = self._connect(root)
        self._reader.execute("PRAGMA query_only=ON")
        self._sweep_temp_files()
        with suppress(StoreUnavailableError), self._write() as db:  # else the next put_blob does
            self._sweep_expired(db)

    def _sweep_temp_files(self) -> None:
        """Remove the blobs' temp files whose writers died (kill -9 mid-upload): nothing else would."""
        removed = 0
        for tmp in self._blobs.glob(f"*/{_TEMP_PREFIX}*"):
            if abandoned(tmp):
                # Gone (another process's sweep was first), or not ours to remove: the store opens.
                with suppress(OSError):
                    tmp.unlink()
                    removed += 1
        if removed:
            log.info("removed %d temp files that dead writers left in %s", removed, self._blobs)

    @staticmethod
    def _connect(root: Path) -> sqlite3.Connection:
        return sqlite3.connect(
            root / "kiln.db", timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )

    @contextmanager
    def _unavailable_on_failure(self, *, only_ours: bool = False) -> Iterator[None]:
        """The database locked past the busy timeout, the disk full, failing or not ours to write:
        the store is unavailable (503), as a Redis that does not answer is, not a fault of the
        request's. `only_ours`: the block touches no file but the store's, so any OSError is."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            raise StoreUnavailableError(f"the database in {self._blobs.parent} fails: {exc}") from exc
        except OSError as exc:
            if not only_ours and exc.errno not in _FAILING:  # e.g. the caller's chunks failing
                raise
            raise StoreUnavailableError(f"the store in {self._blobs.parent} cannot write: {exc}") from exc

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """A read."""
        with self._unavailable_on_failure(), self._read_lock:
            return self._reader.execute(sql, params).fetchall()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; IMMEDIATE takes the lock up front, so a read-modify-write
        waits for other writers instead of failing when it upgrades."""
        with self._unavailable_on_failure(), self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def ping(self) -> None:
        try:
            self._query("SELECT 1")
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"the database in {self._blobs.parent} fails: {exc}") from exc
        if not self._blobs.is_dir():
            raise StoreUnavailableError(f"the blob directory {self._blobs} is gone")

    # Blobs

    def _path(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self._blobs / digest[:2] / digest

    def put_blob(self, key: str, chunks: Iterable[bytes], expire_s: float | None = None) -> int:
        with self._unavailable_on_failure():
            return self._put_blob(key, chunks, expire_s)

    def _put_blob(self, key: str, chunks: Iterable[bytes], expire_s: float | None) -> int:
        path = self._path(key)
        path.parent.mkdir(exist_ok=True)
        # The temp file sits in the target's directory, so os.replace is an atomic rename.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TEMP_PREFIX)
        size = 0
        try:
            with os.fdopen(fd, "wb") as out:
                # Locked until it is published: one a killed writer left is told apart, and swept.
                fcntl.flock(out, fcntl.LOCK_SH)
                for chunk in chunks:
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
                # Inside the transaction, so a concurrent delete of the key cannot interleave.
                with self._write() as db:
                    self._sweep_expired(db)
                    if expire_s is None:
                        os.replace(tmp, path)
                        self._keep(db, key)
                    elif not path.is_file():  # one there, kept or pending, stays
                        os.replace(tmp, path)
                        db.execute(
                            "INSERT OR REPLACE INTO pending_blobs (key, expires_at) VALUES (?, ?)",
                            (key, time.time() + expire_s),
                        )
        finally:
            with suppress(FileNotFoundError):
                os.unlink(tmp)
        return size

    def get_blob(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise BlobNotFoundError(key) from None

    def iter_blob(self, key: str) -> Iterator[bytes]:
        # Open now, so a missing blob raises here; the open file survives a later replace.
        try:
            file = self._path(key).open("rb")
        except FileNotFoundError:
            raise BlobNotFoundError(key) from None
        return self._read_chunks(file)

    def _read_chunks(self, file: BinaryIO) -> Iterator[bytes]:
        with file:
            while chunk := file.read(self._chunk_size):
                yield chunk

    def has_blob(self, key: str) -> bool:
        return self._path(key).is_file()

    def keep_blob(self, key: str) -> bool:
        with self._write() as db:
            return self._keep(db, key)

    def _keep(self, db: sqlite3.Connection, key: str) -> bool:
        db.execute("DELETE FROM pending_blobs WHERE key = ?", (key,))
        if not self._path(key).is_file():
            return False
        db.execute("INSERT OR IGNORE INTO blobs (key) VALUES (?)", (key,))
        return True

    def discard_blob(self, key: str) -> None:
        with suppress(StoreUnavailableError), self._write() as db:  # it expires anyway
            if db.execute("DELETE FROM pending_blobs WHERE key = ?", (key,)).rowcount:
                with suppress(FileNotFoundError):
                    self._path(key).unlink()

    def _sweep_expired(self, db: sqlite3.Connection) -> None:
        """Remove the pending blobs past their expiry: uploads cut off before a version kept them."""
        expired = db.execute("SELECT key FROM pending_blobs WHERE expires_at <= ?", (time.time(),)).fetchall()
        for (key,) in expired:
            db.execute("DELETE FROM pending_blobs WHERE key = ?", (key,))
            with suppress(FileNotFoundError):
                self._path(key).unlink()

    def delete_blob(self, key: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM blobs WHERE key = ?", (key,))
            db.execute("DELETE FROM pending_blobs WHERE key = ?", (key,))
            with suppress(FileNotFoundError):
                self._path(key).unlink()

    def list_blobs(self, prefix: str = "") -> list[str]:
        rows = self._query(
            "SELECT key FROM blobs WHERE substr(key, 1, ?) = ? ORDER BY key", (len(prefix), prefix)
        )
        return [key for (key,) in rows]

    # Documents

    def get_doc(self, kind: str, doc_id: str) -> Doc | None:
        rows = self._query("SELECT body FROM docs WHERE kind = ? AND id = ?", (kind, doc_id))
        return json.loads(rows[0][0]) if rows else None

    def put_doc(self, kind: str, doc_id: str, doc: Doc) -> None:
        self.put_docs([(kind, doc_id, doc)])

    def put_docs(self, docs: Iterable[tuple[str, str, Doc]], keep_blobs: Iterable[str] = ()) -> None:
        rows = [(kind, doc_id, json.dumps(doc)) for kind, doc_id, doc in docs]  # before the lock
        with self._write() as db:
            db.executemany(
                "INSERT INTO docs (kind, id, body) VALUES (?, ?, ?)"
                " ON CONFLICT (kind, id) DO UPDATE SET body = excluded.body",
                rows,
            )
            for key in keep_blobs:
                self._keep(db, key)

    def create_doc(self, kind: str, doc_id: str, doc: Doc) -> bool:
        with self._write() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO docs (kind, id, body) VALUES (?, ?, ?)",
                (kind, doc_id, json.dumps(doc)),
            )
            return cursor.rowcount == 1

    def update_doc(self, kind: str, doc_id: str, fields: Doc) -> None:
        with self._write() as db:
            row = db.execute("SELECT body FROM docs WHERE kind = ? AND id = ?", (kind, doc_id)).fetchone()
            if row is not None:
                body = json.dumps({**json.loads(row[0]), **fields})
                db.execute("UPDATE docs SET body = ? WHERE kind = ? AND id = ?", (body, kind, doc_id))

    def delete_doc(self, kind: str, doc_id: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM docs WHERE kind = ? AND id = ?", (kind, doc_id))

    def list_docs(self, kind: str, prefix: str = "") -> list[Doc]:
        # SQLite's default BINARY collation orders like Python's str order and Redis's ZSET.
        rows = self._query(
            "SELECT body FROM docs WHERE kind = ? AND substr(id, 1, ?) = ? ORDER BY id",
            (kind, len(prefix), prefix),
        )
        return [json.loads(body) for (body,) in rows]

    def next_id(self, counter: str) -> int:
        with self._write() as db:
            rows = db.execute(
                "INSERT INTO counters (name, value) VALUES (?, 1)"
                " ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value",
                (counter,),
            ).fetchall()
        return int(rows[0][0])

    @contextmanager
    def lock(self, name: str, expire_s: float) -> Iterator[None]:
        """An flock: the kernel releases it when its holder exits, however, so it never expires."""
        path = self._locks / f"{hashlib.sha256(name.encode()).hexdigest()}.lock"
        # Its open and flock only, not the holder's block: an OSError of the holder's is its own.
        with self._unavailable_on_failure(only_ours=True):
            file = path.open("a")
        with file:
            with self._unavailable_on_failure(only_ours=True):
                fcntl.flock(file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(file, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._db.close()
            self._reader.close()
