"""The Store on Redis, shared by every API replica and worker of a deployment.

Key layout, all under `{namespace}:`:
    blob:{key}          hash {ver, chunks, size}: the published version of a blob; with an
                        expiry, as its chunks have, while it is pending (put_blob's expire_s)
    chunk:{ver}:{i}     string: chunk i of blob version `ver` (a random hex id)
    blobs               sorted set of the kept blobs' keys, all score 0, for ordered prefix listing
    doc:{kind}:{id}     hash: one JSON-encoded value per top-level field, plus a marker
    docs:{kind}         sorted set of the ids of a kind, all score 0
    counter:{name}      integer
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Concatenate, ParamSpec, TypeVar, cast
from urllib.parse import quote

import redis
from redis.backoff import ExponentialBackoff
from redis.lock import Lock
from redis.retry import Retry

from service.store import scripts
from service.store.base import BlobNotFoundError, Doc, StoreError, StoreUnavailableError

# Short timeouts so an outage answers 503 within seconds instead of hanging requests: set, not
# left to redis-py, which waited for ever before 8.0. The compile queue's client takes them too.
CONNECT_TIMEOUT_S = 2
SOCKET_TIMEOUT_S = 5
# Chunks of an upload in progress expire, so a writer that dies, or is cut off from Redis, before it
# removes them leaves no garbage behind for long: at maxmemory that garbage refuses later writes.
# The writer renews them every third of it, so only a source that stalls this long loses them.
_PENDING_TTL_S = 60
# How long a cleanup is tried again while Redis does not answer, as long as upload chunks live.
_CLEAN_UP_S = _PENDING_TTL_S
# Chunks of a replaced blob live this long, so readers already streaming it can finish.
_REPLACED_TTL_S = 600
# Every doc hash holds this field, so an empty document still exists as a key.
_MARKER = "\x00"

P = ParamSpec("P")
R = TypeVar("R")


def _guarded(
    method: Callable[Concatenate[RedisStore, P], R],
) -> Callable[Concatenate[RedisStore, P], R]:
    @functools.wraps(method)
    def wrapper(self: RedisStore, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._reachable():
            return method(self, *args, **kwargs)

    return wrapper


# Error codes of a Redis that is up but cannot take writes for now: out of memory under a
# noeviction policy, a replica that a failover left read-only, a failed disk save, a master lost
# or too few replicas, a transaction discarded for one of those. An outage for clients (503).
# redis-py has classes for some; the others are plain ResponseErrors that begin with their code.
UNWRITABLE = (
    redis.OutOfMemoryError,
    redis.ReadOnlyError,
    redis.exceptions.MasterDownError,
    redis.exceptions.ExecAbortError,
)
UNWRITABLE_CODES = ("MISCONF", "NOREPLICAS")


class RedisStore:
    def __init__(self, url: str, namespace: str = "kiln", *, chunk_size: int = 1 << 20) -> None:
        # One quick retry on connection errors only: it replaces pooled connections that a
        # Redis restart killed; a timeout is not retried, as the command may have run.
        self._client = redis.Redis.from_url(
            url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_keepalive=True,
            health_check_interval=30,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1, (redis.ConnectionError,)),
        )
        kwargs = self._client.connection_pool.connection_kwargs
        self._address = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        self._ns = namespace
        self._chunk_size = chunk_size
        self._publish_blob = self._client.register_script(scripts.PUBLISH_BLOB)
        self._keep_blob = self._client.register_script(scripts.KEEP_BLOB)
        self._delete_blob = self._client.register_script(scripts.DELETE_BLOB)
        self._create_doc = self._client.register_script(scripts.CREATE_DOC)
        self._update_doc = self._client.register_script(scripts.UPDATE_DOC)

    @contextmanager
    def _reachable(self) -> Iterator[None]:
        """The one place where redis-py's connection errors, and the replies of a Redis that
        cannot take writes now, become StoreUnavailableError."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailableError(f"redis at {self._address} is unreachable: {exc}") from exc
        except redis.ResponseError as exc:
            # A pipeline's reply comes wrapped: "Command # 1 (DEL ...) of pipeline caused error: ..."
            reply = str(exc).rpartition("caused error: ")[2]
            if not isinstance(exc, UNWRITABLE) and not reply.startswith(UNWRITABLE_CODES):
                raise
            raise StoreUnavailableError(f"redis at {self._address} cannot take writes now: {exc}") from exc

    @_guarded
    def ping(self) -> None:
        self._client.ping()

    # Blobs

    def _blob_key(self, key: str) -> str:
        return f"{self._ns}:blob:{key}"

    def _chunk_prefix(self) -> str:
        return f"{self._ns}:chunk:"

    def _chunk_key(self, ver: str, index: int) -> str:
        return f"{self._chunk_prefix()}{ver}:{index}"

    def _blob_keys(self, key: str) -> list[str]:
        """A blob's meta and the index, the KEYS of the scripts that publish or keep it."""
        return [self._blob_key(key), f"{self._ns}:blobs"]

    @_guarded
    def put_blob(self, key: str, chunks: Iterable[bytes], expire_s: float | None = None) -> int:
        ver = uuid.uuid4().hex
        sent = size = 0
        renewed = time.monotonic()
        try:
            for piece in _rechunk(chunks, self._chunk_size):
                if time.monotonic() - renewed > _PENDING_TTL_S / 3:
                    self._renew_chunks(ver, sent)
                    renewed = time.monotonic()
                sent += 1  # counted before it is sent: one whose reply times out may be written
                self._client.set(self._chunk_key(ver, sent - 1), piece, ex=_PENDING_TTL_S)
                size += len(piece)
            published = self._publish_blob(
                keys=self._blob_keys(key),
                args=[self._chunk_prefix(), key, ver, sent, size, _REPLACED_TTL_S, _ms(expire_s)],
            )
            if not published:
                raise StoreError(f"the upload of blob {key!r} expired before it was complete")
        except BaseException:
            # Not left to expire: refused at maxmemory, they would refuse what fits meanwhile.
            if sent:
                self._clean_up(scripts.DROP_CHUNKS, [self._blob_key(key)], [self._chunk_prefix(), ver, sent])
            raise
        return size

    def _renew_chunks(self, ver: str, count: int) -> None:
        with self._client.pipeline(transaction=False) as pipe:
            for index in range(count):
                pipe.expire(self._chunk_key(ver, index), _PENDING_TTL_S)
            pipe.execute()

    @_guarded
    def keep_blob(self, key: str) -> bool:
        return bool(self._keep_blob(keys=self._blob_keys(key), args=[self._chunk_prefix(), key]))

    def discard_blob(self, key: str) -> None:
        self._clean_up(scripts.DISCARD_BLOB, [self._blob_key(key)], [self._chunk_prefix()])

    def _clean_up(
        self, script: str, keys: list[str], args: list[str | int], within_s: float = _CLEAN_UP_S
    ) -> None:
        """Run a cleanup script from a thread, so that a failure's answer does not wait for it,
        and again each second while Redis does not answer, for `within_s`: what it undoes may
        still come, a command whose reply timed out that a hung Redis runs when it resumes (the
        cleanup's own is sent once Redis answers its connection, so after it)."""

        def run() -> None:
            deadline = time.monotonic() + within_s
            while True:
                try:
                    self._client.eval(script, len(keys), *keys, *args)
                    return
                except redis.RedisError:
                    if time.monotonic() > deadline:
                        return
                    time.sleep(1)

        threading.Thread(target=run, name="kiln-store-clean-up", daemon=True).start()

    def get_blob(self, key: str) -> bytes:
        return b"".join(self.iter_blob(key))

    @_guarded
    def iter_blob(self, key: str) -> Iterator[bytes]:
        # Not a generator itself, so a missing blob raises here rather than on first read.
        ver, count = self._client.hmget(self._blob_key(key), ["ver", "chunks"])
        if ver is None or count is None:
            raise BlobNotFoundError(key)
        return self._read_chunks(key, _text(ver), int(count))

    def _read_chunks(self, key: str, ver: str, count: int) -> Iterator[bytes]:
        with self._reachable():
            for index in range(count):
                chunk = self._client.get(self._chunk_key(ver, index))
                if chunk is None:
                    raise BlobNotFoundError(f"blob {key!r} was deleted while being read")
                yield cast(bytes, chunk)  # the client never decodes, see _text

    @_guarded
    def has_blob(self, key: str) -> bool:
        return bool(self._client.exists(self._blob_key(key)))

    @_guarded
    def delete_blob(self, key: str) -> None:
        self._delete_blob(keys=self._blob_keys(key), args=[self._chunk_prefix(), key])

    @_guarded
    def list_blobs(self, prefix: str = "") -> list[str]:
        return [_text(k) for k in self._client.zrangebylex(f"{self._ns}:blobs", *_lex(prefix))]

    # Documents

    def _doc_key(self, kind: str, doc_id: str) -> str:
        # Quoting the kind keeps `kind:id` unambiguous when a kind contains ':'.
        return f"{self._ns}:doc:{quote(kind, safe='')}:{doc_id}"

    def _index_key(self, kind: str) -> str:
        return f"{self._ns}:docs:{quote(kind, safe='')}"

    @_guarded
    def get_doc(self, kind: str, doc_id: str) -> Doc | None:
        return _decode(self._client.hgetall(self._doc_key(kind, doc_id)))

    def put_doc(self, kind: str, doc_id: str, doc: Doc) -> None:
        self.put_docs([(kind, doc_id, doc)])

    @_guarded
    def put_docs(self, docs: Iterable[tuple[str, str, Doc]], keep_blobs: Iterable[str] = ()) -> None:
        encoded = [(kind, doc_id, _stored(doc)) for kind, doc_id, doc in docs]  # before any write
        with self._client.pipeline(transaction=True) as pipe:  # MULTI/EXEC: applied whole or not
            for kind, doc_id, fields in encoded:
                key = self._doc_key(kind, doc_id)
                pipe.delete(key)
                pipe.hset(key, items=_pairs(fields))
                pipe.zadd(self._index_key(kind), {doc_id: 0})
            for blob in keep_blobs:  # EVAL: a pipeline's EVALSHA costs a SCRIPT EXISTS first
                pipe.eval(scripts.KEEP_BLOB, 2, *self._blob_keys(blob), self._chunk_prefix(), blob)
            pipe.execute()

    @_guarded
    def create_doc(self, kind: str, doc_id: str, doc: Doc) -> bool:
        keys = [self._doc_key(kind, doc_id), self._index_key(kind)]
        return bool(self._create_doc(keys=keys, args=[doc_id, *_pairs(_stored(doc))]))

    @_guarded
    def update_doc(self, kind: str, doc_id: str, fields: Doc) -> None:
        if fields:
            self._update_doc(keys=[self._doc_key(kind, doc_id)], args=_pairs(_encode(fields)))

    @_guarded
    def delete_doc(self, kind: str, doc_id: str) -> None:
        with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(self._doc_key(kind, doc_id))
            pipe.zrem(self._index_key(kind), doc_id)
            pipe.execute()

    @_guarded
    def list_docs(self, kind: str, prefix: str = "") -> list[Doc]:
        ids = self._client.zrangebylex(self._index_key(kind), *_lex(prefix))
        with self._client.pipeline(transaction=False) as pipe:
            for doc_id in ids:
                pipe.hgetall(self._doc_key(kind, _text(doc_id)))
            hashes = pipe.execute()
        # A doc deleted between the two round trips comes back empty and is skipped.
        return [doc for doc in map(_decode, hashes) if doc is not None]

    @_guarded
    def next_id(self, counter: str) -> int:
        return int(self._client.incr(f"{self._ns}:counter:{counter}"))

    @contextmanager
    def lock(self, name: str, expire_s: float) -> Iterator[None]:
        """redis-py's Lock, polled for while another holds it, its expiry renewed while held: a
        holder that is killed, or cut off from Redis, loses it within `expire_s`."""
        # Not thread-local: the token is renewed from a thread of its own.
        key = f"{self._ns}:lock:{name}"
        held = self._client.lock(key, timeout=expire_s, sleep=0.2, thread_local=False)
        token = uuid.uuid4().hex
        try:
            with self._reachable():
                held.acquire(token=token)
        except StoreUnavailableError:
            # Its SET may have reached a Redis that hung, and run when it resumes: given back with
            # its token, or no one would renew it or give it back before it expired.
            self._clean_up(Lock.LUA_RELEASE_SCRIPT, [key], [token], expire_s)
            raise
        released = threading.Event()

        def renew() -> None:
            while not released.wait(expire_s / 3):
                try:
                    held.reacquire()
                except redis.RedisError:  # lost, or Redis is down: it expires by itself
                    return

        renewer = threading.Thread(target=renew, name="kiln-lock-renew", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            released.set()
            renewer.join()
            # Not released (Redis is down, or it expired): it expires by itself.
            with suppress(redis.RedisError):
                held.release()

    def close(self) -> None:
        self._client.close()


def _rechunk(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """Re-cut arbitrary pieces into `size`-byte chunks (the last one may be shorter)."""
    buf = bytearray()
    for piece in chunks:
        buf += piece
        whole = len(buf) - len(buf) % size
        for start in range(0, whole, size):
            yield bytes(buf[start : start + size])
        del buf[:whole]
    if buf:
        yield bytes(buf)


def _ms(expire_s: float | None) -> int:
    """An expiry for the scripts, in whole milliseconds; 0 for none."""
    return 0 if expire_s is None else max(1, round(expire_s * 1000))


def _lex(prefix: str) -> tuple[bytes, bytes]:
    """ZRANGEBYLEX bounds for members starting with `prefix`; 0xff never occurs in UTF-8."""
    start = b"[" + prefix.encode()
    return start, start + b"\xff"


def _encode(doc: Doc) -> dict[str, str]:
    if _MARKER in doc:
        raise ValueError(f"{_MARKER!r} is reserved and cannot be a document field")
    return {name: json.dumps(value, separators=(",", ":")) for name, value in doc.items()}


def _stored(doc: Doc) -> dict[str, str]:
    return {_MARKER: "1", **_encode(doc)}


def _pairs(fields: dict[str, str]) -> list[str]:
    return [item for pair in fields.items() for item in pair]


def _text(value: bytes | str) -> str:
    # Responses are bytes (decode_responses is off, as blobs are binary); the stubs allow str.
    return value.decode() if isinstance(value, bytes) else value


def _decode(fields: dict[bytes | str, bytes | str]) -> Doc | None:
    if not fields:
        return None
    return {_text(k): json.loads(v) for k, v in fields.items() if _text(k) != _MARKER}
