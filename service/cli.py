"""`kiln`: serve, worker, upload, models, default, load, unload, import-triton, delete, predict, and
offline compile."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import httpx
import typer
from httpx_sse import SSEError, connect_sse
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # imported where used: `kiln models` need not load numpy
    import uvicorn

    from compiler.spec import InputSpec

app = typer.Typer(help="Kiln: a model server that compiles what it serves.", no_args_is_help=True)
console = Console()
# Errors, apart from what a command prints: `kiln models --json > m.json` keeps them out of m.json.
stderr = Console(stderr=True)
# Piped or in CI, a line is not broken at $COLUMNS or 80 columns: grep and logs get it whole.
console.soft_wrap = not console.is_terminal
stderr.soft_wrap = not stderr.is_terminal

UrlOption = Annotated[str, typer.Option(envvar="KILN_URL", help="Kiln server URL.")]
KeyOption = Annotated[str | None, typer.Option(envvar="KILN_API_KEY", help="API key.")]
SETTLED = {"ready", "failed", "rejected"}
STAGES = ["queued", "compiling", "verifying", "benchmarking", "ready"]
# A job's events stream that ends before the job, or cannot connect, as its server shuts down, is
# opened again, as often as this, a second apart: behind a load balancer another replica answers;
# a lone server may restart.
REFOLLOWS = 30
GATEWAY_ERRORS = {502, 503, 504}
SLOW_S = 900  # a request that checks a model by running it, or loads and warms one up
# The server's 401 names the header; a CLI user gives the key as an option.
KEY_HINT = "; pass --api-key KEY or set KILN_API_KEY"
SHOWN_CHARS = 40  # of a setting's JSON value in a line, such as a model's labels
SHOWN_TEXT = 80  # of another server's answer in a line
TAG = re.compile(r"<[^>]*>")


class NotKiln(Exception):
    """An answer that is not Kiln's API's: another server's, or a redirect; `main` prints it."""


class Answer(dict[str, Any]):
    """An object in Kiln's JSON answer: a key it lacks is NotKiln, not a KeyError traceback."""

    def __init__(self, url: httpx.URL, fields: dict[str, Any]) -> None:
        super().__init__(fields)
        self.url = url

    def __missing__(self, key: str) -> Any:
        raise NotKiln(f"{self.url} did not answer as Kiln's API does (no {key!r}); is --url right?")


def client(url: str, api_key: str | None) -> httpx.Client:
    """A client of Kiln at `url`; a usage error, before any request, for a URL or key it cannot use."""
    try:
        base = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise typer.BadParameter(f"{url!r}: {exc}", param_hint="--url") from None
    if base.scheme not in ("http", "https") or not base.host:
        raise typer.BadParameter(f"{url!r}: give one such as http://127.0.0.1:8000", param_hint="--url")
    key = (api_key or "").strip()  # a key read from a file ends with its newline
    if not (key.isascii() and key.isprintable()):
        # Not echoed (httpx's own error shows it): it is a secret.
        raise typer.BadParameter("it holds a character an HTTP header cannot carry", param_hint="--api-key")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = httpx.Client(base_url=base, headers=headers, timeout=120)
    http.event_hooks = {"response": [partial(refuse_redirect, http.base_url)]}
    return http


def refuse_redirect(base: httpx.URL, response: httpx.Response) -> None:
    """Kiln's API never redirects; a proxy does, or the old address of a Kiln that moved: NotKiln,
    naming the --url that reaches the new place."""
    if not response.has_redirect_location:
        return
    asked = response.request.url
    moved = asked.join(response.headers["location"])
    api = asked.path[len(base.path) :]  # below --url, as v1/models
    hint = "is --url right?"
    if moved.path.endswith(api):  # the same API path under another base: that base is the --url
        there = moved.copy_with(path=moved.path[: len(moved.path) - len(api)], query=None)
        hint = f"if Kiln is there, give --url {str(there).rstrip('/')}"
    raise NotKiln(f"error {response.status_code}: {asked} redirects to {moved}; {hint}")


def segment(name: str) -> str:
    """A name given by the user, as one URL path segment: `victim?keep` names no other model. A
    `/` is refused, not encoded: the server decodes %2F before it routes, so `mlp/versions/1`
    would still name version 1 of mlp; and `.` would be taken out of the path."""
    if "/" in name or name in (".", ".."):
        raise typer.BadParameter(f"{name!r} cannot be a name", param_hint="NAME")
    return quote(name, safe="")


def check(response: httpx.Response) -> Answer:
    """The JSON of a 2xx answer; anything else is an error, exit 1."""
    if not response.is_success:
        stderr.print(f"[red]error {response.status_code}:[/red] {escape(error_of(response))}")
        raise typer.Exit(1)
    return json_of(response)


def json_of(response: httpx.Response) -> Answer:
    """A 2xx answer's JSON object; the repository's answers are empty, and read as an empty one."""
    url = response.request.url
    try:
        found = response.json(object_hook=partial(Answer, url)) if response.content else Answer(url, {})
    except ValueError:
        found = None
    if not isinstance(found, Answer):
        raise NotKiln(f"{url} did not answer as Kiln's API does: {response.text[:200]!r}; is --url right?")
    return found


