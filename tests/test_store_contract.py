"""One contract for every Store: the same tests run on Redis and on local disk + SQLite."""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from service.settings import Settings
from service.store import (
    BlobNotFoundError,
    LocalStore,
    RedisStore,
    Store,
    StoreUnavailableError,
    open_store,
)
from tests.servers import RedisServer, free_port, wait_until

CHUNK = 16  # small, so a blob of a few hundred bytes spans many chunks

Opener = Callable[[], Store]


@pytest.fixture(params=["redis", "local"])
def opener(request: pytest.FixtureRequest) -> Iterator[Opener]:
    """Opens stores on one backing Redis database or directory; closes them afterwards."""
    opened: list[Store] = []

    def open_() -> Store:
        if request.param == "redis":
            store: Store = RedisStore(request.getfixturevalue("redis_url"), chunk_size=CHUNK)
        else:
            store = LocalStore(request.getfixturevalue("data_dir"), chunk_size=CHUNK)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def store(opener: Opener) -> Store:
    return opener()


def run_threads(count: int, target: Callable[[int], None]) -> None:
    """Run target(i) in `count` threads that start together, to provoke races."""
    barrier = threading.Barrier(count)

    def start(i: int) -> None:
        barrier.wait()
        target(i)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)


# Blobs


def test_blob_roundtrip_across_many_chunks(store: Store) -> None:
    data = os.urandom(CHUNK * 20 + 5)
    # Pieces that do not line up with the chunk size.
    pieces = [data[i : i + 7] for i in range(0, len(data), 7)]
    assert store.put_blob("models/a", pieces) == len(data)
    assert store.get_blob("models/a") == data
    chunks = list(store.iter_blob("models/a"))
    assert b"".join(chunks) == data
    assert [len(c) for c in chunks] == [CHUNK] * 20 + [5]


def test_empty_blob_exists(store: Store) -> None:
    assert store.put_blob("empty", []) == 0
    assert store.has_blob("empty")
    assert store.get_blob("empty") == b""
    assert list(store.iter_blob("empty")) == []


def test_overwrite_replaces_the_blob(store: Store) -> None:
    store.put_blob("k", [os.urandom(CHUNK * 5)])
    store.put_blob("k", [b"short"])
    assert store.get_blob("k") == b"short"
    assert store.list_blobs() == ["k"]


def test_reader_started_before_an_overwrite_reads_the_old_blob(store: Store) -> None:
    old = os.urandom(CHUNK * 4)
    store.put_blob("k", [old])
    reader = store.iter_blob("k")
    first = next(reader)
    store.put_blob("k", [b"new"])
    assert first + b"".join(reader) == old
    assert store.get_blob("k") == b"new"


def test_failed_upload_leaves_nothing_visible(store: Store) -> None:
    def failing(payload: bytes) -> Iterator[bytes]:
        yield payload
        raise OSError("client went away")

    with pytest.raises(OSError, match="went away"):
        store.put_blob("new", failing(os.urandom(CHUNK * 3)))
    assert not store.has_blob("new")
    assert store.list_blobs() == []

    store.put_blob("kept", [b"original"])
    with pytest.raises(OSError, match="went away"):
        store.put_blob("kept", failing(os.urandom(CHUNK * 3)))
    assert store.get_blob("kept") == b"original"


# Pending blobs' expiry in the tests that wait it out: long enough that the calls between the
# write and the wait land before it on a loaded host; the wait polls for the expiry.
PENDING_S = 3.0


def expired(store: Store, key: str) -> bool:
    """Whether the pending blob under `key` is gone; the local store removes expired blobs as it
    writes one, so a write goes first."""
    store.put_blob("other", [b"x"])
    return not store.has_blob(key)


