"""`make loadtest`: a bounded headless locust run against a fresh embedded `kiln serve`.

The server binds 127.0.0.1 on a free port with its own data directory and compiles nothing;
the report (locust's CSVs and summary.md) goes to loadtest/reports/<timestamp>/.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.servers import ROOT, KilnServer, running, unwind_on_signals

LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
REPORTS = ROOT / "loadtest" / "reports"


def run_loadtest(
    out: Path, users: int = 10, spawn_rate: int = 5, run_time: str = "20s", v2: str = "auto"
) -> int:
    """Serve, load, stop; returns locust's exit code (non-zero on any failed request)."""
    out.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(16)  # keyed, as a server should be: the locustfile sends it
    with tempfile.TemporaryDirectory(prefix="kiln-loadtest-") as data:
        server = KilnServer(
            {"KILN_DATA_DIR": data, "KILN_DEFAULT_BACKENDS": "[]", "KILN_API_KEYS": f"{key}:admin"},
            out / "kiln.log",
        )
        with running(server):
            locust = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "locust",
                    "--locustfile",
                    str(LOCUSTFILE),
                    "--host",
                    server.url,
                    "--headless",
                    "--users",
                    str(users),
                    "--spawn-rate",
                    str(spawn_rate),
                    "--run-time",
                    run_time,
                    "--stop-timeout",
                    "5",
                    "--only-summary",
                    "--csv",
                    str(out / "locust"),
                    "--kiln-v2",
                    v2,
                ],
                cwd=ROOT,
                # The locustfile imports tests.models; locust puts only its own folder on sys.path.
                env={**os.environ, "PYTHONPATH": str(ROOT), "KILN_API_KEY": key},
            )
    return locust.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--spawn-rate", type=int, default=5)
    parser.add_argument("--run-time", default="20s")
    parser.add_argument("--v2", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--out", type=Path, help="report folder (default: a new timestamped one)")
    args = parser.parse_args(argv)
    unwind_on_signals()
    # Absolute: locust runs from the repository's root, and the server's log is written from here.
    out = (args.out or REPORTS / time.strftime("%Y%m%d-%H%M%S")).resolve()
    code = run_loadtest(out, args.users, args.spawn_rate, args.run_time, args.v2)
    print(f"report: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