def error_of(response: httpx.Response) -> str:
    """/v1's problem detail, or a protocol's {"error"}. A body that is not JSON is another
    server's (a web server's page, a proxy's): NotKiln, in one line, not the page."""
    try:
        doc = response.json()
    except ValueError:
        raise not_kiln(response) from None
    found = doc.get("detail") or doc.get("error") if isinstance(doc, dict) else None
    text = str(found or response.text)
    return text + KEY_HINT if response.status_code == 401 else text


def not_kiln(response: httpx.Response) -> NotKiln:
    """An error answered in something other than JSON, named by its type and its first line of
    text, tags dropped (an HTML page's <title>, as a rule), cut short."""
    kind = response.headers.get("content-type", "no content type").partition(";")[0].strip()
    lines = (" ".join(TAG.sub(" ", line).split()) for line in response.text.splitlines())
    first = next(filter(None, lines), "")
    said = f": {cut(first, SHOWN_TEXT)}" if first else ""
    # A load balancer answers so while no Kiln behind it is up.
    hint = "is Kiln behind it up?" if response.status_code in GATEWAY_ERRORS else "is --url right?"
    where = response.request.url
    return NotKiln(f"error {response.status_code} from {where}: not Kiln's API ({kind}{said}); {hint}")


def cut(text: str, chars: int) -> str:
    """At most `chars` characters, an ellipsis ending those cut short."""
    return text if len(text) <= chars else text[: chars - 1] + "…"


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.", min=0, max=65535)] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes.", min=1)] = 1,
    model_repository: Annotated[
        Path | None,
        typer.Option(
            help="A Triton model repository to deploy as the API starts, before it reports ready "
            "(KILN_MODEL_REPOSITORY).",
            exists=True,
            file_okay=False,
        ),
    ] = None,
    repository_poll_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds between looks for changed model directories there, deployed as they change, "
            "and removed ones, unloaded (KILN_MODEL_REPOSITORY_POLL_S; default: only at startup).",
            min=0,
        ),
    ] = None,
) -> None:
    """Start the API (embedded mode unless KILN_REDIS_URL is set)."""
    import uvicorn

    quiet_openmp()

    from service.api.auth import parse_keys
    from service.errors import InvalidConfigError
    from service.logs import logging_config
    from service.settings import get_settings

    # The gRPC server listens where HTTP does; uvicorn's worker processes each start their own,
    # and the kernel spreads connections over them.
    os.environ.setdefault("KILN_GRPC_HOST", host)
    if model_repository is not None:  # read by each worker process's settings
        os.environ["KILN_MODEL_REPOSITORY"] = str(model_repository.resolve())
    if repository_poll_s is not None:
        if model_repository is None and not os.environ.get("KILN_MODEL_REPOSITORY"):
            raise typer.BadParameter("needs --model-repository (or KILN_MODEL_REPOSITORY)")
        os.environ["KILN_MODEL_REPOSITORY_POLL_S"] = str(repository_poll_s)
    if workers > 1:
        os.environ.setdefault("KILN_GRPC_REUSE_PORT", "true")
    settings = get_settings()
    try:  # here, once: each worker process would fail on them with a traceback
        parse_keys(settings.api_keys)
    except InvalidConfigError as exc:
        stderr.print(Text(str(exc), style="red"))
        raise typer.Exit(2) from None
    # uvicorn applies it here and again in each worker process it spawns.
    options: dict[str, Any] = {
        "factory": True,
        "host": host,
        "port": port,
        "log_config": logging_config(settings.log_format),
        "access_log": settings.access_log,
        "timeout_graceful_shutdown": settings.shutdown_timeout_s,
    }
    if workers > 1:
        with multiprocess_metrics(workers):
            supervise(uvicorn.Config(APP, workers=workers, **options))
        return
    uvicorn.run(APP, **options)
    # Here after Ctrl-C (SIGTERM's default action ends the process before), once the server has
    # stopped, past its drain limit: threads still running a request or an upload check, whose
    # answers no one takes now, would hold the exit until they end (25 s past a 3 s limit).
    logging.shutdown()
    os._exit(0)


APP = "service.api.app:served_app"


def supervise(config: uvicorn.Config) -> None:
    """uvicorn.run's supervisor of worker processes, exiting as a worker that failed to start
    does: uvicorn.run returns, and `kiln serve` exited 0, where one worker exits 3."""
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from service.sandbox import SUPERVISOR_PID

    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    os.environ[SUPERVISOR_PID] = str(os.getpid())  # read by each worker's app (create_app)
    supervisor.run()
    if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
        sys.exit(STARTUP_FAILURE)


@contextmanager
def multiprocess_metrics(workers: int) -> Iterator[None]:
    """With several workers, a scrape must count all of them, not whichever one answers it:
    prometheus-client's multiprocess mode, in a fresh directory (stale files would be counted)
    that goes when the server stops. A PROMETHEUS_MULTIPROC_DIR of the user's own wins."""
    if workers == 1 or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="kiln-metrics-") as path:
        # Read by prometheus-client as each worker process imports it.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        try:
            yield
        finally:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]


@app.command()
def worker() -> None:
    """Consume compile jobs for this host's targets (needs KILN_REDIS_URL)."""
    quiet_openmp()  # its compiles time TorchScript as the API serves it
    from service.logs import setup_logging
    from service.settings import get_settings
    from service.worker import run_worker

    settings = get_settings()
    setup_logging(settings.log_format)
    run_worker(settings)


