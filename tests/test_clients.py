"""The SDKs under clients/: generated from the current spec, and working against a live server.

Drift: openapi.json must equal the app's spec, and each committed SDK must equal what
scripts/generate_clients.sh makes from it. Flows: each SDK uploads, waits, predicts, lists and
deletes against a real `kiln serve` that compiles nothing.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.client import expected
from tests.models import MODELS
from tests.servers import ROOT, KilnServer, embedded_server

# The test imports the committed SDK itself, as a user's checkout of clients/python would.
sys.path.insert(0, str(ROOT / "clients" / "python"))

from kiln_client import Client
from kiln_client.api.inference import predict
from kiln_client.api.models import (
    compile_version,
    delete_model,
    get_model,
    get_model_version,
    list_models,
    set_default_version,
    update_serving,
    upload_model,
)
from kiln_client.api.v2 import v2_infer, v2_live, v2_model_ready, v2_ready
from kiln_client.models import (
    BodyUploadModel,
    CompileIn,
    CompileOut,
    DefaultVersionIn,
    InferenceRequest,
    InferenceResponse,
    PredictIn,
    PredictInInputs,
    Problem,
    ServingIn,
    UploadOut,
    VariantStatus,
)
from kiln_client.types import File

TS_DIR = ROOT / "clients" / "typescript"
SETTLED = {VariantStatus.READY, VariantStatus.FAILED, VariantStatus.REJECTED}


def run(args: list[str], cwd: Path = ROOT, timeout: float = 300, **env: str) -> None:
    result = subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )


def generate(sdk: str, out: Path) -> None:
    run(["bash", "scripts/generate_clients.sh", sdk, str(out)], VENV=sys.prefix)


def tree(root: Path) -> dict[str, bytes]:
    # Bytecode appears in clients/python once anything imports it; it is never committed.
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def assert_same_tree(generated: Path, committed: Path) -> None:
    new, old = tree(generated), tree(committed)
    changed = sorted(name for name in new.keys() & old.keys() if new[name] != old[name])
    assert (new.keys() - old.keys(), old.keys() - new.keys(), changed) == (set(), set(), []), (
        f"{committed.relative_to(ROOT)} differs (added, removed, changed): run scripts/generate_clients.sh"
    )


def test_openapi_json_is_current() -> None:
    run([sys.executable, "scripts/openapi.py", "--check"])


def test_upload_config_schema_is_documented() -> None:
    """The upload's `config` is a JSON string to the SDKs, with its schema in the spec (OpenAPI 3.1)."""
    spec = json.loads((ROOT / "openapi.json").read_text(encoding="utf-8"))
    config = spec["components"]["schemas"]["Body_upload_model"]["properties"]["config"]
    assert (config["type"], config["contentMediaType"]) == ("string", "application/json")
    assert {"name", "inputs", "backends", "max_batch_size"} <= config["contentSchema"]["properties"].keys()
    assert config["contentSchema"]["required"] == ["name", "inputs"]


def test_python_sdk_is_current(tmp_path: Path) -> None:
    generate("python", tmp_path / "python")
    assert_same_tree(tmp_path / "python", ROOT / "clients" / "python")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    with embedded_server(
        tmp_path_factory.mktemp("clients"), KILN_DEFAULT_BACKENDS="[]", KILN_THREADS="1"
    ) as srv:
        yield srv