def test_a_pending_blob_goes_unless_a_write_keeps_it(store: Store) -> None:
    """An upload writes its model's bytes pending, and the write that records its version keeps
    them: an upload cut off between the two (the API killed, say) left them for ever."""
    data = os.urandom(CHUNK * 3 + 1)
    for key in ("models/cut-off", "models/recorded", "models/kept-alone"):
        assert store.put_blob(key, [data], expire_s=PENDING_S) == len(data)
    assert store.get_blob("models/cut-off") == data and store.has_blob("models/cut-off")
    assert store.list_blobs() == []  # listed once kept
    store.put_docs([("version", "m/1", {"sha256": "recorded"})], keep_blobs=["models/recorded"])
    assert store.keep_blob("models/kept-alone")
    assert not store.keep_blob("models/never-written")
    store.put_docs([], keep_blobs=["models/never-written"])  # nothing to keep: no error
    assert not store.has_blob("models/never-written")
    wait_until(lambda: expired(store, "models/cut-off"), PENDING_S + 10, "the pending blob's expiry")
    with pytest.raises(BlobNotFoundError):
        store.get_blob("models/cut-off")
    assert store.get_blob("models/recorded") == data == store.get_blob("models/kept-alone")
    assert store.list_blobs() == ["models/kept-alone", "models/recorded", "other"]


def test_a_pending_put_leaves_a_blob_already_there(store: Store) -> None:
    """Two identical uploads at once: the second's pending write of the bytes that the first's
    version has kept since must not make them expire under that version."""
    store.put_blob("models/a", [b"weights"])
    assert store.put_blob("models/a", [b"weights"], expire_s=PENDING_S) == len(b"weights")
    store.put_blob("models/b", [b"pending"], expire_s=PENDING_S)
    store.put_blob("models/b", [b"pending"], expire_s=60)  # the first's expiry stands
    wait_until(lambda: expired(store, "models/b"), PENDING_S + 10, "the pending blob's expiry")
    assert store.get_blob("models/a") == b"weights" and store.list_blobs("models/") == ["models/a"]
    store.put_blob("models/b", [b"pending"], expire_s=PENDING_S)
    store.put_blob("models/b", [b"pending"])  # a plain put keeps it
    time.sleep(PENDING_S + 0.5)  # past the pending expiry, which the plain put ended
    store.put_blob("other", [b"x"])
    assert store.get_blob("models/b") == b"pending"
    assert store.list_blobs("models/") == ["models/a", "models/b"]


def test_discard_deletes_only_a_pending_blob(store: Store) -> None:
    """An upload that failed before its version was recorded gives back the bytes it wrote at
    once; bytes that another upload's version kept meanwhile stay."""
    store.put_blob("models/failed", [os.urandom(CHUNK * 2)], expire_s=60)
    store.discard_blob("models/failed")
    wait_until(lambda: not store.has_blob("models/failed"), 5, "the discard")  # Redis's runs apart
    store.put_blob("models/kept", [b"weights"], expire_s=60)
    store.keep_blob("models/kept")
    store.discard_blob("models/kept")
    store.discard_blob("models/never-written")
    assert store.get_blob("models/kept") == b"weights" and store.list_blobs() == ["models/kept"]


def test_missing_blob_raises(store: Store) -> None:
    with pytest.raises(BlobNotFoundError):
        store.get_blob("nope")
    # Eagerly, before any chunk is read, so an HTTP route can answer 404 up front.
    with pytest.raises(BlobNotFoundError):
        store.iter_blob("nope")
    with pytest.raises(KeyError):
        store.get_blob("nope")
    assert not store.has_blob("nope")


def test_has_delete_and_list_with_prefix(store: Store) -> None:
    keys = ["models/b/1", "models/a/2", "models/a/1", "artifacts/x", "models/ä:ü 1"]
    for key in keys:
        store.put_blob(key, [key.encode() * 10])
    assert store.list_blobs() == sorted(keys)
    assert store.list_blobs("models/a/") == ["models/a/1", "models/a/2"]
    assert store.list_blobs("models/ä") == ["models/ä:ü 1"]
    assert store.list_blobs("zzz") == []
    assert store.get_blob("models/ä:ü 1") == "models/ä:ü 1".encode() * 10

    store.delete_blob("models/a/1")
    store.delete_blob("never-existed")
    assert not store.has_blob("models/a/1")
    assert store.has_blob("models/a/2")
    assert store.list_blobs("models/a/") == ["models/a/2"]
    with pytest.raises(BlobNotFoundError):
        store.get_blob("models/a/1")