def quiet_openmp() -> None:
    """Between requests torch's OpenMP threads spin-wait (by default for up to ~300k spins) and
    take the core that the event loop and other requests need. libgomp reads this once, when torch
    loads (in compile children too, which inherit it), so it is set before anything imports torch.
    A user's own value wins."""
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")


def json_fields(pairs: list[str] | None) -> dict[str, Any]:
    """`--set FIELD=VALUE` options, each VALUE in JSON; a usage error for one that is not."""
    fields: dict[str, Any] = {}
    for pair in pairs or []:
        field, _, value = pair.partition("=")
        try:
            fields[field] = json.loads(value)
        except json.JSONDecodeError:
            raise typer.BadParameter(
                f"{pair!r}: give FIELD=VALUE, VALUE in JSON: 2000, true, null or [4,8]", param_hint="--set"
            ) from None
    return fields


LabelsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--labels",
        help="OUTPUT=FILE: the output's class labels, one a line (Triton's label file), which "
        "answers of the classification extension carry; repeatable.",
    ),
]


def label_files(pairs: list[str] | None) -> dict[str, list[str]]:
    """`--labels OUTPUT=FILE` options, each file read as one label a line."""
    labels: dict[str, list[str]] = {}
    for pair in pairs or []:
        output, sep, path = pair.partition("=")
        if not sep or not output:
            raise typer.BadParameter(f"{pair!r}: give OUTPUT=FILE", param_hint="--labels")
        try:
            labels[output] = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise typer.BadParameter(f"{pair!r}: {exc}", param_hint="--labels") from None
    return labels


@app.command()
def upload(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="TorchScript file.")],
    name: Annotated[str, typer.Option(help="Model name.")],
    input: Annotated[list[str], typer.Option("--input", help="NAME:DTYPE[D0,...], -1 = dynamic.")],
    max_batch_size: Annotated[int | None, typer.Option(help="Largest batch.")] = None,
    backend: Annotated[list[str] | None, typer.Option("--backend", help="Backends to compile.")] = None,
    target: Annotated[
        list[str] | None,
        typer.Option("--target", help="Targets to compile for; `auto`: every live worker's."),
    ] = None,
    fields: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Any other field of the upload config, FIELD=VALUE with a JSON value, e.g. "
            "max_queue_delay_us=2000, tuning_trials=200 or rtol=1e-3; repeatable.",
        ),
    ] = None,
    labels: LabelsOption = None,
    wait: Annotated[bool, typer.Option(help="Show live progress until every variant settles.")] = True,
    url: UrlOption = "http://127.0.0.1:8000",
    api_key: KeyOption = None,
) -> None:
    """Upload a model and watch its variants compile."""
    from compiler.errors import CompilerError
    from compiler.spec import TensorSpec

    try:
        inputs = [TensorSpec.parse(i).to_dict() for i in input]
    except CompilerError as exc:
        raise typer.BadParameter(str(exc), param_hint="--input") from None
    config: dict[str, Any] = {**json_fields(fields), "name": name, "inputs": inputs}
    if max_batch_size is not None:
        config["max_batch_size"] = max_batch_size
    if backend:
        config["backends"] = backend
    if target:
        config["targets"] = target
    if labels:
        config["labels"] = label_files(labels)
    with client(url, api_key) as http:
        before = serving_settings(http, name)
        # The server checks the model by running it (up to KILN_VALIDATE_TIMEOUT_S) before it answers.
        files, data = {"file": file.read_bytes()}, {"config": json.dumps(config)}
        body = check(http.post("/v1/models", files=files, data=data, timeout=SLOW_S))
        line = escape(f"{body['name']} version {body['version']} ({body['sha256'][:12]})")
        if body["deduplicated"]:
            # It compiles nothing, but takes this upload's serving settings, left-out ones at
            # their defaults: say what that changed.
            after = check(http.get(f"/v1/models/{segment(name)}/versions/{body['version']}")).get("serving")
            line += " [dim]already uploaded[/dim]" + escape(
                serving_changes(before.get(body["version"]), after)
            )
        console.print(line)
        variants = body["variants"]
        if wait:
            unserved = body.get("unserved_targets", [])  # an older server says nothing
            variants = settled(http, body["name"], body["version"], variants, unserved)
    show(variants)


def serving_settings(http: httpx.Client, name: str) -> dict[int, dict[str, Any]]:
    """The serving settings of each of the model's versions; none for a new model (or an answer
    that is not Kiln's, which the upload then names)."""
    response = http.get(f"/v1/models/{segment(name)}")
    if not response.is_success:
        return {}
    return {v["version"]: v.get("serving") for v in json_of(response).get("versions", [])}