def test_python_sdk_flow(server: KilnServer) -> None:
    model = MODELS["mlp"]
    name = "py-sdk-mlp"
    with Client(base_url=server.url, timeout=httpx.Timeout(60), raise_on_unexpected_status=True) as client:
        config, torchscript = json.dumps(model.config(name=name, backends=[])), model.torchscript()
        first, again = (
            upload_model.sync_detailed(
                client=client,
                body=BodyUploadModel(
                    file=File(payload=io.BytesIO(torchscript), file_name="mlp.pt"), config=config
                ),
            )
            for _ in range(2)
        )
        # Both typed: a new upload's 202 and a deduplicated one's 200.
        assert first.status_code == HTTPStatus.ACCEPTED and isinstance(first.parsed, UploadOut), first.content
        assert again.status_code == HTTPStatus.OK and isinstance(again.parsed, UploadOut), again.content
        uploaded = first.parsed
        assert uploaded.name == name and not uploaded.deduplicated and again.parsed.deduplicated

        deadline = time.monotonic() + 60
        while True:
            version = get_model_version.sync(client=client, name=name, version=uploaded.version)
            assert version is not None
            if all(v.status in SETTLED for v in version.variants):
                break
            assert time.monotonic() < deadline, version.variants
            time.sleep(0.2)
        assert [(v.backend, v.status) for v in version.variants] == [("torchscript", VariantStatus.READY)]

        x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
        result = predict.sync(
            client=client, name=name, body=PredictIn(inputs=PredictInInputs.from_dict({"x": x.tolist()}))
        )
        assert result is not None and result.model_version == uploaded.version
        out = np.asarray(result.outputs["output0"], dtype=np.float32)
        np.testing.assert_allclose(out, expected(model, x), rtol=1e-4, atol=1e-5)

        # The Open Inference Protocol's JSON, through the SDK's typed request and response.
        tensor = {"name": "x", "shape": [3, 64], "datatype": "FP32", "data": x.tolist()}
        body = InferenceRequest.from_dict({"id": "sdk", "inputs": [tensor]})
        inferred = v2_infer.sync(client=client, name=name, body=body)
        assert isinstance(inferred, InferenceResponse), inferred
        assert [inferred.id, inferred.model_name, inferred.model_version] == [
            "sdk",
            name,
            str(uploaded.version),
        ]
        [output] = inferred.outputs
        assert (output.name, output.datatype, output.shape) == ("output0", "FP32", [3, 10])
        np.testing.assert_allclose(
            np.reshape(output.data, output.shape), expected(model, x), rtol=1e-4, atol=1e-5
        )
        live, ready = v2_live.sync(client=client), v2_ready.sync(client=client)
        assert live is not None and live.live and ready is not None and ready.ready
        model_ready = v2_model_ready.sync(client=client, name=name)
        assert model_ready is not None and model_ready.to_dict() == {"name": name, "ready": True}

        listed = list_models.sync(client=client)
        assert listed is not None and name in [m.name for m in listed.models]
        pinned = set_default_version.sync(
            client=client, name=name, body=DefaultVersionIn(version=uploaded.version)
        )
        assert pinned is not None and pinned.default_version == uploaded.version
        for change in (ServingIn(response_cache=True), ServingIn(max_queue_size=4)):
            served = update_serving.sync(client=client, name=name, version=uploaded.version, body=change)
        # What a change leaves out, the SDK leaves out: the response cache stays on.
        assert served is not None and served.serving.max_queue_size == 4 and served.serving.response_cache
        more = CompileIn(backends=["onnxruntime"])
        added = compile_version.sync_detailed(client=client, name=name, version=uploaded.version, body=more)
        assert added.status_code == HTTPStatus.ACCEPTED, added.content
        assert isinstance(added.parsed, CompileOut)  # the 202 body has its schema
        assert [(v.backend, v.status) for v in added.parsed.queued] == [("onnxruntime", VariantStatus.QUEUED)]
        again = compile_version.sync(client=client, name=name, version=uploaded.version, body=more)
        assert again is not None and again.queued == [] and again.skipped[0].reason.startswith("already ")

        deleted = delete_model.sync(client=client, name=name)
        assert deleted is not None and deleted.name == name
        # Errors are in the spec: the SDK parses them into a typed Problem.
        gone = get_model.sync_detailed(client=client, name=name)
        assert gone.status_code == HTTPStatus.NOT_FOUND
        assert isinstance(gone.parsed, Problem) and gone.parsed.status == 404
        assert name in gone.parsed.detail


@pytest.fixture(scope="module")
def npm_installed() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the TypeScript SDK cannot be built or run")
    # `npm ci` installs the pinned generator and compiler, then builds dist/ (`prepare`).
    run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS_DIR)
    return TS_DIR


def test_typescript_sdk_is_current(npm_installed: Path, tmp_path: Path) -> None:
    generate("typescript", tmp_path / "src")
    assert_same_tree(tmp_path / "src", npm_installed / "src")


def test_typescript_sdk_flow(npm_installed: Path, server: KilnServer, tmp_path: Path) -> None:
    model_path = tmp_path / "mlp.pt"
    model_path.write_bytes(MODELS["mlp"].torchscript())
    run(
        ["node", "--test", "test/"],
        cwd=npm_installed,
        timeout=180,
        KILN_URL=server.url,
        KILN_MODEL_PATH=str(model_path),
    )
