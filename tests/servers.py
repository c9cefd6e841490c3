"""Real servers for tests: redis-server and Kiln processes on free loopback ports."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parents[1]


# The kernel's ephemeral range (Linux's default where /proc does not say): ports it hands to
# outgoing connections, so a port picked there can be taken, before the server binds it, by a
# connection the server itself opens at startup (Redis). CI lost a run to exactly that. So ports
# come from below it, above the well-known services' 1024..9999.
_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
EPHEMERAL_LOW = int(_PORT_RANGE.read_text().split()[0]) if _PORT_RANGE.exists() else 32768
_BELOW = range(10000, EPHEMERAL_LOW)
_handed_out: set[int] = set()
_ports = random.Random()  # its own, so a test that seeds `random` does not replay ports


def unwind_on_signals() -> None:
    """Ctrl-C and SIGTERM unwind the stack, so that a script's servers are stopped on the way out:
    Python's default SIGTERM ends the process with no `finally` run. SIGINT too: a background
    job starts with it ignored."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)


def free_port() -> int:
    """A loopback port that is free now, below the ephemeral range, and not handed out before;
    the kernel's own pick where that range starts too low to leave room below it."""
    for _ in range(1000 if len(_BELOW) >= 1000 else 0):
        port = _ports.choice(_BELOW)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check: object, timeout: float, what: str, interval: float = 0.1) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


class RedisServer:
    """A throwaway redis-server on a free port; `restart()` keeps its data dir (AOF on)."""

    def __init__(self, data_dir: Path) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed; `make test` installs it with apt-get")
        self.data_dir = data_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data_dir),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        wait_until(client.ping, 10, "redis-server")
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: connections still open, but no reply ever comes, as from a hung Redis."""
        assert self.proc is not None, "not running"
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None, "not running"
        self.proc.send_signal(signal.SIGCONT)


class KilnProcess:
    """`kiln serve` or `kiln worker` as a real subprocess with its own environment."""

    def __init__(self, args: list[str], env: Mapping[str, str], log: Path) -> None:
        self.args = args
        # None of the caller's KILN_* settings: an exported KILN_REDIS_URL would have a test
        # server write into the caller's Redis, and KILN_API_KEYS lock the test's client out.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        self.env = {**inherited, "PYTHONUNBUFFERED": "1", **env}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "service.cli", *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not running"
        return self.proc.pid

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def json_lines(self) -> list[dict[str, Any]]:
        """Its log's JSON lines; only child processes' stray stderr (library warnings) is not."""
        lines = self.log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


class KilnServer(KilnProcess):
    def __init__(self, env: Mapping[str, str], log: Path, workers: int = 1) -> None:
        self.port = free_port()
        args = ["serve", "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers)]
        # Its own gRPC port: two servers on Triton's default 8001 would fail to start.
        super().__init__(args, {"KILN_GRPC_PORT": str(free_port()), **env}, log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.env['KILN_GRPC_PORT']}"

    def start(self) -> None:
        super().start()
        try:
            wait_until(lambda: httpx.get(f"{self.url}/healthz").status_code == 200, 60, "kiln serve")
        except TimeoutError as exc:
            self.stop()
            raise TimeoutError(f"{exc}\n{self.tail()}") from exc
        except BaseException:  # a SIGTERM or Ctrl-C while it starts: its caller never stops it
            self.stop()
            raise


@contextmanager
def embedded_server(root: Path, **env: str) -> Iterator[KilnServer]:
    """An embedded-mode `kiln serve` (no Redis) with its data and log under `root`."""
    server = KilnServer({"KILN_DATA_DIR": str(root / "data"), **env}, root / "kiln.log")
    with running(server):
        yield server


@contextmanager
def running(*procs: KilnProcess | RedisServer) -> Iterator[None]:
    started: list[KilnProcess | RedisServer] = []
    try:
        for proc in procs:
            proc.start()
            started.append(proc)
        yield
    finally:
        for proc in reversed(started):
            proc.stop()