# Documents


def test_doc_roundtrip_and_replace(store: Store) -> None:
    doc = {"name": "résumé", "n": 3, "ratio": 0.5, "tags": ["a"], "spec": {"x": [1, 2]}, "z": None}
    assert store.get_doc("models", "m1") is None
    store.put_doc("models", "m1", doc)
    assert store.get_doc("models", "m1") == doc
    store.put_doc("models", "m1", {"name": "other"})
    assert store.get_doc("models", "m1") == {"name": "other"}
    assert store.get_doc("jobs", "m1") is None


def test_empty_doc_exists(store: Store) -> None:
    store.put_doc("models", "empty", {})
    assert store.get_doc("models", "empty") == {}
    assert store.list_docs("models") == [{}]
    assert not store.create_doc("models", "empty", {"a": 1})


def test_list_docs_by_prefix_in_id_order(store: Store) -> None:
    for doc_id in ["m/b", "m/a2", "n/x", "m/a", "m/B"]:
        store.put_doc("variants", doc_id, {"id": doc_id})
    store.put_doc("jobs", "m/z", {"id": "m/z"})
    store.put_doc("a:b", "c", {"id": "kind with a colon"})
    store.put_doc("a", "b:c", {"id": "id with a colon"})

    assert [d["id"] for d in store.list_docs("variants")] == ["m/B", "m/a", "m/a2", "m/b", "n/x"]
    assert [d["id"] for d in store.list_docs("variants", "m/a")] == ["m/a", "m/a2"]
    assert store.list_docs("variants", "q") == []
    assert store.list_docs("nothing") == []
    assert store.get_doc("a:b", "c") == {"id": "kind with a colon"}
    assert store.get_doc("a", "b:c") == {"id": "id with a colon"}

    store.delete_doc("variants", "m/a")
    store.delete_doc("variants", "never-existed")
    assert store.get_doc("variants", "m/a") is None
    assert [d["id"] for d in store.list_docs("variants", "m/a")] == ["m/a2"]


def test_put_docs_writes_all_of_them_at_once_or_none(opener: Opener) -> None:
    """A registry's version is written with its variants, jobs and upload record: a reader never
    sees some of them, and a write that fails leaves none."""
    writer, reader = opener(), opener()
    with pytest.raises(TypeError):
        writer.put_docs([("a", "1", {"n": 0}), ("b", "1", {"n": {"not JSON"}})])
    assert reader.get_doc("a", "1") is None and reader.list_docs("b") == []
    writer.put_docs([("a", "1", {"n": 0}), ("b", "1", {"n": 0, "old": True})])
    assert reader.get_doc("b", "1") == {"n": 0, "old": True}
    done = threading.Event()
    seen: set[int] = set()
    written = [0]

    def write() -> None:
        # On past 299 until the reader saw a few: a busy host can keep it from reading between them.
        while written[0] < 299 or (len(seen) < 3 and written[0] < 100_000):
            written[0] += 1
            writer.put_docs([("a", "1", {"n": written[0]}), ("b", "1", {"n": written[0]})])
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    while not done.is_set():
        a, b = reader.get_doc("a", "1"), reader.get_doc("b", "1")  # b read after a: never older
        assert a is not None and b is not None and b["n"] >= a["n"], (a, b)
        seen.add(a["n"])
    thread.join(30)
    assert reader.get_doc("b", "1") == {"n": written[0]}  # each replaced whole
    assert len(seen) > 1


def test_create_doc_only_once(store: Store) -> None:
    assert store.create_doc("jobs", "j1", {"state": "queued"})
    assert not store.create_doc("jobs", "j1", {"state": "other"})
    assert store.get_doc("jobs", "j1") == {"state": "queued"}