def serving_changes(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """What an upload found again changed of its version's serving settings, as the end of a line;
    nothing where they are not known (a version uploaded as this one ran, an older server)."""
    if before is None or after is None:
        return ""
    changed = [
        f"{field}={setting_text(value)} (was {setting_text(before.get(field))})"
        for field, value in after.items()
        if before.get(field) != value
    ]
    return "; serving settings applied: " + ", ".join(changed) if changed else "; serving settings unchanged"


def setting_text(value: Any) -> str:
    """A setting's value in JSON, as `--set` takes it, cut short."""
    return cut(json.dumps(value), SHOWN_CHARS)


@app.command("add-variants")
def add_variants(
    name: str,
    version: int,
    backend: Annotated[
        list[str] | None, typer.Option("--backend", help="Backends to compile; default: the version's own.")
    ] = None,
    target: Annotated[
        list[str] | None,
        typer.Option("--target", help="Targets; default: the version's own, `auto` read again now."),
    ] = None,
    tuning_trials: Annotated[int, typer.Option(help="Also a tvm variant tuned with this many trials.")] = 0,
    retry_failed: Annotated[
        bool, typer.Option(help="Also compile again those that failed or were rejected.")
    ] = False,
    wait: Annotated[bool, typer.Option(help="Show live progress until every variant settles.")] = True,
    url: UrlOption = "http://127.0.0.1:8000",
    api_key: KeyOption = None,
) -> None:
    """Compile more of an uploaded version: other backends or tuning, targets that joined since
    its upload, and the variants that failed."""
    request: dict[str, Any] = {"tuning_trials": tuning_trials, "retry_failed": retry_failed}
    if backend:
        request["backends"] = backend
    if target:
        request["targets"] = target
    with client(url, api_key) as http:
        body = check(http.post(f"/v1/models/{segment(name)}/versions/{version}/variants", json=request))
        for s in body["skipped"]:
            console.print(Text(f"{label(s):<24} {s['target']:<28} skipped: {s['reason']}", style="dim"))
        variants = body["queued"]
        if not variants:
            console.print(f"{name} version {version}: nothing to compile", markup=False)
        elif wait:
            queued = {v["id"] for v in variants}
            unserved = body.get("unserved_targets", [])  # an older server says nothing
            variants = [v for v in settled(http, name, version, variants, unserved) if v["id"] in queued]
    show(variants)


def settled(
    http: httpx.Client, name: str, version: int, variants: list[dict[str, Any]], unserved: list[str]
) -> list[dict[str, Any]]:
    """Follow the variants' jobs to the end, then read the version's variants again. Those for
    targets that no worker serves would wait for one: they are named, not followed."""
    for target in unserved:
        console.print(
            f"[yellow]no live `kiln worker` for {escape(target)}: its variants stay queued until one "
            "starts[/yellow]"
        )
    follow(http, [v for v in variants if v["target"] not in unserved])
    return list(check(http.get(f"/v1/models/{segment(name)}/versions/{version}"))["variants"])


def show(variants: list[dict[str, Any]]) -> None:
    for v in variants:
        latency = f" {v['latency_ms']:.3f} ms at batch 1" if v["latency_ms"] is not None else ""
        error = f": {v['error']}" if v["error"] else ""
        console.print(f"{label(v):<24} {v['target']:<28} {v['status']}{latency}{error}", markup=False)


def label(variant: dict[str, Any]) -> str:
    from service.records import variant_label

    return variant_label(variant["backend"], variant.get("options", {}))


def follow(http: httpx.Client, variants: list[dict[str, Any]]) -> None:
    """A live bar per compiling variant, each fed by its job's server-sent events in a thread.
    Ctrl-C stops following at once, exit 130; the jobs go on."""
    pending = [v for v in variants if v["job_id"] and v["status"] not in SETTLED]
    if not pending:
        return
    columns = (  # the server's text as it is: `tvm[tuning_trials=200]` is no markup
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TextColumn("{task.fields[stage]}", markup=False),
    )
    stop = threading.Event()
    streams: list[threading.Thread] = []
    with Progress(*columns, console=console) as progress:
        try:
            for v in pending:
                task = progress.add_task(
                    f"{label(v):<24} {v['target']:<28}", total=len(STAGES) - 1, stage=v["status"]
                )
                # A daemon: one blocked reading its stream (closing the client does not wake it)
                # must not hold the exit after Ctrl-C.
                stream = threading.Thread(
                    target=stream_job, args=(http, v["job_id"], progress, task, stop), daemon=True
                )
                stream.start()
                streams.append(stream)
            for stream in streams:
                stream.join()
        except KeyboardInterrupt:
            stop.set()
    if stop.is_set():
        stderr.print("stopped following; the jobs go on on the server: `kiln models` shows how they end")
        raise typer.Exit(130)


def stream_job(
    http: httpx.Client, job_id: str, progress: Progress, task: TaskID, stop: threading.Event
) -> None:
    """Follow one job to its `end` event, through its server's shutdowns, until `stop`. The final
    statuses are read again once every stream ends, so a stream that fails only stops its own bar."""
    why = "its server shut down"
    for _ in range(REFOLLOWS + 1):
        try:
            if follow_job(http, job_id, progress, task):
                return
        except httpx.TransportError as exc:  # a server going or gone: another may answer
            why = f"{type(exc).__name__}: {exc}"
        except (httpx.HTTPError, SSEError, NotKiln) as exc:
            progress.update(task, stage=f"no progress ({type(exc).__name__}: {exc})")
            return
        if stop.wait(1):  # Ctrl-C: the client is closed, not to be asked again
            return
    progress.update(task, stage=f"no progress ({why})")


def follow_job(http: httpx.Client, job_id: str, progress: Progress, task: TaskID) -> bool:
    """One stream of the job's events: False if it ended before the job did, as its server
    shut down."""
    with connect_sse(http, "GET", f"/v1/jobs/{job_id}/events") as source:
        if source.response.status_code in GATEWAY_ERRORS:  # a load balancer's, while none is up
            return False
        if not source.response.is_success:
            progress.update(task, stage=f"no progress (HTTP {source.response.status_code})")
            return True
        for event in source.iter_sse():
            data = event.json()
            if event.event == "end":
                return bool(data["reason"] != "shutdown")
            if event.event == "stage":
                stage = data["stage"]
                # A failure fills the bar too: the job is over either way.
                done = STAGES.index(stage) if stage in STAGES else len(STAGES) - 1
                detail = f": {data['error']}" if data["error"] else ""
                tuning = data.get("tuning")
                if tuning and stage == "compiling":
                    detail = f", tuning {tuning['trials_done']}/{tuning['trials_total']} trials"
                progress.update(task, completed=done, stage=f"{stage}{detail}")
    return False


@app.command()
def models(
    name: Annotated[str | None, typer.Argument(help="Only this model.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the server's JSON, every field, instead of a table.")
    ] = False,
    url: UrlOption = "http://127.0.0.1:8000",
    api_key: KeyOption = None,
) -> None:
    """List models, versions and variants, with each variant's batch-1 latency and its speedup
    over TorchScript timed in the same run."""
    with client(url, api_key) as http:
        body = check(http.get("/v1/models" + ("" if name is None else f"/{segment(name)}")))
    if as_json:
        typer.echo(json.dumps(body, indent=2))
        return
    # A variant timed at compile and one timed in a race (or races apart) each have their own
    # TorchScript baseline: their ms do not compare, their speedups do.
    caption = "speedup: TorchScript ms / batch-1 ms, TorchScript timed in the same run as the variant"
    table = Table(caption=caption)
    for column in (
        "model",
        "version",
        "backend",
        "target",
        "status",
        "batch-1 ms",
        "TorchScript ms, same run",
        "speedup",
        "timed",
        "active",
    ):
        # In a narrow terminal a value wraps in its cell, rather than lose its end to an ellipsis.
        table.add_column(column, overflow="fold")
    for model in body["models"] if name is None else [body]:
        active = model["active"] or {}
        shown_name = f"{model['name']} (unloaded)" if model.get("unloaded") else model["name"]
        default = model.get("default_version")
        for version in model["versions"]:
            number = str(version["version"]) + (" (default)" if version["version"] == default else "")
            for v in version["variants"]:
                ms = v["latency_ms"]
                compiled = v["backend"] != "torchscript"
                base = v["baseline_latency_ms_by_batch"].get("1") if compiled else None
                cells = (
                    shown_name,
                    number,
                    label(v),
                    v["target"],
                    v["status"],
                    f"{ms:.3f}" if ms is not None else "",
                    f"{base:.3f}" if base is not None else "",
                    f"{base / ms:.2f}x" if ms and base else "",
                    ("race" if v["raced_at"] else "compile") if ms is not None and compiled else "",
                    "*" if v["id"] == active.get("variant_id") else "",
                )
                table.add_row(*map(Text, cells))  # no markup: `openvino[precision=fp32]` keeps its options
    print_table(table)


def print_table(table: Table) -> None:
    """Piped or in CI, Rich lays a table out in $COLUMNS or 80 columns, cutting headers and values
    short ('backe…', 'cpu-x…'): there it gets the width it needs, whole for grep and logs."""
    if console.is_terminal:
        console.print(table)
        return
    wide = console.options.update(max_width=sys.maxsize)
    width = console.width
    console.width = max(width, console.measure(table, options=wide).maximum)
    try:
        console.print(table)
    finally:
        console.width = width


@app.command()
def default(
    name: str,
    version: Annotated[int | None, typer.Argument(help="Omit it to serve the newest ready one.")] = None,
    url: UrlOption = "http://127.0.0.1:8000",
    api_key: KeyOption = None,
) -> None:
    """Choose the version that serves requests naming none: a rollback that keeps the newer ones."""
    with client(url, api_key) as http:
        body = check(http.put(f"/v1/models/{segment(name)}/default-version", json={"version": version}))
    default = body["default_version"] or "the newest ready one"
    serving = f"v{body['active']['version']}" if body["active"] else "nothing on this host yet"
    console.print(f"{name}: default version {default}; serving {serving}", markup=False)


@app.command()
def serving(
    name: str,
    version: int,
    changes: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="FIELD=VALUE with a JSON value (null: the server default), e.g. max_queue_delay_us=2000 "
            "or preferred_batch_sizes=[4,8]; repeatable. Without it, the settings are shown.",
        ),
    ] = None,
    labels: LabelsOption = None,
    url: UrlOption = "http://127.0.0.1:8000",
    api_key: KeyOption = None,
) -> None:
    """Show a version's serving settings (batching, queue, timeout, response cache, labels), or
    change them without a recompile; --labels replaces the labels of every output."""
    body = json_fields(changes)
    if labels:
        body["labels"] = label_files(labels)
    path = f"/v1/models/{segment(name)}/versions/{version}"
    with client(url, api_key) as http:
        found = check(http.patch(f"{path}/serving", json=body) if body else http.get(path))
    console.print_json(data=found["serving"])


