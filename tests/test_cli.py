"""`kiln compile` works offline: compile, verify, benchmark and write a loadable artifact; bad
arguments to any command are named before any work; and against a server, names stay names, its
text is shown as it is, an answer that is not Kiln's is one line, and Ctrl-C stops following."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest

from compiler.artifact import Artifact
from compiler.backends import get_backend
from service.records import BackendRequest, as_requests
from service.settings import Settings
from tests.client import by_backend, expected, sample, upload
from tests.models import MODELS, TUNABLE, UNCONVERTIBLE
from tests.repositories import CONFIG_PBTXT, model_dir
from tests.servers import ROOT, KilnServer, embedded_server, free_port, wait_until

MLP = MODELS["mlp"]
# Wide enough that no line of a table or message is wrapped.
ENV = {**os.environ, "COLUMNS": "200"}
# Fails at once where there is no GPU, with options in its label: no compile holds the worker.
TENSORRT_FP16 = [{"name": "tensorrt", "options": {"precision": "fp16"}}]


def kiln(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        env={**ENV, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_compile_writes_a_verified_artifact(tmp_path: Path) -> None:
    model = MODELS["mlp"]
    source, out = tmp_path / "mlp.pt", tmp_path / "mlp.kiln"
    source.write_bytes(model.torchscript())
    done = kiln("compile", str(source), "--input", "x:float32[-1,64]", "--backend", "tvm", "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified: max abs error" in done.stdout and "speed-up" in done.stdout
    artifact = Artifact.unpack(out.read_bytes())
    assert artifact.backend == "tvm" and artifact.spec.max_batch_size == 8
    assert artifact.meta["report"]["max_abs_error"] < 1e-5
    x = sample(model, 5)
    got = get_backend("tvm").load(artifact).run({"x": x})["output0"]
    np.testing.assert_allclose(got, expected(model, x), rtol=1e-4, atol=1e-5)


def test_compile_failure_is_one_readable_line(tmp_path: Path) -> None:
    source = tmp_path / "svd.pt"
    source.write_bytes(UNCONVERTIBLE.torchscript())
    done = kiln("compile", str(source), "--input", "x:float32[-1,16]", "-o", str(tmp_path / "x.kiln"))
    assert done.returncode == 1
    assert "ConversionError: tvm: no converter for torch op" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "x.kiln").exists()


def test_compile_refuses_what_an_upload_refuses(tmp_path: Path) -> None:
    """A usage error, as `kiln upload`'s, and before any compile: a bad spec, or options out of
    the upload config's bounds, which compiled untuned, ignored tuning or failed to verify."""
    from service.records import MAX_BATCH_SIZE

    source, out = tmp_path / "mlp.pt", tmp_path / "x.kiln"
    source.write_bytes(MODELS["mlp"].torchscript())
    spec = ["--input", "x:float32[-1,64]"]
    for args, message in [
        (["--input", "x:float33[-1,64]"], "Invalid value for --input: input 'x': unknown dtype 'float33'"),
        (
            [*spec, "--backend", "onnxruntime", "--tuning-trials", "5"],
            "onnxruntime does not tune; only tvm does",
        ),
        ([*spec, "--tuning-trials", "-5"], "--tuning-trials: -5 is not in 0..20000"),
        ([*spec, "--rtol", "-1"], "-1.0 is not in the range x>=0"),
        ([*spec, "--atol", "-1e-5"], "is not in the range x>=0"),
        ([*spec, "--max-batch-size", str(MAX_BATCH_SIZE + 1)], f"is not in 1..{MAX_BATCH_SIZE}"),
        ([*spec, "--max-batch-size", "0"], f"0 is not in 1..{MAX_BATCH_SIZE}"),
        ([*spec, "--backend", "onnxrt"], "Invalid value for --backend: 'onnxrt' is none of ["),
    ]:
        done = kiln("compile", str(source), *args, "-o", str(out))
        assert done.returncode == 2, done.stdout + done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert done.stdout == "" and not out.exists()


