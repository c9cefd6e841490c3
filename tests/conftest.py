from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import KilnServer, RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on the shared test redis-server."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    yield redis_server.url
    client.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "kiln-data"


@pytest.fixture(scope="module")
def http(server: KilnServer) -> Iterator[httpx.Client]:
    """A client for the `server` fixture of the requesting test module."""
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
