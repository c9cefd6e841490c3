"""`make loadtest` in small: 10 users for 20 s against a live server on 127.0.0.1, zero errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from loadtest.run import run_loadtest

pytestmark = pytest.mark.timeout(300)


def test_bounded_run_has_no_errors_and_writes_its_report(tmp_path: Path) -> None:
    # `auto`: /v2 infer is in the mix exactly when the server serves /v2/models/{name}.
    code = run_loadtest(tmp_path, users=10, spawn_rate=5, run_time="20s", v2="auto")
    with (tmp_path / "locust_stats.csv").open() as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    failed = {name: row["Failure Count"] for name, row in rows.items() if row["Failure Count"] != "0"}
    assert code == 0 and not failed, f"failures {failed}; see {tmp_path}"
    assert {"/v1/models/[name]/predict", "/v1/models/[name]"} <= rows.keys()
    assert int(rows["Aggregated"]["Request Count"]) > 100
    summary = (tmp_path / "locust_summary.md").read_text()
    assert "| POST | /v1/models/[name]/predict |" in summary
