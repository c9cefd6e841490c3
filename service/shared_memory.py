"""Triton's system shared-memory extension: tensors passed through POSIX shared memory.

A client on the same host registers a region (a shm_open segment, a byte range of it) under a
name, then names it in place of a tensor's data: the server reads inputs from it and writes
outputs into it, and the request body carries only the JSON header. Registrations live in the
store, one record per host and name, so that every worker process of a `kiln serve` sees them
(a register call reaches one of them), while replicas on other hosts, whose /dev/shm is not this
one, do not.

Each access opens the segment and reads or writes it with pread/pwrite rather than keeping it
mapped: a client that shrinks or replaces its segment then gets a short read and a 400, where a
mapping would have crashed the server with SIGBUS or read the old memory.

Off unless KILN_SHARED_MEMORY is set: a region gives the server's access to any segment of the
host, so registering one needs an admin key.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel

from service.errors import BadRequestError
from service.store import Store
from service.tensors import SharedSlice

KIND = "shm_region"
SHM_DIR = Path("/dev/shm")
# shm_open names: one leading slash, then a file name in /dev/shm.
KEY = re.compile(r"/[A-Za-z0-9._-]{1,250}")
OFF = "system shared memory is off on this server; start it with KILN_SHARED_MEMORY=true"


class Region(BaseModel):
    """A registered region, as the extension's status reports it."""

    name: str
    key: str
    offset: int
    byte_size: int


class SharedMemory:
    def __init__(self, store: Store, enabled: bool, host: str | None = None) -> None:
        self.store = store
        self.enabled = enabled
        self._prefix = f"{host or socket.gethostname()}/"

    def _check_on(self) -> None:
        if not self.enabled:
            raise BadRequestError(OFF)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_on()
        if not KEY.fullmatch(key):
            raise BadRequestError(
                f"key must be a shm_open name such as '/input0' (a slash, then a file name); got {key!r}"
            )
        if offset < 0 or byte_size <= 0:
            raise BadRequestError("offset must be 0 or more, and byte_size more than 0")
        if self.store.get_doc(KIND, self._prefix + name) is not None:
            raise BadRequestError(f"shared memory region {name!r} is registered already; unregister it first")
        with _opened(key, os.O_RDWR) as fd:  # the server must be able to write its outputs there
            size = os.fstat(fd).st_size
        if offset + byte_size > size:
            raise BadRequestError(
                f"region {name!r}: offset {offset} + byte_size {byte_size} runs past the end of "
                f"segment {key!r}, which is {size} bytes"
            )
        region = Region(name=name, key=key, offset=offset, byte_size=byte_size)
        if not self.store.create_doc(KIND, self._prefix + name, region.model_dump()):
            raise BadRequestError(f"shared memory region {name!r} is registered already; unregister it first")

    def unregister(self, name: str | None = None) -> None:
        """One region, or every region of this host; an unknown name is no error, as in Triton."""
        self._check_on()
        names = [name] if name is not None else [r.name for r in self.status()]
        for each in names:
            self.store.delete_doc(KIND, self._prefix + each)

    def status(self, name: str | None = None) -> list[Region]:
        self._check_on()
        if name is not None:
            return [self._region(name)]
        docs = self.store.list_docs(KIND, self._prefix)
        return sorted((Region.model_validate(doc) for doc in docs), key=lambda r: r.name)

    def _region(self, name: str) -> Region:
        doc = self.store.get_doc(KIND, self._prefix + name)
        if doc is None:
            raise BadRequestError(f"no shared memory region {name!r} is registered; register it first")
        return Region.model_validate(doc)

    def _span(self, name: str, offset: int, size: int, what: str) -> tuple[Region, int]:
        """The region, and where in its segment `size` bytes at `offset` into it begin."""
        self._check_on()
        region = self._region(name)
        if offset < 0 or size < 0 or offset + size > region.byte_size:
            raise BadRequestError(
                f"{what}: offset {offset} + {size} bytes runs past the end of shared memory "
                f"region {name!r}, which is {region.byte_size} bytes"
            )
        return region, region.offset + offset

    def read(self, where: SharedSlice, what: str) -> bytes:
        """A tensor's bytes (a service.tensors.SharedReader)."""
        region, start = self._span(where.region, where.offset, where.byte_size, what)
        with _opened(region.key, os.O_RDONLY) as fd:
            data = os.pread(fd, where.byte_size, start)
        if len(data) != where.byte_size:
            raise BadRequestError(_shrunk(what, region))
        return data

    def write(self, where: SharedSlice, data: bytes, what: str) -> None:
        """An output's bytes (a service.tensors.SharedWriter)."""
        region, start = self._span(where.region, where.offset, len(data), what)
        with _opened(region.key, os.O_RDWR) as fd:
            if os.fstat(fd).st_size < start + len(data):  # pwrite would grow the client's segment
                raise BadRequestError(_shrunk(what, region))
            os.pwrite(fd, data, start)


def _shrunk(what: str, region: Region) -> str:
    return f"{what}: segment {region.key!r} of region {region.name!r} is shorter than when it was registered"


@contextmanager
def _opened(key: str, flags: int) -> Iterator[int]:
    """The segment's file descriptor, closed on exit."""
    try:
        fd = os.open(SHM_DIR / key[1:], flags)
    except OSError as exc:
        raise BadRequestError(f"cannot open shared memory segment {key!r}: {exc.strerror}") from None
    try:
        yield fd
    finally:
        os.close(fd)