@app.command()
def unload(name: str, url: UrlOption = "http://127.0.0.1:8000", api_key: KeyOption = None) -> None:
    """Take a model out of service on every replica (Triton's repository unload), keeping it."""
    with client(url, api_key) as http:
        check(http.post(f"/v2/repository/models/{segment(name)}/unload"))
    console.print(f"{name}: unloaded; `kiln load {name}` serves it again", markup=False)


@app.command()
def load(name: str, url: UrlOption = "http://127.0.0.1:8000", api_key: KeyOption = None) -> None:
    """Put an unloaded model back in service, loaded and warmed up on the replica that gets it."""
    with client(url, api_key) as http:
        # It warms up the model.
        check(http.post(f"/v2/repository/models/{segment(name)}/load", timeout=SLOW_S))
    console.print(f"{name}: loaded", markup=False)


@app.command("import-triton")
def import_triton(
    repository: Annotated[
        Path, typer.Argument(exists=True, file_okay=False, help="A Triton model repository directory.")
    ],
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="Only this model (repeatable); default: every one."),
    ] = None,
    url: UrlOption = "http://127.0.0.1:8000",
    api_key: KeyOption = None,
) -> None:
    """Deploy a Triton model repository's TorchScript models: the versions Triton would load (by
    default the newest), oldest first, each a Triton load with its config.pbtxt and files, so the
    newest serves, unless a default version is set. Exits 1 if any failed."""
    from service.triton_repository import model_dirs

    dirs, others = model_dirs(repository)
    dirs = [d for d in dirs if not model or d.name in model]
    missing = sorted(set(model or []) - {d.name for d in dirs})
    if missing or not dirs:
        which = escape(f"{missing or ''} in {repository}".strip())
        stderr.print(f"[red]no model directory with a config.pbtxt[/red] {which}")
        raise typer.Exit(1)
    table = Table("model", "Triton version", "Kiln version", "result")
    failed = False
    with client(url, api_key) as http:
        try:
            for model_dir in dirs:
                failed |= not import_model(http, model_dir, table)
        except httpx.ConnectError:  # nothing more can load: what did, then main's one line
            if table.row_count:
                print_table(table)
            raise
    for other in [] if model else others:
        table.add_row(Text(other.name), "", "", Text("skipped: no config.pbtxt", style="yellow"))
    print_table(table)
    if failed:
        raise typer.Exit(1)


