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
        return RedisStore(settings.redis_url)
    return LocalStore(settings.data_dir)