def test_create_doc_races_have_one_winner(opener: Opener) -> None:
    stores = [opener(), opener()]
    wins: dict[str, list[int]] = {f"j{n}": [] for n in range(20)}

    def create(i: int) -> None:
        for doc_id, winners in wins.items():
            if stores[i % 2].create_doc("jobs", doc_id, {"by": i}):
                winners.append(i)

    run_threads(8, create)
    for doc_id, winners in wins.items():
        assert len(winners) == 1
        assert stores[0].get_doc("jobs", doc_id) == {"by": winners[0]}


def test_update_doc_merges_top_level_fields(store: Store) -> None:
    store.put_doc("variants", "v", {"status": "queued", "spec": {"a": 1, "b": 2}, "n": 1})
    store.update_doc("variants", "v", {"status": "ready", "spec": {"a": 9}, "latency": 1.5})
    assert store.get_doc("variants", "v") == {
        "status": "ready",
        "spec": {"a": 9},
        "n": 1,
        "latency": 1.5,
    }


def test_update_doc_of_missing_doc_is_a_noop(store: Store) -> None:
    store.update_doc("variants", "ghost", {"status": "ready"})
    assert store.get_doc("variants", "ghost") is None
    assert store.list_docs("variants") == []
    assert store.create_doc("variants", "ghost", {"status": "queued"})


def test_concurrent_updates_of_different_fields_lose_nothing(opener: Opener) -> None:
    first = opener()
    first.put_doc("variants", "v", {"base": True})
    # Each thread uses its own store instance too, as separate processes would.
    stores = [first, *(opener() for _ in range(3))]

    def update(i: int) -> None:
        for step in range(25):
            stores[i % len(stores)].update_doc("variants", "v", {f"f{i}": step})

    run_threads(8, update)
    assert first.get_doc("variants", "v") == {"base": True, **{f"f{i}": 24 for i in range(8)}}


def test_next_id_is_atomic_across_threads(opener: Opener) -> None:
    stores = [opener(), opener()]
    ids: list[int] = []
    lock = threading.Lock()

    def take(i: int) -> None:
        mine = [stores[i % 2].next_id("jobs") for _ in range(50)]
        with lock:
            ids.extend(mine)

    run_threads(8, take)
    assert sorted(ids) == list(range(1, 401))
    assert stores[0].next_id("models") == 1
    assert stores[1].next_id("jobs") == 401


def test_a_lock_is_held_by_one_at_a_time(opener: Opener) -> None:
    stores = [opener(), opener()]
    inside: list[int] = []
    most = [0]
    guard = threading.Lock()

    def hold(i: int) -> None:
        for _ in range(5):
            with stores[i % 2].lock("deploy", expire_s=30):
                with guard:
                    inside.append(i)
                    most[0] = max(most[0], len(inside))
                time.sleep(0.005)
                with guard:
                    inside.remove(i)

    run_threads(6, hold)
    assert most[0] == 1
    with stores[0].lock("deploy", 30), stores[1].lock("another", 30):  # names lock apart
        pass


def _hold_forever(url: str, held: Any) -> None:
    with RedisStore(url).lock("deploy", expire_s=1.0):
        held.set()
        time.sleep(600)