def test_compile_with_a_spec_the_model_cannot_take_says_so(tmp_path: Path) -> None:
    """The model runs on the spec first, as an upload's check runs it: its own error, in a line,
    not export's failure after torch's fake_tensor tracebacks on stderr."""
    source = tmp_path / "mlp.pt"
    source.write_bytes(MLP.torchscript())
    done = kiln("compile", str(source), "--input", "x:float32[-1,3,32,32]", "-o", str(tmp_path / "x.kiln"))
    assert done.returncode == 1, done.stdout + done.stderr
    message = (
        "InvalidModelError: the model failed on inputs x:float32[-1,3,32,32] at batch 1: "
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied"
    )
    assert message in done.stderr
    assert "fake_tensor" not in done.stdout + done.stderr and "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "x.kiln").exists()


def test_help_says_what_a_command_does_and_stops() -> None:
    """`kiln compile --help` says how its artifact is used; the backbone benchmark's --help is
    its usage, not a run."""
    done = kiln("compile", "--help")
    assert done.returncode == 0 and "Artifact.unpack(data)" in done.stdout, done.stdout + done.stderr
    bench = [sys.executable, "benchmarks/backbone.py", "--help"]
    done = subprocess.run(bench, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("usage: backbone.py") and "through HTTP" in done.stdout


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device that is always full")
def test_compile_that_cannot_write_its_artifact_says_so_in_a_line(tmp_path: Path) -> None:
    source = tmp_path / "mlp.pt"
    source.write_bytes(MLP.torchscript())
    # TorchScript's own "compile" at one batch size: the quickest there is.
    args = ["--input", "x:float32[-1,64]", "--backend", "torchscript", "--max-batch-size", "1"]
    done = kiln("compile", str(source), *args, "-o", "/dev/full")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cannot write /dev/full: No space left on device" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_bad_arguments_are_named_before_any_work(tmp_path: Path) -> None:
    """Each is one message naming the option, not a traceback, and comes before any request or
    compile (an output directory that does not exist is not found after an hour of tuning)."""
    source = tmp_path / "mlp.pt"
    source.write_bytes(MODELS["mlp"].torchscript())
    url = "http://127.0.0.1:9"  # nothing listens: none of these may get as far as asking it
    for args, message in [
        (
            ["upload", str(source), "--name", "m", "--input", "bad", "--url", url],
            "cannot parse input spec 'bad'",
        ),
        (["predict", "m", "--data", f"@{tmp_path / 'nope.json'}", "--url", url], "cannot read"),
        (
            ["compile", str(source), "--input", "x:float32[-1,64]", "-o", str(tmp_path / "no" / "x.kiln")],
            "is not a",
        ),
        (["compile", str(source), "--input", "x:float32[-1,64]", "-o", str(tmp_path)], "is a directory"),
        (["models", "--url", "http://[::1"], "Invalid value for --url"),
        (["models", "--url", "127.0.0.1:8000"], "Invalid value for --url"),
        # Its server decodes %2F before it routes: quoted, it would still name version 1 of m.
        (["delete", "m/versions/1", "--yes", "--url", url], "'m/versions/1' cannot be a name"),
        (["delete", ".", "1", "--yes", "--url", url], "'.' cannot be a name"),
        # uvicorn took 83861 as 18325 (mod 2**16), and -5 only after the app had started.
        (["serve", "--port", "83861"], "83861 is not in the range"),
        (["serve", "--port", "-5"], "-5 is not in the range"),
        (["serve", "--workers", "0"], "0 is not in the range"),
    ]:
        done = kiln(*args)
        assert done.returncode == 2, done.stdout + done.stderr
        assert message in done.stderr and "Traceback" not in done.stdout + done.stderr
    # A setting out of its range: a traceback of the settings' model, and for KILN_THREADS=0 one
    # of the app's startup, where a worker pool refused 0 threads.
    for setting, command in (
        ("KILN_THREADS", "serve"),
        ("KILN_INFERENCE_WORKERS", "serve"),
        ("KILN_COMPILE_WORKERS", "worker"),
    ):
        done = kiln(command, **{setting: "0", "KILN_DATA_DIR": str(tmp_path / "data")})
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"{setting}: Input should be greater than or equal to 1; got '0'" in done.stderr
        assert "Traceback" not in done.stdout + done.stderr


def test_settings_kiln_serve_cannot_serve_with_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before anything serves: bad API keys were a traceback in each worker process, and
    under --workers 2 a crash loop that never ended; a list setting not in JSON was a traceback
    of the settings' library; an unknown default backend started, and then every upload that
    named no backends got a 422 that blamed its config.backends."""
    keys = "must be KEY:admin or KEY:infer; its scope reads 'root'"
    for workers, setting, value, said in [
        ("1", "KILN_API_KEYS", "k:root", f"KILN_API_KEYS: entry 1 {keys}"),
        ("2", "KILN_API_KEYS", "change-me:admin", "KILN_API_KEYS: entry 1 is the example's placeholder"),
        (
            "1",
            "KILN_DEFAULT_BACKENDS",
            "tvm,onnxruntime",
            "KILN_DEFAULT_BACKENDS: not JSON; give a JSON list",
        ),
        ("1", "KILN_DEFAULT_BACKENDS", '["onnxrt"]', "KILN_DEFAULT_BACKENDS: unknown backend(s) ['onnxrt']"),
        (
            "1",
            "KILN_DEFAULT_BACKENDS",
            '[{"name": "tvm", "options": {"tuning_trials": -1}}]',
            "KILN_DEFAULT_BACKENDS: tvm: option tuning_trials must be an integer in 1..",
        ),
    ]:
        env = {**ENV, "KILN_DATA_DIR": str(tmp_path / "data"), "KILN_GRPC_PORT": "0", setting: value}
        args = [sys.executable, "-m", "service.cli", "serve", "--port", "0", "--workers", workers]
        # Not refused, it would serve until the timeout.
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr
        assert done.stdout == ""
    # Entries as an upload's config.backends takes them: names, or a name with options.
    monkeypatch.setenv(
        "KILN_DEFAULT_BACKENDS", '["onnxruntime", {"name": "tvm", "options": {"tuning_trials": 8}}]'
    )
    tuned = BackendRequest(name="tvm", options={"tuning_trials": 8})
    assert as_requests(Settings().default_backends) == [BackendRequest(name="onnxruntime"), tuned]


def test_errors_go_to_stderr_and_output_to_stdout(tmp_path: Path) -> None:
    """`kiln models nope --json > m.json` left its error in m.json, and nothing on stderr."""
    with stub_server() as (url, stub):
        stub.answer = (404, {"Content-Type": "application/json"}, b'{"detail": "no model named \'nope\'"}')
        done = kiln("models", "nope", "--json", "--url", url)
        assert done.returncode == 1 and done.stdout == "", done.stdout
        assert done.stderr == "error 404: no model named 'nope'\n"
    down = f"http://127.0.0.1:{free_port()}"
    done = kiln("predict", "mlp", "--data", '{"x": [[1]]}', "--url", down)
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert done.stderr.startswith(f"cannot reach Kiln at {down}/v1/models/mlp/predict: ")


def test_import_triton_with_kiln_down_is_one_line(tmp_path: Path) -> None:
    """Not a table with `[Errno 111] Connection refused` on every row."""
    repo = tmp_path / "models"
    model_dir(repo, "mlp", CONFIG_PBTXT, {"1": MLP.torchscript(), "2": MLP.torchscript()})
    (repo / "mlp" / "labels.txt").write_text("a\nb\n")
    down = f"http://127.0.0.1:{free_port()}"
    done = kiln("import-triton", str(repo), "--url", down)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == "" and done.stderr.startswith(
        f"cannot reach Kiln at {down}/v2/repository/models/mlp/load"
    )
    assert done.stderr.count("\n") == 1, done.stderr


def test_import_triton_through_a_proxy_that_fails_a_load_is_a_row(tmp_path: Path) -> None:
    """A proxy's error page for a load (its gateway timed out on a load's check, say) ended the
    whole import, with no table, where a Kiln error is the model's row."""
    repo = tmp_path / "models"
    model_dir(repo, "mlp", CONFIG_PBTXT, {"1": MLP.torchscript(), "2": MLP.torchscript()})
    (repo / "mlp" / "labels.txt").write_text("a\nb\n")
    with stub_server() as (url, stub):
        stub.answer = (504, {"Content-Type": "text/html"}, b"<html><title>Gateway Timeout</title></html>")
        done = kiln("import-triton", str(repo), "--url", url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not Kiln's API (text/html: Gateway Timeout)" in done.stdout, done.stdout
    assert "not loaded: an older version failed" in done.stdout, done.stdout


def test_compile_with_tuning_writes_a_static_batch_artifact(tmp_path: Path) -> None:
    model = TUNABLE[0]
    source, out = tmp_path / "tunable.pt", tmp_path / "tunable.kiln"
    source.write_bytes(model.torchscript())
    args = ["--input", "x:float32[-1,32]", "--max-batch-size", "2", "--tuning-trials", "16", "-o", str(out)]
    done = kiln("compile", str(source), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    # Two kernels (the shared layer and the head) per batch size, sharing the 16 trials asked for.
    tuned = re.search(r"tuned: (\d+) trials over 4 kernels", done.stdout)
    assert tuned is not None and 0 < int(tuned[1]) <= 16, done.stdout
    artifact = Artifact.unpack(out.read_bytes())
    assert artifact.meta["batch_sizes"] == [1, 2] and "new_tuning_records" not in artifact.meta
    runner = get_backend("tvm").load(artifact)
    for batch in (1, 2):
        x = sample(model, batch)
        np.testing.assert_allclose(runner.run({"x": x})["output0"], expected(model, x), rtol=1e-4, atol=1e-5)


class Stub:
    """A server that is not Kiln, on a loopback port: each request gets `answer`; `seen` keeps
    each request's headers."""

    def __init__(self) -> None:
        self.answer: tuple[int, dict[str, str], bytes] = (200, {}, b"{}")
        self.seen: list[dict[str, str]] = []
        self.paths: list[str] = []


@contextmanager
def stub_server() -> Iterator[tuple[str, Stub]]:
    stub = Stub()

    class Handler(BaseHTTPRequestHandler):
        def reply(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            stub.seen.append(dict(self.headers))
            stub.paths.append(self.path)
            status, headers, body = stub.answer
            self.send_response(status)
            for name, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = reply

        def log_message(self, *args: object) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}", stub
        finally:
            server.shutdown()


def test_an_answer_that_is_not_kiln_s_is_one_line(tmp_path: Path) -> None:
    """A redirect (a proxy's, from http to https, say) names the --url to give; another server's
    JSON, or no JSON, is not a KeyError traceback."""
    source = tmp_path / "mlp.pt"
    source.write_bytes(MLP.torchscript())
    with stub_server() as (url, stub):
        for base, moved, hint in [
            (url, "https://kiln.example/v1/models", "give --url https://kiln.example"),
            (f"{url}/kiln", "https://kiln.example/kiln/v1/models", "give --url https://kiln.example/kiln"),
            (url, "/login", "is --url right?"),
        ]:
            stub.answer = (301, {"Location": moved}, b"")
            done = kiln("models", "--url", base)
            assert done.returncode == 1, done.stdout + done.stderr
            assert f"error 301: {base}/v1/models redirects to" in done.stderr and hint in done.stderr

        stub.answer = (200, {"Content-Type": "application/json"}, b'{"hello": "world"}')
        for args, key in [
            (["models"], "models"),
            (["default", "m"], "default_version"),
            (["upload", str(source), "--name", "m", "--input", "x:float32[-1,64]"], "name"),
        ]:
            done = kiln(*args, "--url", url)
            assert done.returncode == 1, done.stdout + done.stderr
            assert f"did not answer as Kiln's API does (no {key!r}); is --url right?" in done.stderr
            assert "Traceback" not in done.stdout + done.stderr

        stub.answer = (200, {"Content-Type": "text/html"}, b"<html>hello</html>")
        done = kiln("models", "--url", url)
        assert done.returncode == 1 and "did not answer as Kiln's API does: '<html>" in done.stderr

        # Another web server's error page, as Python's http.server answers a DELETE: its gist.
        page = (
            b'<!DOCTYPE HTML>\n<html lang="en">\n    <head>\n        <meta charset="utf-8">\n'
            b"        <title>Error response</title>\n    </head>\n    <body>\n"
            b"        <h1>Error response</h1>\n        <p>Error code: 501</p>\n    </body>\n</html>\n"
        )
        for status, content_type, body, said, hint in [
            (501, "text/html;charset=utf-8", page, "text/html: Error response", "is --url right?"),
            (502, "text/plain", b"Bad Gateway", "text/plain: Bad Gateway", "is Kiln behind it up?"),
            (404, "text/plain", b"x" * 1000, f"text/plain: {'x' * 79}…", "is --url right?"),
        ]:
            stub.answer = (status, {"Content-Type": content_type}, body)
            done = kiln("delete", "mlp", "--yes", "--url", url)
            assert done.returncode == 1, done.stdout + done.stderr
            line = f"error {status} from {url}/v1/models/mlp: not Kiln's API ({said}); {hint}\n"
            assert done.stderr == line and done.stdout == ""


def test_an_api_key_is_stripped_and_never_echoed() -> None:
    """A key read from a file keeps its newline; one a header cannot carry is a usage error that
    does not show the secret."""
    with stub_server() as (url, stub):
        stub.answer = (200, {"Content-Type": "application/json"}, b'{"models": []}')
        done = kiln("models", "--url", url, KILN_API_KEY="s3cret\n")
        assert done.returncode == 0, done.stdout + done.stderr
        assert stub.seen[-1]["Authorization"] == "Bearer s3cret"
        for key, part in [("s\u00e9cret", "cret"), ("s3c\nret", "s3c")]:
            done = kiln("models", "--url", url, "--api-key", key)
            assert done.returncode == 2, done.stdout + done.stderr
            assert "Invalid value for --api-key" in done.stderr
            assert part not in done.stdout + done.stderr and "Traceback" not in done.stderr
        assert len(stub.seen) == 1


def test_a_401_says_how_to_give_the_key() -> None:
    with stub_server() as (url, stub):
        detail = b'{"detail": "an API key is required: send `Authorization: Bearer <key>`"}'
        stub.answer = (401, {"Content-Type": "application/json"}, detail)
        done = kiln("models", "--url", url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error 401: an API key is required" in done.stderr
    assert "pass --api-key KEY or set KILN_API_KEY" in done.stderr


# onnxruntime timed in its compile beside a TorchScript of 0.054 ms; TorchScript's own row from
# another run, 0.031 ms: 1.54x is against the former.
LISTED = {
    "name": "mlp",
    "active": {"version": 1, "variant_id": "ort"},
    "default_version": None,
    "unloaded": False,
    "versions": [
        {
            "version": 1,
            "variants": [
                {
                    "id": "ts",
                    "backend": "torchscript",
                    "options": {},
                    "target": "any",
                    "status": "ready",
                    "latency_ms": 0.031,
                    "baseline_latency_ms_by_batch": {},
                    "raced_at": None,
                },
                {
                    "id": "ort",
                    "backend": "onnxruntime",
                    "options": {},
                    "target": "cpu-x86_64-emeraldrapids-avx512",
                    "status": "ready",
                    "latency_ms": 0.035,
                    "baseline_latency_ms_by_batch": {"1": 0.054},
                    "raced_at": None,
                },
            ],
        }
    ],
}


def test_models_as_json_and_as_a_whole_table_when_piped() -> None:
    """--json is the server's JSON; the table, piped at 80 columns, cuts no header or value short,
    and shows the TorchScript time each speedup is against."""
    with stub_server() as (url, stub):
        stub.answer = (200, {"Content-Type": "application/json"}, json.dumps({"models": [LISTED]}).encode())
        done = kiln("models", "--json", "--url", url)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout) == {"models": [LISTED]}
        done = kiln("models", "--url", url, COLUMNS="80")
        assert done.returncode == 0, done.stdout + done.stderr
        stub.answer = (200, {"Content-Type": "application/json"}, json.dumps(LISTED).encode())
        one = kiln("models", "mlp", "--json", "--url", url)
        assert one.returncode == 0 and json.loads(one.stdout) == LISTED, one.stdout + one.stderr
        assert stub.paths[-1] == "/v1/models/mlp"
    assert "…" not in done.stdout
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in done.stdout.splitlines() if "│" in line]
    assert rows == [
        ["mlp", "1", "torchscript", "any", "ready", "0.031", "", "", "", ""],
        [
            "mlp",
            "1",
            "onnxruntime",
            "cpu-x86_64-emeraldrapids-avx512",
            "ready",
            "0.035",
            "0.054",
            "1.54x",
            "compile",
            "*",
        ],
    ]
    assert "TorchScript ms, same run" in done.stdout
    assert "speedup: TorchScript ms / batch-1 ms, TorchScript timed in the same run" in done.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    # Its access log says when the CLI follows a job.
    with embedded_server(tmp_path_factory.mktemp("cli"), KILN_THREADS="1", KILN_ACCESS_LOG="true") as srv:
        yield srv


@pytest.fixture(scope="module")
def victim(http: httpx.Client) -> str:
    uploaded = upload(http, MLP, name="victim", backends=TENSORRT_FP16)
    assert uploaded.status_code == 202, uploaded.text
    return "victim"


def test_a_name_is_one_path_segment(server: KilnServer, http: httpx.Client, victim: str) -> None:
    done = kiln("delete", f"{victim}?keep", "--yes", "--url", server.url)
    assert done.returncode == 1 and "error 404: no model named 'victim?keep'" in done.stderr, done.stderr
    assert http.get(f"/v1/models/{victim}/versions/1").status_code == 200


def test_predict_asks_for_version_0(server: KilnServer, victim: str) -> None:
    data = json.dumps({"x": sample(MLP, 1).tolist()})
    done = kiln("predict", victim, "--version", "0", "--data", data, "--url", server.url)
    assert done.returncode == 1 and "error 404: model 'victim' has no version 0" in done.stderr, done.stderr


def test_the_server_s_text_is_shown_as_it_is(server: KilnServer, tmp_path: Path, victim: str) -> None:
    """Not read as Rich markup: a variant's options in brackets stay, and a closing tag in an
    error does not crash the CLI."""
    source = tmp_path / "mlp.pt"
    source.write_bytes(MLP.torchscript())
    args = ["--input", "x:float32[-1,64]", "--set", f"backends={json.dumps(TENSORRT_FP16)}"]
    done = kiln("upload", str(source), "--name", "shown", *args, "--url", server.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tensorrt[precision=fp16] " in done.stdout
    done = kiln("models", "--url", server.url)
    assert done.returncode == 0 and done.stdout.count("tensorrt[precision=fp16] ") == 2, done.stdout
    done = kiln("serving", victim, "1", "--set", "[/x]=1", "--url", server.url)
    assert done.returncode == 1 and "error 422: unknown setting(s) ['[/x]']" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_an_upload_found_again_says_what_it_changed(server: KilnServer, tmp_path: Path) -> None:
    """An identical upload compiles nothing, but takes its serving settings: the line says which."""
    source = tmp_path / "mlp.pt"
    source.write_bytes(MLP.torchscript())
    args = ["upload", str(source), "--name", "again", "--input", "x:float32[-1,64]", "--set", "backends=[]"]
    done = kiln(*args, "--no-wait", "--url", server.url)
    assert done.returncode == 0 and "already uploaded" not in done.stdout, done.stdout + done.stderr
    for settings, said in [
        (
            ["--set", "max_queue_delay_us=2000"],
            "serving settings applied: max_queue_delay_us=2000 (was null)",
        ),
        (["--set", "max_queue_delay_us=2000"], "serving settings unchanged"),
        ([], "serving settings applied: max_queue_delay_us=null (was 2000)"),  # left out: the default
    ]:
        done = kiln(*args, *settings, "--no-wait", "--url", server.url)
        assert done.returncode == 0, done.stdout + done.stderr
        first = done.stdout.splitlines()[0]
        assert first.startswith("again version 1 (") and first.endswith(f") already uploaded; {said}"), first


def test_ctrl_c_stops_following_at_once_and_the_jobs_go_on(
    server: KilnServer, http: httpx.Client, tmp_path: Path
) -> None:
    """Last here: its tuning goes on until the server stops."""
    source = tmp_path / "mlp.pt"
    source.write_bytes(MLP.torchscript())
    tuned = json.dumps([{"name": "tvm", "options": {"tuning_trials": 2000}}])
    args = ["--name", "tuned", "--input", "x:float32[-1,64]", "--set", f"backends={tuned}"]
    cli = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "upload", str(source), *args, "--url", server.url],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert cli.stdout is not None
        assert cli.stdout.readline().startswith("tuned version 1")
        job_id = by_backend(http.get("/v1/models/tuned/versions/1").json()["variants"], "tvm")["job_id"]
        wait_until(lambda: f"/v1/jobs/{job_id}/events" in server.log.read_text(), 60, "the CLI to follow")
        cli.send_signal(signal.SIGINT)
        began = time.monotonic()
        out, _ = cli.communicate(timeout=30)
        assert time.monotonic() - began < 10
    finally:
        cli.kill()
    assert cli.returncode == 130, out
    assert "tvm[tuning_trials=2000] " in out  # its bar
    assert "stopped following; the jobs go on on the server" in out and "Traceback" not in out
    variant = by_backend(http.get("/v1/models/tuned/versions/1").json()["variants"], "tvm")
    assert variant["status"] not in ("failed", "rejected"), variant
