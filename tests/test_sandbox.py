from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from service.sandbox import (
    CANCEL_CHECK_S,
    ChildCancelledError,
    ChildCrashedError,
    ChildFailedError,
    ChildMemoryError,
    ChildTimeoutError,
    Progress,
    SandboxError,
    run_in_child,
)

REPO = Path(__file__).resolve().parent.parent

# Functions run in the child: module-level so that spawn can import them by name.


def add(a: int, b: int, progress: Progress) -> int:
    print("hello from the child", flush=True)
    return a + b


def big_bytes(n: int, progress: Progress) -> bytes:
    return bytes(range(256)) * (n // 256)


def report_stages(stages: list[str], progress: Progress) -> str:
    for stage in stages:
        progress({"stage": stage})
    return "done"


def raise_value_error(progress: Progress) -> None:
    raise ValueError("bad input spec: 'x:float32[1,3'")


class UnpicklableError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.callback = lambda: None


class TwoArgError(Exception):
    """Pickles, but cannot be rebuilt: pickle calls cls(*args) with only the message."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def raise_unpicklable(progress: Progress) -> None:
    raise UnpicklableError("holds a lambda")


def raise_two_arg(progress: Progress) -> None:
    raise TwoArgError("needs a code", 7)


def return_lock(progress: Progress) -> Any:
    return threading.Lock()


def sleep_forever(progress: Progress) -> None:
    progress({"pid": os.getpid()})
    time.sleep(30)


def hog_memory(mb: int, progress: Progress) -> None:
    chunks = [b"x" * 2**20 for _ in range(mb)]  # b"x" * n touches every page, unlike bytes(n)
    time.sleep(30)
    del chunks


def exit_with_code(code: int, progress: Progress) -> None:
    os._exit(code)


def kill_self(signum: int, progress: Progress) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(30)


def litter(seconds: float, progress: Progress) -> tuple[str, str]:
    """Leave temporary files as torch and TVM do, then sleep: a cache nothing removes, a file
    from a program started here, and a directory that only an orderly exit removes. Returns the
    child's temp dir and that program's file."""
    Path(tempfile.mkdtemp(prefix="torchinductor_"), "cache").write_bytes(b"x")
    made = subprocess.run(["mktemp"], capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="kiln-tune-") as work:
        Path(work, "database.json").write_text("{}")
        progress({"littered": True})
        time.sleep(seconds)
    return tempfile.gettempdir(), made


def write_pid_and_sleep(path: str, progress: Progress) -> None:
    Path(path).write_text(str(os.getpid()))
    time.sleep(60)


def run(fn: Any, *args: Any, timeout_s: float = 30, memory_mb: int = 1024, **kw: Any) -> Any:
    return run_in_child(fn, args, timeout_s=timeout_s, memory_mb=memory_mb, **kw)


def test_returns_value_and_keeps_child_output(capfd: pytest.CaptureFixture[str]) -> None:
    assert run(add, 2, 3) == 5
    assert "hello from the child" in capfd.readouterr().out


def test_returns_large_result() -> None:
    n = 20 * 2**20
    result = run(big_bytes, n)
    assert len(result) == n
    assert result == bytes(range(256)) * (n // 256)


def test_progress_events_arrive_in_order() -> None:
    events: list[dict[str, Any]] = []
    stages = ["loading", "compiling", "verifying", "benchmarking"] * 50
    assert run(report_stages, stages, on_progress=events.append) == "done"
    assert events == [{"stage": s} for s in stages]


def test_exception_comes_back_as_itself() -> None:
    with pytest.raises(ValueError, match=r"bad input spec: 'x:float32\[1,3'") as info:
        run(raise_value_error)
    assert type(info.value) is ValueError
    assert any("raise_value_error" in note for note in info.value.__notes__)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (raise_unpicklable, "UnpicklableError: holds a lambda"),
        (raise_two_arg, "TwoArgError: needs a code"),
    ],
)
def test_unpicklable_exception_becomes_child_failed(fn: Any, message: str) -> None:
    with pytest.raises(ChildFailedError) as info:
        run(fn)
    assert str(info.value) == message


def test_unpicklable_result_raises() -> None:
    with pytest.raises(TypeError, match=r"cannot pickle '_thread\.lock' object"):
        run(return_lock)


def test_timeout_kills_child() -> None:
    events: list[dict[str, Any]] = []
    start = time.monotonic()
    with pytest.raises(ChildTimeoutError, match=r"^timed out after 1 s$"):
        run(sleep_forever, timeout_s=1, on_progress=events.append)
    assert time.monotonic() - start < 3
    assert len(events) == 1, "the child started and reported its pid"
    assert not psutil.pid_exists(events[0]["pid"])


def test_cancel_kills_child() -> None:
    events: list[dict[str, Any]] = []
    start = time.monotonic()
    with pytest.raises(ChildCancelledError, match=r"^cancelled$"):
        run(sleep_forever, on_progress=events.append, cancelled=lambda: bool(events))
    assert time.monotonic() - start < 2 * CANCEL_CHECK_S + 3
    assert len(events) == 1, "the child started and reported its pid"
    assert not psutil.pid_exists(events[0]["pid"])


@pytest.fixture
def parent_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The parent's temp dir, which a child without one of its own would use as well."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_killed_child_leaves_no_temp_files(parent_tmp: Path) -> None:
    events: list[dict[str, Any]] = []
    with pytest.raises(ChildTimeoutError):
        run(litter, 30, timeout_s=5, on_progress=events.append)
    assert events == [{"littered": True}]
    assert sorted(p.name for p in parent_tmp.iterdir()) == []


def test_child_temp_dir_is_its_own_and_goes_with_it(parent_tmp: Path) -> None:
    child_tmp, made = run(litter, 0)
    assert sorted(p.name for p in parent_tmp.iterdir()) == []
    assert Path(child_tmp).parent == parent_tmp
    assert Path(made).parent == Path(child_tmp), "programs the child starts use its temp dir"


def test_memory_limit_kills_child() -> None:
    start = time.monotonic()
    with pytest.raises(ChildMemoryError, match=r"^used more than 200 MB of memory$"):
        run(hog_memory, 600, memory_mb=200)
    assert time.monotonic() - start < 20, "killed while hogging, not by the 30 s timeout"


@pytest.mark.parametrize(
    ("fn", "arg", "message"),
    [
        (exit_with_code, 3, "the child process exited with code 3 without answering"),
        (kill_self, signal.SIGSEGV, "the child process crashed with signal SIGSEGV"),
        (kill_self, signal.SIGKILL, "the child process crashed with signal SIGKILL"),
    ],
)
def test_crash_is_reported(fn: Any, arg: int, message: str) -> None:
    with pytest.raises(ChildCrashedError) as info:
        run(fn, arg)
    assert str(info.value) == message
    assert isinstance(info.value, SandboxError)


def _gone(pid: int) -> bool:
    # Our container's init may not reap orphans, so a dead process can linger as a zombie.
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _assert_dies_with_parent(script: str, pid_file: Path) -> None:
    """Run `script` as the parent of a process that writes its pid; SIGKILL the parent."""
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert _wait_for(lambda: pid_file.exists() and pid_file.read_text(), 20)
        child = int(pid_file.read_text())
        assert psutil.Process(child).ppid() == parent.pid
        assert not _gone(child)
        parent.kill()
        parent.wait()
        assert _wait_for(lambda: _gone(child), 5), "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()


def test_child_dies_with_its_parent(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"""
        from service.sandbox import run_in_child
        from tests.test_sandbox import write_pid_and_sleep
        run_in_child(write_pid_and_sleep, ({str(pid_file)!r},), timeout_s=60, memory_mb=1024)
    """
    _assert_dies_with_parent(script, pid_file)


def test_watchdog_fallback_kills_orphan(tmp_path: Path) -> None:
    """The watchdog used where prctl(PR_SET_PDEATHSIG) is unavailable."""
    pid_file = tmp_path / "pid"
    child = f"""
        import os, signal, threading, time
        from service.sandbox import _watch_parent
        threading.Thread(target=_watch_parent, args=(os.getppid(), signal.SIGKILL), daemon=True).start()
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
    """
    script = f"""
        import subprocess, sys
        subprocess.run([sys.executable, "-c", {textwrap.dedent(child)!r}])
    """
    _assert_dies_with_parent(script, pid_file)


def sleep_then(seconds: float, progress: Progress) -> str:
    progress({"started": True})
    time.sleep(seconds)
    return "finished"


def test_ctrl_c_in_the_server_s_terminal_does_not_reach_its_children(tmp_path: Path) -> None:
    """A terminal's Ctrl-C signals its whole foreground group: it killed the upload checks and
    compiles that the server's graceful stop then waited for (an upload got a 400, "could not be
    validated", and a compile was failed for good)."""
    out = tmp_path / "out"
    script = f"""
        import signal
        from pathlib import Path
        from service.sandbox import run_in_child
        from tests.test_sandbox import sleep_then
        signal.signal(signal.SIGINT, lambda *_: None)  # the server, draining: a handler of its own
        answer = run_in_child(sleep_then, (3.0,), timeout_s=60, memory_mb=1024,
                              on_progress=lambda e: Path({str(tmp_path / "started")!r}).touch())
        Path({str(out)!r}).write_text(answer)
    """
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,  # its own group, as a terminal's foreground job
    )
    try:
        assert _wait_for(lambda: (tmp_path / "started").exists(), 30)
        os.killpg(parent.pid, signal.SIGINT)
        assert parent.wait(30) == 0
        assert out.read_text() == "finished"
    finally:
        parent.kill()
        parent.wait()