def test_a_redis_lock_is_renewed_while_held_and_expires_once_its_holder_is_killed(redis_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    held = context.Event()
    holder = context.Process(target=_hold_forever, args=(redis_url, held), daemon=True)
    holder.start()
    store = RedisStore(redis_url)
    try:
        assert held.wait(60)
        taken = threading.Event()

        def take() -> None:
            with store.lock("deploy", 30):
                taken.set()

        waiter = threading.Thread(target=take)
        waiter.start()
        time.sleep(2.5)  # over twice its expiry: renewed, it is still held
        assert not taken.is_set()
        killed = time.monotonic()
        os.kill(holder.pid or 0, signal.SIGKILL)
        waiter.join(10)
        assert taken.is_set() and time.monotonic() - killed < 2
    finally:
        holder.kill()
        store.close()


def test_data_survives_reopening(opener: Opener) -> None:
    store = opener()
    blob = os.urandom(CHUNK * 3 + 1)
    store.put_blob("models/m", [blob])
    store.put_doc("models", "m", {"sha256": "abc"})
    assert store.next_id("jobs") == 1
    store.close()

    again = opener()
    again.ping()
    assert again.get_blob("models/m") == blob
    assert again.list_blobs() == ["models/m"]
    assert again.get_doc("models", "m") == {"sha256": "abc"}
    assert again.list_docs("models") == [{"sha256": "abc"}]
    assert again.next_id("jobs") == 2


def _take_ids(root: Path, start_at: float) -> list[int]:
    store = LocalStore(root)
    time.sleep(max(0.0, start_at - time.time()))  # all processes collide at once
    try:
        return [store.next_id("jobs") for _ in range(200)]
    finally:
        store.close()


def test_local_store_is_shared_by_processes(data_dir: Path) -> None:
    # Like several uvicorn workers on one data dir.
    LocalStore(data_dir).close()
    start_at = time.time() + 3
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(_take_ids, [(data_dir, start_at)] * 4, chunksize=1)
    assert sorted(i for ids in results for i in ids) == list(range(1, 801))


# Choosing a store, and Redis outages


def test_open_store_follows_settings(redis_url: str, data_dir: Path) -> None:
    remote = open_store(Settings(redis_url=redis_url, data_dir=data_dir))
    local = open_store(Settings(redis_url=None, data_dir=data_dir))
    try:
        assert isinstance(remote, RedisStore)
        assert isinstance(local, LocalStore)
        assert (data_dir / "kiln.db").is_file()
    finally:
        remote.close()
        local.close()


def test_unreachable_redis_raises_store_unavailable_quickly() -> None:
    port = free_port()  # nothing listens there
    store = RedisStore(f"redis://127.0.0.1:{port}/0")
    message = f"redis at 127.0.0.1:{port} is unreachable"
    try:
        for call in (store.ping, lambda: store.get_doc("models", "m")):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match=message):
                call()
            assert time.monotonic() - started < 5
        with pytest.raises(StoreUnavailableError):
            store.put_blob("k", [b"x"])
    finally:
        store.close()