def import_model(http: httpx.Client, model_dir: Path, table: Table) -> bool:
    """Load the versions of one model directory, oldest first, each with a row: the Kiln version
    it became, or why not. A failed one ends the model's, since a newer one would serve in its
    place. Whether every version loaded and the newest serves."""
    from service.triton_repository import VERSION_HEADER, RepositoryError, version_loads

    try:
        loads = version_loads(model_dir)
    except RepositoryError as exc:
        table.add_row(Text(model_dir.name), "", "", Text(str(exc), style="red"))
        return False
    name, made = loads[0].model, 0
    path, row = segment(name), Text(name)

    def answer(response: httpx.Response) -> Any:
        if not response.is_success:
            try:
                why = f"{response.status_code} {error_of(response)}"
            except NotKiln as exc:  # a proxy's page for this one load (its gateway timed out): a row
                why = str(exc)
            raise RepositoryError(why)
        return json_of(response)

    for i, load in enumerate(loads):
        try:
            # A load checks the model by running it (up to KILN_VALIDATE_TIMEOUT_S), then warms it up.
            loaded = http.post(f"/v2/repository/models/{path}/load", json=load.request(), timeout=SLOW_S)
            answer(loaded)
            # The version the server made or found: an identical earlier upload is found, and
            # another version may hold the same file under another configuration.
            header = loaded.headers.get(VERSION_HEADER, "")
            if not header.isdecimal():
                raise NotKiln(f"{loaded.request.url} did not name the version it loaded; is --url Kiln's?")
            made = int(header)
        except httpx.ConnectError:  # Kiln is down: one line (import_triton), not one a row
            raise
        except (RepositoryError, httpx.TransportError) as exc:
            table.add_row(row, str(load.version), "", Text(str(exc) or type(exc).__name__, style="red"))
            for later in loads[i + 1 :]:
                table.add_row(
                    row, str(later.version), "", Text("not loaded: an older version failed", style="yellow")
                )
            return False
        table.add_row(row, str(load.version), str(made), Text("loaded", style="green"))
    try:
        model = answer(http.get(f"/v1/models/{path}"))
    except (RepositoryError, httpx.TransportError) as exc:
        table.add_row(row, "", "", Text(f"loaded; what serves is unknown: {exc}", style="yellow"))
        return True
    serving = (model.get("active") or {}).get("version")
    if serving != made:
        if model.get("default_version") is not None:
            why = f"version {model['default_version']} is the default version"
        else:
            why = (
                f"version {serving} is newer ({made} repeats an older version's file and configuration, "
                f"or {serving} was uploaded since)"
            )
        note = f"serves requests naming no version, not {made}: {why}; `kiln default {name} {made}` serves it"
        table.add_row(row, "", str(serving), Text(note, style="yellow"))
    return True


