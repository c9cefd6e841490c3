"""Triton's system shared-memory extension: tensors passed through POSIX shared memory.

A client on the same host registers a region (a shm_open segment, a byte range of it) under a
name, then names it in place of a tensor's data: the server reads inputs from it and writes
outputs into it, and the request body carries only the JSON header. Registrations live in the
store, under this host and boot, so that every worker process of a `kiln serve` sees them (a
register call reaches one of them), while replicas on other hosts, whose /dev/shm is not this
one, and this host after a reboot, do not.

A registration records the segment's identity (device and inode) as well as its name: a segment
that was removed and created again under the same name, or a /dev/shm that is not the one it was
registered in, is refused rather than written. An output's region is looked up with its
request, so the write goes to the segment registered then, even if the name is registered anew
while the model runs. Each access opens the segment and uses pread/pwrite rather than keeping it
mapped: a client that shrinks its segment gets a short read and a 400, where a mapping would have
crashed the server with SIGBUS.

Off unless KILN_SHARED_MEMORY is set: a region gives the server's access to a segment of the
host, so registering one needs an admin key.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from service.errors import AlreadyExistsError, BadRequestError, NotFoundError
from service.store import Doc, Store
from service.tensors import SharedSlice

log = logging.getLogger("kiln.shared_memory")
T = TypeVar("T")
KIND = "shm_region"
SHM_DIR = Path("/dev/shm")
# shm_open names: one leading slash, then a file name in /dev/shm.
KEY = re.compile(r"/[A-Za-z0-9_-][A-Za-z0-9._-]{0,249}")
OFF = "system shared memory is off on this server; start it with KILN_SHARED_MEMORY=true"
# Linux moves at most 0x7ffff000 bytes per read or write call.
CHUNK_BYTES = 1 << 30
# No symlinks out of /dev/shm, and no open that waits (a FIFO put in a segment's place).
OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Region(BaseModel):
    """A registered region, as the extension's status reports it."""

    name: str
    key: str
    offset: int
    byte_size: int


class Registration(Region):
    """A region as stored: with the identity of the segment it was registered on."""

    device: int
    inode: int


