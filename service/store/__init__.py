"""Bytes and metadata: `open_store` picks Redis when configured, local disk otherwise."""

from __future__ import annotations

from service.settings import Settings
from service.store.base import (
    BlobNotFoundError,
    Doc,
    Store,
    StoreError,
    StoreUnavailableError,
)
from service.store.local import LocalStore
from service.store.redis import RedisStore

__all__ = [
    "BlobNotFoundError",
    "Doc",
    "LocalStore",
    "RedisStore",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "open_store",
]


def open_store(settings: Settings) -> Store:
    if settings.redis_url:
        # The deployment's namespace, as its queues': two deployments on one Redis shared one
        # store, and each one's redelivery compiled the other's jobs again.
        return RedisStore(settings.redis_url, settings.queue_namespace)
    return LocalStore(settings.data_dir)