@app.command()
def delete(
    name: str,
    version: Annotated[int | None, typer.Argument(help="Omit it to delete the model, every version.")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    url: UrlOption = "http://127.0.0.1:8000",
    api_key: KeyOption = None,
) -> None:
    """Delete a model, or one version of it, and the artifacts nothing else uses."""
    what = name if version is None else f"{name} version {version}"
    path = f"/v1/models/{segment(name)}" + ("" if version is None else f"/versions/{version}")
    if not yes:
        typer.confirm(f"Delete {what} and its artifacts?", abort=True)
    with client(url, api_key) as http:
        check(http.delete(path))
    console.print(f"{what}: deleted", markup=False)


@app.command()
def predict(
    name: str,
    data: Annotated[str, typer.Option(help="JSON inputs, e.g. '{\"x\": [[1, 2]]}', or @file.json.")],
    version: Annotated[int | None, typer.Option(help="Version; default: the serving one.")] = None,
    backend: Annotated[
        str | None, typer.Option(help="Pin a backend (e.g. tvm) instead of the fastest verified variant.")
    ] = None,
    priority: Annotated[
        int, typer.Option(min=0, help="Triton's request priority: 1 is the highest of the model's levels.")
    ] = 0,
    timeout_us: Annotated[
        int | None, typer.Option(min=0, help="Microseconds it may wait in the queue before a 503 instead.")
    ] = None,
    url: UrlOption = "http://127.0.0.1:8000",
    api_key: KeyOption = None,
) -> None:
    """Run a prediction and print the JSON response."""
    try:
        text = Path(data[1:]).read_text() if data.startswith("@") else data
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"cannot read {data[1:]}: {exc}", param_hint="--data") from None
    try:
        inputs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"not JSON ({exc}); give input name -> nested lists", param_hint="--data"
        ) from None
    path = f"/v1/models/{segment(name)}" + ("" if version is None else f"/versions/{version}") + "/predict"
    given = {"backend": backend, "priority": priority or None, "timeout_us": timeout_us}
    params = {key: value for key, value in given.items() if value is not None}
    with client(url, api_key) as http:
        body = check(http.post(path, json={"inputs": inputs}, params=params))
    console.print_json(data=body)


@app.command()
def targets() -> None:
    """This host's hardware targets, and which backends can compile for each here (and why not)."""
    from compiler.backends import availability
    from compiler.hardware import cuda_devices, local_targets
    from service.settings import get_settings

    devices = Table("cuda", "name", "compute capability", "memory", "target", title="CUDA devices")
    for d in cuda_devices():
        memory = f"{d.memory_mb} MiB" if d.memory_mb is not None else "?"
        devices.add_row(str(d.index), Text(d.name), "{}.{}".format(*d.compute_capability), memory, d.target)
    if devices.row_count:
        print_table(devices)
    else:
        console.print("CUDA devices: none found")
    detected = local_targets()
    chosen = get_settings().host_targets()
    if chosen != detected:
        console.print(f"KILN_TARGETS overrides the detected targets {detected}")
    table = Table("target", "backend", "status", title="Targets")
    for target in chosen:
        for name, reason in availability(target).items():
            status = Text("available", style="green") if reason is None else Text(reason)
            table.add_row(Text(target), name, status)
    print_table(table)


