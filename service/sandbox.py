"""Run a function in a fresh child process with a time limit and a memory limit.

Upload validation and compiles both go through `run_in_child`: a model that crashes,
hangs or eats memory takes down only its child, never the API or the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

import psutil

from service.logs import LogSetup, capture_strays
from service.scratch import scratch_dir

T = TypeVar("T")
Progress = Callable[[dict[str, Any]], None]

_POLL_S = 0.2
# How often `cancelled` is asked while a child runs: it may read a store.
CANCEL_CHECK_S = 2.0
# How long a child that has sent its answer gets to exit before it is killed.
_EXIT_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1


class SandboxError(Exception):
    """The child process failed in a way that is not an exception raised by the function."""


class ChildTimeoutError(SandboxError):
    pass


class ChildMemoryError(SandboxError):
    pass


class ChildCrashedError(SandboxError):
    pass


class ChildFailedError(SandboxError):
    """The function raised an exception that cannot be sent back as itself."""


class ChildCancelledError(SandboxError):
    """The caller's `cancelled` said the work was no longer wanted."""


def run_in_child(
    fn: Callable[..., T],
    args: tuple[Any, ...],
    *,
    timeout_s: float,
    memory_mb: int,
    on_progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> T:
    """Return `fn(*args, progress)` computed in a spawned child process.

    `fn` must be a module-level function. Events it passes to `progress` reach
    `on_progress` here, in order. Its exceptions are re-raised here as themselves when
    they pickle, as `ChildFailedError` otherwise; the child's traceback is attached as a note.
    `cancelled` is asked every CANCEL_CHECK_S; once it says True the child is killed and
    `ChildCancelledError` raised. The child's temporary files go with it, however it ends.
    """
    # Pickled here so an unpicklable fn fails in the caller, and unpickled in the child
    # only after it is tied to our life: importing fn's module may take seconds.
    payload = pickle.dumps((fn, args))
    # The child's TMPDIR, removed here: a killed child never runs its own cleanups, and torch
    # and TVM leave caches and scratch files behind even when it returns.
    with scratch_dir() as tmp:
        reader, writer = multiprocessing.Pipe(duplex=False)
        # Never fork: the parent has threads and torch/TVM state that a fork would copy broken.
        proc = multiprocessing.get_context("spawn").Process(
            target=_child_main, args=(writer, payload, os.getpid(), tmp, LogSetup.current())
        )
        try:
            proc.start()
            writer.close()  # so the reader sees EOF when the child dies
            answer = _wait(proc, reader, timeout_s, memory_mb, on_progress, cancelled)
            proc.join(_EXIT_GRACE_S)
        finally:
            # An exit code means the child is reaped and its pid may already be reused.
            if proc.pid is not None and proc.exitcode is None:
                _kill_tree(proc.pid)
                proc.join()
            proc.close()
            reader.close()
            writer.close()
    if answer[0] == "ok":
        return answer[1]
    _, exc_bytes, description, child_traceback = answer
    exc: BaseException = ChildFailedError(description)
    if exc_bytes is not None:
        with contextlib.suppress(Exception):  # its class may not rebuild from its args
            exc = pickle.loads(exc_bytes)
    exc.add_note(f"Traceback in the child process:\n{child_traceback}")
    raise exc


def _wait(
    proc: BaseProcess,
    reader: Connection,
    timeout_s: float,
    memory_mb: int,
    on_progress: Progress | None,
    cancelled: Callable[[], bool] | None,
) -> tuple[Any, ...]:
    """Relay progress until the child answers; raise if it times out, bloats, dies or is
    cancelled."""
    pid = proc.pid
    assert pid is not None, "the child has been started"
    deadline = time.monotonic() + timeout_s
    next_memory_check = 0.0
    next_cancel_check = time.monotonic() + CANCEL_CHECK_S
    while (remaining := deadline - time.monotonic()) > 0:
        # Reading while we wait: a child sending a large answer blocks until it is read.
        if reader.poll(min(_POLL_S, remaining)):
            try:
                message = pickle.loads(reader.recv_bytes())
            except EOFError:
                proc.join(_EXIT_GRACE_S)
                raise ChildCrashedError(_death_reason(proc.exitcode)) from None
            if message[0] != "progress":
                return tuple(message)
            if on_progress is not None:
                on_progress(message[1])
        # A grandchild may hold the pipe open, so the lack of EOF does not mean it lives.
        elif not proc.is_alive() and not reader.poll():
            raise ChildCrashedError(_death_reason(proc.exitcode))
        if time.monotonic() >= next_memory_check:
            next_memory_check = time.monotonic() + _POLL_S
            if _rss_bytes(pid) > memory_mb * 2**20:
                raise ChildMemoryError(f"used more than {memory_mb} MB of memory")
        if cancelled is not None and time.monotonic() >= next_cancel_check:
            if cancelled():
                raise ChildCancelledError("cancelled")
            next_cancel_check = time.monotonic() + CANCEL_CHECK_S
    raise ChildTimeoutError(f"timed out after {timeout_s:g} s")


def _death_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "the child process closed its pipe without answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        return f"the child process crashed with signal {name}"
    return f"the child process exited with code {exitcode} without answering"


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _rss_bytes(pid: int) -> int:
    # RSS, not RLIMIT_AS: torch and TVM reserve far more address space than they touch.
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def _kill_tree(pid: int) -> None:
    # Collect descendants before killing: once the child is dead they are reparented
    # and can no longer be found from its pid.
    for p in _tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _child_main(writer: Connection, payload: bytes, parent_pid: int, tmp: str, logs: LogSetup | None) -> None:
    # Out of the parent's process group: Ctrl-C in the server's terminal signals the whole group,
    # and killed the compiles and upload checks that a graceful stop lets finish (an upload got a
    # 400, "could not be validated", and a compile was failed for good).
    os.setsid()
    die_with_parent(parent_pid, signal.SIGKILL)
    # Before fn's module is imported and run: Python code reads tempfile's cache, and the
    # processes that torch and TVM start (compilers, tuning workers) inherit the variable.
    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = tmp
    if logs is not None:  # a spawned child starts with Python's bare stderr lines
        logs.apply()
    lock = threading.Lock()  # fn may report progress from several threads

    def send(message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message)
        with lock:
            writer.send_bytes(data)

    def progress(event: dict[str, Any]) -> None:
        send(("progress", event))

    try:
        fn, args = pickle.loads(payload)
        if logs is not None:  # the import of fn's module brought torch's own handlers
            capture_strays()
        answer: tuple[Any, ...] = ("ok", fn(*args, progress))
        send(answer)
    except Exception as exc:  # includes an answer that does not pickle
        description = f"{type(exc).__name__}: {exc}"
        send(("error", _pickle_or_none(exc), description, traceback.format_exc()))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: it is slow with torch loaded, runs native destructors
    # that can crash, and waits forever on any non-daemon thread fn left behind.
    os._exit(0)


def _pickle_or_none(exc: BaseException) -> bytes | None:
    try:
        return pickle.dumps(exc)
    except Exception:
        return None


# Not a setting: how `kiln serve --workers N` names itself to its worker processes, which then
# die with it (create_app).
SUPERVISOR_PID = "KILN_SUPERVISOR_PID"


def die_with_parent(parent_pid: int, sig: signal.Signals) -> None:
    """Have the kernel (else a watchdog thread) send this process `sig` when its parent dies.

    Without this a SIGKILLed worker would leave its compile running, unsupervised, and a SIGKILLed
    `kiln serve --workers N` its workers serving, holding its port.
    """
    armed = False
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent_pid, sig), daemon=True).start()
    # The parent may have died before the line above took effect.
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def _watch_parent(parent_pid: int, sig: signal.Signals) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os.kill(os.getpid(), sig)