def test_redis_outage_is_reported_and_then_recovered(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    store = RedisStore(server.url, chunk_size=CHUNK)
    try:
        store.put_doc("models", "m", {"v": 1})
        store.put_blob("b", [b"y" * (CHUNK * 2)])
        reader = store.iter_blob("b")
        server.stop()
        with pytest.raises(StoreUnavailableError):
            store.get_doc("models", "m")
        with pytest.raises(StoreUnavailableError):
            list(reader)  # errors while streaming are translated too
        server.start()  # same port, data kept in the append-only file
        assert store.get_doc("models", "m") == {"v": 1}
        assert store.get_blob("b") == b"y" * (CHUNK * 2)
    finally:
        store.close()
        server.stop()


def test_a_redis_that_cannot_take_writes_is_unavailable(tmp_path: Path) -> None:
    """Out of memory (maxmemory, noeviction) or a read-only replica after a failover: the
    store's callers answer 503, as for an outage, and reads still work."""
    server = RedisServer(tmp_path)
    server.start()
    store = RedisStore(server.url, chunk_size=CHUNK)
    admin = redis.Redis(port=server.port)
    try:
        store.put_doc("models", "m", {"v": 1})
        admin.config_set("maxmemory", "1")
        for write in (
            lambda: store.put_doc("models", "n", {"v": 2}),
            lambda: store.create_doc("models", "o", {"v": 3}),
            lambda: store.put_blob("b", [b"y" * (CHUNK * 2)]),
        ):
            with pytest.raises(StoreUnavailableError, match=r"cannot take writes now: .*maxmemory"):
                write()
        admin.config_set("maxmemory", "0")
        admin.replicaof("127.0.0.1", free_port())  # a master that is not there: read-only
        with pytest.raises(StoreUnavailableError, match=r"cannot take writes now: .*read only replica"):
            store.put_doc("models", "n", {"v": 2})
        assert store.get_doc("models", "m") == {"v": 1}
        admin.replicaof("no", "one")
        admin.config_set("min-replicas-to-write", "1")  # no replica: NOREPLICAS, in a MULTI too
        for write in (
            lambda: store.put_doc("models", "n", {"v": 2}),
            lambda: store.put_docs([("models", "n", {"v": 2}), ("models", "p", {"v": 3})]),
            lambda: store.delete_doc("models", "m"),
        ):
            with pytest.raises(StoreUnavailableError, match=r"cannot take writes now: .*NOREPLICAS"):
                write()
        admin.config_set("min-replicas-to-write", "0")
        # Replies redis-py parses into classes of their own, and strips of their codes.
        master_down = redis.exceptions.MasterDownError("Link with MASTER is down and replica-serve-stale...")
        with (
            pytest.raises(StoreUnavailableError, match="cannot take writes now: Link with MASTER"),
            store._reachable(),
        ):
            raise master_down
    finally:
        admin.close()
        store.close()
        server.stop()


def test_a_local_store_that_cannot_take_writes_is_unavailable(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database locked by another process past the busy timeout, or the disk full: 503 with
    the reason, as for Redis, not a 500; reads still work, and nothing half-written shows."""
    store = LocalStore(data_dir, chunk_size=CHUNK)
    store.put_doc("models", "m", {"v": 1})
    store._db.execute("PRAGMA busy_timeout = 100")  # the default waits 30 s
    other = sqlite3.connect(data_dir / "kiln.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction, held
        with pytest.raises(StoreUnavailableError, match="database is locked"):
            store.put_doc("models", "n", {"v": 2})
        assert store.get_doc("models", "m") == {"v": 1}
        other.execute("ROLLBACK")
        store.put_doc("models", "n", {"v": 2})

        def disk_full(fd: int) -> None:  # where a full disk's write-back fails
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", disk_full)
        with pytest.raises(StoreUnavailableError, match="No space left on device"):
            store.put_blob("b", [b"y" * (CHUNK * 2)])
        monkeypatch.undo()
        assert not store.has_blob("b") and store.list_blobs() == []
    finally:
        other.close()
        store.close()


def test_redis_chunks_are_cleaned_up(redis_url: str) -> None:
    store = RedisStore(redis_url, chunk_size=CHUNK)
    raw = redis.Redis.from_url(redis_url)
    try:

        def chunk_ttls() -> list[int]:
            return sorted(raw.ttl(k) for k in raw.scan_iter("kiln:chunk:*"))

        store.put_blob("k", [os.urandom(CHUNK * 5)])
        assert chunk_ttls() == [-1] * 5  # published chunks do not expire
        store.put_blob("k", [os.urandom(CHUNK * 2)])
        ttls = chunk_ttls()
        # The replaced version's chunks expire after a grace period for in-flight readers.
        assert ttls[:2] == [-1, -1] and len(ttls) == 7 and all(t > 0 for t in ttls[2:])
        store.delete_blob("k")
        assert all(t > 0 for t in chunk_ttls()) and len(chunk_ttls()) == 5
        assert not raw.exists("kiln:blob:k")
        assert raw.zcard("kiln:blobs") == 0
    finally:
        raw.close()
        store.close()


def test_deployments_of_different_namespaces_share_nothing_in_one_redis(redis_url: str) -> None:
    """KILN_QUEUE_NAMESPACE kept the queues apart but not the store: each deployment saw the
    other's models and jobs, and its redelivery compiled them again."""
    ours, theirs = (open_store(Settings(redis_url=redis_url, queue_namespace=ns)) for ns in ("kiln", "other"))
    theirs.put_doc("job", "j1", {"status": "running"})
    theirs.put_blob("models/m", [b"weights"])
    assert ours.list_docs("job") == [] and ours.list_blobs() == []
    assert [d["status"] for d in theirs.list_docs("job")] == ["running"]


def test_an_upload_refused_at_maxmemory_leaves_nothing_that_refuses_the_next(tmp_path: Path) -> None:
    """Its chunks written until Redis refused one stayed a day: Redis stayed nearly full, and
    uploads that fit were refused too. Compiles' artifacts are written the same way."""
    server = RedisServer(tmp_path)
    server.start()
    store = RedisStore(server.url, chunk_size=64 << 10)
    admin = redis.Redis(port=server.port)
    try:
        admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + (4 << 20))
        with pytest.raises(StoreUnavailableError, match="cannot take writes now"):
            store.put_blob("models/big", [os.urandom(16 << 20)])
        wait_until(lambda: list(admin.scan_iter("kiln:chunk:*")) == [], 5, "its chunks to go")
        fits = os.urandom(2 << 20)
        store.put_blob("models/fits", [fits])
        assert store.get_blob("models/fits") == fits
    finally:
        admin.close()
        store.close()
        server.stop()


def test_an_upload_s_chunks_expire_soon_unless_their_writer_renews_them(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer killed mid-upload, or cut off from Redis, cannot remove its chunks: they expired
    after 24 h. They expire within a minute now, renewed while their writer is at it."""
    store = RedisStore(redis_url, chunk_size=CHUNK)
    raw = redis.Redis.from_url(redis_url)
    ttls: list[int] = []

    def source(pieces: int, pause_s: float) -> Iterator[bytes]:
        for _ in range(pieces):
            yield b"c" * CHUNK
            ttls.extend(raw.ttl(k) for k in raw.scan_iter("kiln:chunk:*"))
            time.sleep(pause_s)

    try:
        store.put_blob("models/a", source(3, 0))
        assert ttls and all(0 < ttl <= 60 for ttl in ttls), ttls
        monkeypatch.setattr("service.store.redis._PENDING_TTL_S", 1)
        store.put_blob("models/slow", source(8, 0.25))  # 2 s: over twice their expiry
        assert store.get_blob("models/slow") == b"c" * CHUNK * 8
    finally:
        raw.close()
        store.close()


def test_a_pending_blob_s_chunks_expire_with_it_and_go_with_a_discard(redis_url: str) -> None:
    store = RedisStore(redis_url, chunk_size=CHUNK)
    raw = redis.Redis.from_url(redis_url)
    try:
        store.put_blob("models/a", [os.urandom(CHUNK * 3)], expire_s=60)
        keys = [b"kiln:blob:models/a", *raw.scan_iter("kiln:chunk:*")]
        assert len(keys) == 4 and all(0 < raw.ttl(k) <= 60 for k in keys)
        store.discard_blob("models/a")
        wait_until(lambda: raw.exists(*keys) == 0, 5, "the discard")
        store.put_blob("models/a", [os.urandom(CHUNK * 3)], expire_s=60)
        store.put_blob("models/a", [os.urandom(CHUNK * 3)], expire_s=60)  # its chunks go at once
        assert len(list(raw.scan_iter("kiln:chunk:*"))) == 3
        assert store.keep_blob("models/a")
        assert all(raw.ttl(k) == -1 for k in [b"kiln:blob:models/a", *raw.scan_iter("kiln:chunk:*")])
    finally:
        raw.close()
        store.close()


def test_a_lock_whose_acquire_timed_out_on_a_hung_redis_is_not_left_held(tmp_path: Path) -> None:
    """The SET that takes the lock timed out on a Redis that hung, and ran when it resumed: the
    lock stayed held, renewed by no one, and the model's next upload waited out its 30 s."""
    server = RedisServer(tmp_path)
    server.start()
    store = RedisStore(server.url)
    admin = redis.Redis(port=server.port)
    try:
        store.ping()
        server.pause()
        try:
            with pytest.raises(StoreUnavailableError, match="unreachable"), store.lock("model:m", 30):
                pass
        finally:
            server.resume()
        wait_until(lambda: not admin.exists("kiln:lock:model:m"), 5, "the lock to be given back")
        started = time.monotonic()
        with store.lock("model:m", 30):
            assert time.monotonic() - started < 1
    finally:
        admin.close()
        store.close()
        server.stop()
