"""The Store on Redis, shared by every API replica and worker of a deployment.

Key layout, all under `{namespace}:`:
    blob:{key}          hash {ver, chunks, size}: the published version of a blob
    chunk:{ver}:{i}     string: chunk i of blob version `ver` (a random hex id)
    blobs               sorted set of blob keys, all score 0, for ordered prefix listing
    doc:{kind}:{id}     hash: one JSON-encoded value per top-level field, plus a marker
    docs:{kind}         sorted set of the ids of a kind, all score 0
    counter:{name}      integer
"""

from __future__ import annotations

import functools
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Concatenate, ParamSpec, TypeVar, cast
from urllib.parse import quote

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from service.store.base import BlobNotFoundError, Doc, StoreError, StoreUnavailableError

# Chunks of an upload in progress expire, so a writer that dies leaves no garbage behind.
_PENDING_TTL_S = 24 * 3600
# Chunks of a replaced blob live this long, so readers already streaming it can finish.
_REPLACED_TTL_S = 600
# Every doc hash holds this field, so an empty document still exists as a key.
_MARKER = "\x00"

# Publishes an uploaded version: all of its chunks must still be there. KEYS: meta, index.
# ARGV: chunk key prefix, blob key, version, chunk count, size, grace seconds.
_PUBLISH_BLOB = """
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  if redis.call('EXISTS', ARGV[1] .. ARGV[3] .. ':' .. i) == 0 then return 0 end
end
for i = 0, n - 1 do redis.call('PERSIST', ARGV[1] .. ARGV[3] .. ':' .. i) end
local old = redis.call('HMGET', KEYS[1], 'ver', 'chunks')
if old[1] then
  for i = 0, tonumber(old[2]) - 1 do
    redis.call('EXPIRE', ARGV[1] .. old[1] .. ':' .. i, ARGV[6])
  end
end
redis.call('HSET', KEYS[1], 'ver', ARGV[3], 'chunks', n, 'size', ARGV[5])
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return 1
"""

# KEYS: meta, index. ARGV: chunk key prefix, blob key.
_DELETE_BLOB = """
local old = redis.call('HMGET', KEYS[1], 'ver', 'chunks')
if old[1] then
  for i = 0, tonumber(old[2]) - 1 do redis.call('UNLINK', ARGV[1] .. old[1] .. ':' .. i) end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
"""

# KEYS: doc, index. ARGV: id, then field/value pairs.
_CREATE_DOC = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
"""

# KEYS: doc. ARGV: field/value pairs.
_UPDATE_DOC = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""

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
        # Short timeouts so an outage answers 503 within seconds instead of hanging requests.
        # One quick retry on connection errors only: it replaces pooled connections that a
        # Redis restart killed; a timeout is not retried, as the command may have run.
        self._client = redis.Redis.from_url(
            url,
            socket_connect_timeout=2,
            socket_timeout=5,
            health_check_interval=30,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1, (redis.ConnectionError,)),
        )
        kwargs = self._client.connection_pool.connection_kwargs
        self._address = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        self._ns = namespace
        self._chunk_size = chunk_size
        self._publish_blob = self._client.register_script(_PUBLISH_BLOB)
        self._delete_blob = self._client.register_script(_DELETE_BLOB)
        self._create_doc = self._client.register_script(_CREATE_DOC)
        self._update_doc = self._client.register_script(_UPDATE_DOC)

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

    def _chunk_key(self, ver: str, index: int) -> str:
        return f"{self._ns}:chunk:{ver}:{index}"

    @_guarded
    def put_blob(self, key: str, chunks: Iterable[bytes]) -> int:
        ver = uuid.uuid4().hex
        count = size = 0
        for piece in _rechunk(chunks, self._chunk_size):
            self._client.set(self._chunk_key(ver, count), piece, ex=_PENDING_TTL_S)
            count += 1
            size += len(piece)
        published = self._publish_blob(
            keys=[self._blob_key(key), f"{self._ns}:blobs"],
            args=[f"{self._ns}:chunk:", key, ver, count, size, _REPLACED_TTL_S],
        )
        if not published:
            raise StoreError(f"the upload of blob {key!r} expired before it was complete")
        return size

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
        self._delete_blob(keys=[self._blob_key(key), f"{self._ns}:blobs"], args=[f"{self._ns}:chunk:", key])

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
    def put_docs(self, docs: Iterable[tuple[str, str, Doc]]) -> None:
        encoded = [(kind, doc_id, _stored(doc)) for kind, doc_id, doc in docs]  # before any write
        with self._client.pipeline(transaction=True) as pipe:  # MULTI/EXEC: applied whole or not
            for kind, doc_id, fields in encoded:
                key = self._doc_key(kind, doc_id)
                pipe.delete(key)
                pipe.hset(key, items=_pairs(fields))
                pipe.zadd(self._index_key(kind), {doc_id: 0})
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
        held = self._client.lock(f"{self._ns}:lock:{name}", timeout=expire_s, sleep=0.2, thread_local=False)
        with self._reachable():
            held.acquire()
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