@app.command(name="compile")
def compile_command(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="TorchScript file.")],
    input: Annotated[list[str], typer.Option("--input", help="NAME:DTYPE[D0,...], -1 = dynamic.")],
    backend: Annotated[str, typer.Option(help="Backend to compile with.")] = "tvm",
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Artifact file to write (see above for its use).")
    ] = Path("out.kiln"),
    max_batch_size: Annotated[int, typer.Option(help="Largest batch.")] = 8,
    rtol: Annotated[float, typer.Option(help="Verification rtol.", min=0)] = 1e-4,
    atol: Annotated[float, typer.Option(help="Verification atol.", min=0)] = 1e-5,
    tuning_trials: Annotated[int, typer.Option(help="tvm: MetaSchedule trials (0: untuned).")] = 0,
) -> None:
    """Compile, verify against TorchScript and benchmark one backend offline, with no server: to
    see whether and how fast a model compiles before uploading it.

    The artifact is a zip of kiln.json (backend, target, input spec, the verification report)
    and the backend's compiled payload, which Python loads and runs with
    compiler.backends.load_artifact(compiler.artifact.Artifact.unpack(data)).run({"x": array}).
    The server does not take it: upload the TorchScript file, which it compiles itself."""
    from compiler.errors import CompilerError
    from compiler.hardware import cpu_target
    from compiler.pipeline import CompileOptions, compile_and_check
    from compiler.spec import InputSpec
    from service.records import TUNING_TRIALS
    from service.settings import get_settings

    # Found now, not once the compile (and its tuning) is done.
    if not output.parent.is_dir():
        raise typer.BadParameter(f"{output.parent} is not a directory", param_hint="--output")
    if output.is_dir():
        raise typer.BadParameter(f"{output} is a directory; give a file in it", param_hint="--output")
    check_compile_options(backend, max_batch_size, tuning_trials)
    try:
        spec = InputSpec.parse(input, max_batch_size)
    except CompilerError as exc:
        raise typer.BadParameter(str(exc), param_hint="--input") from None
    backend_options = {TUNING_TRIALS: tuning_trials} if tuning_trials else {}
    options = CompileOptions(  # KILN_THREADS, as `kiln serve` and `kiln worker` run
        rtol=rtol, atol=atol, threads=get_settings().threads, backend_options=backend_options
    )
    quiet_torch()
    try:
        with console.status("checking that the model runs on its inputs") as status:
            spec = checked(file, spec)
            status.update(escape(f"compiling with {backend}"))

            def show(event: dict[str, Any]) -> None:
                if "stage" in event:
                    status.update(escape(f"{backend}: {event['stage']}"))
                elif "tuning" in event:
                    tuning = event["tuning"]
                    status.update(
                        escape(f"{backend}: tuning, {tuning['trials_done']}/{tuning['trials_total']} trials")
                    )

            result = compile_and_check(file.read_bytes(), spec, backend, cpu_target(), options, progress=show)
    except CompilerError as exc:
        stderr.print(f"[red]{type(exc).__name__}:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from None
    try:
        output.write_bytes(result.artifact.pack())
    except OSError as exc:  # a full disk, say
        stderr.print(f"[red]cannot write {escape(str(output))}:[/red] {escape(exc.strerror or str(exc))}")
        raise typer.Exit(1) from None
    table = Table("batch", escape(f"{backend} ms"), "torchscript ms", "speed-up")
    for batch, ms in sorted(result.latency_ms.items()):
        base = result.baseline_latency_ms[batch]
        table.add_row(str(batch), f"{ms:.3f}", f"{base:.3f}", f"{base / ms:.2f}x")
    print_table(table)
    console.print(
        f"verified: max abs error {result.max_abs_error:.3g}; "
        f"compiled in {result.compile_s:.1f} s; wrote {output} "
        f"({output.stat().st_size / 1e6:.1f} MB)",
        markup=False,
    )
    if result.tuning:
        console.print(
            f"tuned: {result.tuning['trials_done']} trials over {len(result.tuning['tasks'])} kernels"
        )


def check_compile_options(backend: str, max_batch_size: int, tuning_trials: int) -> None:
    """Usage errors for what an upload's config refuses: a compile of them would fail, or be
    silently untuned, or tuned options be ignored."""
    from compiler.backends import MAX_TUNING_TRIALS, OPTIONS, REGISTRY
    from service.records import MAX_BATCH_SIZE, TUNING_TRIALS

    if backend not in REGISTRY:
        raise typer.BadParameter(f"{backend!r} is none of {sorted(REGISTRY)}", param_hint="--backend")
    if not 1 <= max_batch_size <= MAX_BATCH_SIZE:
        raise typer.BadParameter(
            f"{max_batch_size} is not in 1..{MAX_BATCH_SIZE}", param_hint="--max-batch-size"
        )
    if not 0 <= tuning_trials <= MAX_TUNING_TRIALS:
        raise typer.BadParameter(
            f"{tuning_trials} is not in 0..{MAX_TUNING_TRIALS}", param_hint="--tuning-trials"
        )
    tuners = sorted(name for name, options in OPTIONS.items() if TUNING_TRIALS in options)
    if tuning_trials and backend not in tuners:
        raise typer.BadParameter(
            f"{backend} does not tune; only {', '.join(tuners)} does", param_hint="--tuning-trials"
        )


def checked(file: Path, spec: InputSpec) -> InputSpec:
    """The spec, its inputs in the order the model takes them, once the model ran on it as an
    upload's check runs it: a spec it cannot take is an InvalidModelError that says so ("the
    model failed on inputs ... at batch 1: ..."), not an export failure of the backend."""
    from compiler.inspect import inspect_model
    from compiler.spec import InputSpec

    found = inspect_model(str(file), spec.to_dict(), [], progress=lambda event: None)
    by_name = {t.name: t for t in spec.inputs}
    return InputSpec(tuple(by_name[n] for n in found["inputs"]), spec.max_batch_size)


def quiet_torch() -> None:
    """torch logs to stderr what export tries and fails on (fake_tensor's tracebacks, torch.onnx's
    skipped ops) and warns of its own deprecations: noise about Kiln's use of torch, where the
    compile's one line says what failed. Its loggers that TORCH_LOGS leaves alone follow `torch`'s
    level, so TORCH_LOGS still shows what it asks for."""
    import torch  # noqa: F401  # its logging is set up as it loads

    logging.getLogger("torch").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", category=FutureWarning)


def main() -> None:
    """The `kiln` command: a server it cannot reach, or one that is not Kiln, or a setting out of
    its range, is one line, not a traceback."""
    try:
        app()
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        # One line per setting, named as it is set: a traceback buried the name.
        for error in exc.errors():
            name = f"KILN_{str(error['loc'][0]).upper()}" if error["loc"] else "KILN_ settings"
            said = error["msg"].removeprefix("Value error, ")  # a validator's own words
            stderr.print(f"[red]{name}[/red]: {escape(said)}; got {escape(repr(error['input']))}")
        sys.exit(2)
    except SettingsError as exc:
        # A list setting is read as JSON before it is validated; the error names only the field.
        field = re.search(r'field "(\w+)"', str(exc))
        if field is None:
            raise
        name = f"KILN_{field[1].upper()}"
        got = f"; got {os.environ[name]!r}" if name in os.environ else ""
        hint = f'not JSON; give a JSON list, its strings in double quotes, such as ["a", "b"]{got}'
        stderr.print(f"[red]{name}[/red]: {escape(hint)}")
        sys.exit(2)
    except NotKiln as exc:
        stderr.print(Text(str(exc), style="red"))
        sys.exit(1)
    except httpx.TransportError as exc:
        try:
            where = escape(str(exc.request.url))
        except RuntimeError:  # raised before it had a request
            where = "its URL"
        if isinstance(exc, httpx.ReadTimeout):  # it took the request, and may still carry it out
            stderr.print(
                f"[red]Kiln at {where} did not answer in time:[/red] it may still finish the request; "
                "see `kiln models`"
            )
        else:
            stderr.print(
                f"[red]cannot reach Kiln at {where}:[/red] {escape(str(exc) or type(exc).__name__)}; "
                "is it running?"
            )
        sys.exit(1)


if __name__ == "__main__":
    main()
