"""The Store protocol: blobs (models, artifacts) and JSON documents (metadata).

Two implementations pass the same contract tests: Redis for deployments, and a local
directory plus SQLite for the embedded default.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

Doc = dict[str, Any]


class StoreError(Exception):
    """Base class for store errors."""


class StoreUnavailableError(StoreError):
    """The backing service (Redis) cannot be reached. The API answers 503."""


class BlobNotFoundError(StoreError, KeyError):
    """No blob under that key."""


class Store(Protocol):
    def ping(self) -> None:
        """Raise StoreUnavailableError unless the store answers."""
        ...

    # Blobs: written whole or not at all; a reader never sees a partial blob. A write that fails
    # leaves nothing of itself behind.
    def put_blob(self, key: str, chunks: Iterable[bytes], expire_s: float | None = None) -> int:
        """Store the concatenated chunks under `key`; return the size in bytes.

        With `expire_s`, for keys that name their bytes (a hash): the blob is pending, and goes
        once `expire_s` has passed unless kept first (keep_blob, put_docs); a blob already under
        the key, kept or pending, stays as it is. Gone means: at once on Redis; on disk, at the
        next put_blob or opening of the store. A pending blob is not listed until kept."""
        ...

    def keep_blob(self, key: str) -> bool:
        """Make a pending blob permanent; whether a blob (kept now) is under `key`."""
        ...

    def discard_blob(self, key: str) -> None:
        """Delete the blob if it is pending: a kept one stays. A cleanup on a failure's way out:
        it raises nothing, and on Redis it is done in the background, tried again for a minute
        while Redis does not answer (the blob's expiry backs it)."""
        ...

    def get_blob(self, key: str) -> bytes:
        """Raise BlobNotFoundError when absent."""
        ...

    def iter_blob(self, key: str) -> Iterator[bytes]:
        """The blob in chunks. Raise BlobNotFoundError when absent."""
        ...

    def has_blob(self, key: str) -> bool: ...

    def delete_blob(self, key: str) -> None:
        """Delete if present."""
        ...

    def list_blobs(self, prefix: str = "") -> list[str]: ...

    # Documents: flat JSON objects in named collections (`kind`), addressed by id.
    def get_doc(self, kind: str, doc_id: str) -> Doc | None: ...

    def put_doc(self, kind: str, doc_id: str, doc: Doc) -> None:
        """Create or replace the whole document."""
        ...

    def put_docs(self, docs: Iterable[tuple[str, str, Doc]], keep_blobs: Iterable[str] = ()) -> None:
        """put_doc of each (kind, id, document), and keep_blob of each of `keep_blobs` there, in
        one atomic write: readers see all of them or none, and a failure (the store's, the
        process's death) leaves none written."""
        ...

    def create_doc(self, kind: str, doc_id: str, doc: Doc) -> bool:
        """Create only if absent, atomically. Return False when it already existed."""
        ...

    def update_doc(self, kind: str, doc_id: str, fields: Doc) -> None:
        """Set some top-level fields atomically, leaving the others. Concurrent updates of
        different fields never lose each other. No-op when the document does not exist."""
        ...

    def delete_doc(self, kind: str, doc_id: str) -> None:
        """Delete if present."""
        ...

    def list_docs(self, kind: str, prefix: str = "") -> list[Doc]:
        """All documents of a kind whose id starts with `prefix`, in id order."""
        ...

    def next_id(self, counter: str) -> int:
        """Atomically increment and return a named counter, starting at 1."""
        ...

    def lock(self, name: str, expire_s: float) -> AbstractContextManager[None]:
        """Held by one process of the deployment (Redis) or the data dir (local) at a time,
        waited for. A holder that dies gives it up: a local one at once, a Redis one within
        `expire_s` (renewed while it is held)."""
        ...

    def close(self) -> None: ...
