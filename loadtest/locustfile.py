"""Load on one Kiln server at 127.0.0.1: predictions (native /v1 and, when served, /v2 infer) and
metadata reads of one small model, uploaded once when the test starts.

`make loadtest` runs it against a fresh embedded server (see loadtest/run.py). By hand, from the
repository root (it imports tests.models for the model):

    PYTHONPATH=. locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --headless -u 10 -r 5 -t 20s

With `KILN_API_KEY` set (as for the CLI: an admin key, which the upload needs) every request
carries it. `--kiln-v2 auto` (the default) adds /v2 infer to the mix only when the server answers
GET /v2/models/{name}. With `--csv PREFIX`, PREFIX_summary.md gets requests/s, p50/p95/p99 and
errors per endpoint.
"""

from __future__ import annotations

import json
import os
import time
from argparse import ArgumentParser
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
from locust import HttpUser, between, events, task
from locust.clients import ResponseContextManager
from locust.env import Environment
from locust.exception import RescheduleTaskImmediately, StopTest

ALLOWED_HOST = "127.0.0.1"
KEY = os.environ.get("KILN_API_KEY")
HEADERS = {"Authorization": f"Bearer {KEY}"} if KEY else {}
MODEL = "loadtest-mlp"
PERCENTILES = (0.5, 0.95, 0.99)


@dataclass
class Plan:
    """What `prepare` did, and for which host; users read it, and spawn only after it is filled in."""

    host: str | None = None
    v1_body: dict[str, Any] = field(default_factory=dict)
    v2_body: dict[str, Any] = field(default_factory=dict)
    v2: bool = False


PLAN = Plan()


def refusal(host: str | None) -> str | None:
    """Why this host may not be loaded, or None. Load is only ever aimed at this machine."""
    parts = urlsplit(host or "")
    if parts.scheme not in ("http", "https") or parts.hostname != ALLOWED_HOST:
        return f"refusing host {host!r}: only http://{ALLOWED_HOST}:PORT may be load tested"
    return None


@events.init_command_line_parser.add_listener
def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--kiln-v2",
        choices=["auto", "on", "off"],
        default="auto",
        help="include /v2 infer: auto = only when the server serves /v2/models/{name}",
    )


def upload_and_wait(http: httpx.Client, timeout_s: float = 120) -> None:
    from tests.models import MODELS  # imports torch: only once, here, not in every user

    mlp = MODELS["mlp"]
    response = http.post(
        "/v1/models",
        files={"file": ("mlp.pt", mlp.torchscript())},
        data={"config": json.dumps(mlp.config(name=MODEL, backends=[]))},
    )
    response.raise_for_status()
    deadline = time.monotonic() + timeout_s
    while (model := http.get(f"/v1/models/{MODEL}").raise_for_status().json())["active"] is None:
        if time.monotonic() > deadline:
            raise StopTest(f"{MODEL} had no ready variant after {timeout_s}s")
        time.sleep(0.2)

    # One row, shaped as the serving version declares its input.
    (tensor,) = model["versions"][-1]["inputs"]
    shape = [1 if d == -1 else d for d in tensor["shape"]]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    PLAN.v1_body = {"inputs": {tensor["name"]: x.tolist()}}
    PLAN.v2_body = {
        "inputs": [{"name": tensor["name"], "shape": shape, "datatype": "FP32", "data": x.ravel().tolist()}]
    }


def prepare(environment: Environment) -> None:
    """Upload the model to the host, once, and see whether it serves /v2."""
    if reason := refusal(environment.host):
        raise StopTest(reason)
    if PLAN.host == environment.host:
        return
    mode = environment.parsed_options.kiln_v2 if environment.parsed_options else "auto"
    try:
        with httpx.Client(base_url=str(environment.host), timeout=60, headers=HEADERS) as http:
            upload_and_wait(http)
            PLAN.v2 = mode == "on" or (mode == "auto" and http.get(f"/v2/models/{MODEL}").status_code == 200)
    except httpx.HTTPError as exc:
        raise StopTest(f"preparing {environment.host} failed: {exc}") from exc
    PLAN.host = environment.host
    print(f"loadtest: {MODEL} is ready; /v2 infer {'in' if PLAN.v2 else 'not in'} the mix", flush=True)


@events.init.add_listener
def prepare_before_run(environment: Environment, **_: Any) -> None:
    # Here, before a headless run starts its --run-time clock, which should time load only.
    # Without --host (the web UI), test_start prepares with the host the UI is given.
    if environment.host is None:
        return
    try:
        prepare(environment)
    except StopTest as exc:
        raise SystemExit(f"loadtest: {exc}") from None


@events.test_start.add_listener
def prepare_on_start(environment: Environment, **_: Any) -> None:
    try:
        prepare(environment)
    except StopTest:
        environment.process_exit_code = 2
        raise


def expect_outputs(response: ResponseContextManager) -> None:
    if response.status_code == 200 and "outputs" in response.json():
        response.success()
    else:
        response.failure(f"{response.status_code}: {response.text[:200]}")


class KilnUser(HttpUser):
    wait_time = between(0.05, 0.15)

    def on_start(self) -> None:
        self.client.headers.update(HEADERS)

    @task(4)
    def predict_v1(self) -> None:
        with self.client.post(
            f"/v1/models/{MODEL}/predict",
            json=PLAN.v1_body,
            name="/v1/models/[name]/predict",
            catch_response=True,
        ) as response:
            expect_outputs(response)

    @task(4)
    def infer_v2(self) -> None:
        if not PLAN.v2:
            raise RescheduleTaskImmediately()  # another task at once, so the mix is v1 and metadata
        with self.client.post(
            f"/v2/models/{MODEL}/infer",
            json=PLAN.v2_body,
            name="/v2/models/[name]/infer",
            catch_response=True,
        ) as response:
            expect_outputs(response)

    @task(2)
    def metadata(self) -> None:
        self.client.get(f"/v1/models/{MODEL}", name="/v1/models/[name]")


def summary(environment: Environment) -> str:
    stats = environment.stats
    lines = [
        f"# Kiln load test: {environment.host}",
        "",
        "| method | endpoint | requests | errors | req/s | p50 ms | p95 ms | p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for entry in [*sorted(stats.entries.values(), key=lambda e: (e.name, e.method)), stats.total]:
        p50, p95, p99 = (entry.get_response_time_percentile(p) for p in PERCENTILES)
        lines.append(
            f"| {entry.method or ''} | {entry.name} | {entry.num_requests} | {entry.num_failures} "
            f"| {entry.total_rps:.1f} | {p50} | {p95} | {p99} |"
        )
    if stats.errors:
        lines += ["", "## Errors", ""]
        lines += [f"- {e.method} {e.name}: {e.occurrences} x {e.to_name()}" for e in stats.errors.values()]
    return "\n".join(lines) + "\n"


@events.quitting.add_listener
def write_summary(environment: Environment, **_: Any) -> None:
    text = summary(environment)
    print(text, flush=True)
    prefix = environment.parsed_options.csv_prefix if environment.parsed_options else None
    if prefix:
        Path(f"{prefix}_summary.md").write_text(text, encoding="utf-8")