class SharedMemory:
    """The regions of this host (a service.tensors.SharedAccess)."""

    def __init__(self, store: Store, enabled: bool, host: str | None = None) -> None:
        self.store = store
        self.enabled = enabled
        self._prefix = f"{host or _this_host()}/"

    def _check_on(self) -> None:
        if not self.enabled:
            raise BadRequestError(OFF)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_on()
        if not name:
            raise BadRequestError("a region needs a name")
        if not KEY.fullmatch(key):
            raise BadRequestError(
                f"key must be a shm_open name such as '/input0' (a slash, then a file name); got {key!r}"
            )
        if offset < 0 or byte_size <= 0:
            raise BadRequestError("offset must be 0 or more, and byte_size more than 0")
        with _opened(key, os.O_RDWR) as (_, info):  # the server must be able to write outputs there
            size, device, inode = info.st_size, info.st_dev, info.st_ino
        if offset + byte_size > size:
            raise BadRequestError(
                f"region {name!r}: offset {offset} + byte_size {byte_size} runs past the end of "
                f"segment {key!r}, which is {size} bytes"
            )
        record = Registration(
            name=name, key=key, offset=offset, byte_size=byte_size, device=device, inode=inode
        )
        if not self.store.create_doc(KIND, self._prefix + name, record.model_dump()):
            raise AlreadyExistsError(
                f"shared memory region {name!r} is registered already; unregister it first"
            )

    def unregister(self, name: str | None = None) -> None:
        """One region, or every region of this host; an unknown name is no error, as in Triton."""
        self._check_on()
        # All: by the stored names, so that a record an older Kiln stored goes too.
        names = [name] if name is not None else [doc.get("name") for doc in self._stored()]
        for each in names:
            if isinstance(each, str):
                self.store.delete_doc(KIND, self._prefix + each)

    def status(self, name: str | None = None) -> list[Region]:
        self._check_on()
        records = [self._registration(name)] if name is not None else self._registrations()
        return [Region.model_validate(r.model_dump()) for r in records]

    def _stored(self) -> list[Doc]:
        return self.store.list_docs(KIND, self._prefix)

    def _registrations(self) -> list[Registration]:
        records = (self._valid(doc) for doc in self._stored())
        return sorted((r for r in records if r is not None), key=lambda r: r.name)

    def _registration(self, name: str) -> Registration:
        doc = self.store.get_doc(KIND, self._prefix + name)
        record = None if doc is None else self._valid(doc)
        if record is None:  # Triton's NOT_FOUND
            raise NotFoundError(f"no shared memory region {name!r} is registered; register it first")
        return record

    def _valid(self, doc: Doc) -> Registration | None:
        """The stored registration; None for one an older Kiln stored (without the segment's
        identity, which every access checks): it is deleted, so it is logged once."""
        try:
            return Registration.model_validate(doc)
        except ValidationError as exc:
            name = doc.get("name")
            log.warning(
                "dropped shared memory region %r, whose stored record is not valid (an older "
                "Kiln's); register it again: %s",
                name,
                exc,
            )
            if isinstance(name, str):
                self.store.delete_doc(KIND, self._prefix + name)
            return None

    def bind(self, where: SharedSlice, what: str) -> SharedSlice:
        """The slice with its region looked up now, and its range checked against it."""
        self._check_on()
        record = self._registration(where.region)
        if where.offset + where.byte_size > record.byte_size:
            raise BadRequestError(
                f"{what}: offset {where.offset} + {where.byte_size} bytes runs past the end of "
                f"shared memory region {where.region!r}, which is {record.byte_size} bytes"
            )
        return dataclasses.replace(where, segment=record)

    def read(self, where: SharedSlice, what: str) -> bytes:
        where = self.bind(where, what)
        record = _bound(where)
        at = record.offset + where.offset
        end = at + where.byte_size
        chunks = []
        with _segment(record, os.O_RDONLY, what) as fd:
            while at < end:
                want = min(CHUNK_BYTES, end - at)
                chunk = _io(what, os.pread, fd, want, at)
                if len(chunk) < want:
                    raise BadRequestError(_shrunk(what, record))
                chunks.append(chunk)
                at += want
        return b"".join(chunks)

    def write(self, where: SharedSlice, data: bytes, what: str) -> None:
        """An output's bytes, into the segment its slice was bound to (`bind`)."""
        record = _bound(where)
        start = record.offset + where.offset
        view = memoryview(data)
        with _segment(record, os.O_RDWR, what) as fd:
            if os.fstat(fd).st_size < start + len(view):  # pwrite would grow the client's segment
                raise BadRequestError(_shrunk(what, record))
            done = 0
            while done < len(view):
                done += _io(what, os.pwrite, fd, view[done : done + CHUNK_BYTES], start + done)


def _bound(where: SharedSlice) -> Registration:
    if not isinstance(where.segment, Registration):
        raise TypeError(f"shared memory slice of region {where.region!r} used before it was bound")
    return where.segment


def _io(what: str, call: Callable[..., T], *args: Any) -> T:
    """A read or write of a segment: what the OS refuses (a full /dev/shm, say) is the client's 400."""
    try:
        return call(*args)
    except OSError as exc:
        raise BadRequestError(f"{what}: shared memory: {exc.strerror}") from None


def _shrunk(what: str, record: Registration) -> str:
    return f"{what}: segment {record.key!r} of region {record.name!r} is shorter than when it was registered"


@contextmanager
def _segment(record: Registration, flags: int, what: str) -> Iterator[int]:
    """The registered segment's file descriptor, if the file at its key is still that segment."""
    with _opened(record.key, flags) as (fd, info):
        if (info.st_dev, info.st_ino) != (record.device, record.inode):
            raise BadRequestError(
                f"{what}: segment {record.key!r} is not the one region {record.name!r} was registered "
                "on (it was removed and created again); register the region again"
            )
        yield fd


@contextmanager
def _opened(key: str, flags: int) -> Iterator[tuple[int, os.stat_result]]:
    """A regular file in /dev/shm, opened, with its status; closed on exit."""
    try:
        fd = os.open(SHM_DIR / key[1:], flags | OPEN_FLAGS)
    except OSError as exc:
        raise BadRequestError(f"cannot open shared memory segment {key!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadRequestError(f"shared memory segment {key!r} is not a shm_open segment")
        yield fd, info
    finally:
        os.close(fd)


def _this_host() -> str:
    """This host and boot: registrations made before a reboot name segments that are gone."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"
