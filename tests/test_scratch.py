"""Scratch space on the temporary disk: what a dead process left is removed, what a live one
holds is not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from service import scratch
from tests.servers import embedded_server

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def killed_mid_work(tmp: Path) -> list[Path]:
    """A process that made a scratch directory and file, SIGKILLed as it used them (as uvicorn's
    re-raised SIGTERM ends a server before any `finally` runs); what it left, made old."""
    script = """
        import sys, time
        from service.scratch import scratch_dir, scratch_file
        with scratch_dir() as folder, scratch_file() as upload:
            upload.write(b"model bytes")
            print(folder, upload.name, flush=True)
            time.sleep(60)
    """
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    left = [Path(p) for p in child.stdout.readline().split()]
    child.send_signal(signal.SIGKILL)
    child.wait()
    old = time.time() - 60
    for path in left:
        os.utime(path, (old, old))
    return left


def test_what_a_dead_process_left_is_swept_and_what_a_live_one_holds_is_not(tmp: Path) -> None:
    left = killed_mid_work(tmp)
    assert all(p.exists() and p.parent == tmp for p in left)
    with scratch.scratch_dir() as mine, scratch.scratch_file() as upload:
        old = time.time() - 60
        for path in (Path(mine), Path(upload.name)):
            os.utime(path, (old, old))
        assert scratch.sweep() == 2
        assert sorted(tmp.iterdir()) == sorted([Path(mine), Path(upload.name)])
    assert list(tmp.iterdir()) == []


def test_a_server_sweeps_as_it_starts(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    killed_mid_work(tmp)
    with embedded_server(tmp_path, TMPDIR=str(tmp)):
        assert list(tmp.iterdir()) == []
