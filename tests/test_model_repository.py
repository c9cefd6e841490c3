"""A Triton model repository deployed as the API starts (`kiln serve --model-repository`, as
tritonserver's, and KServe's /mnt/models): every model that can serve does before the server
reports ready, one that cannot is logged and left out, and a restart deploys nothing twice."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from service.api.model_repository import fingerprint
from service.triton_repository import RepositoryError, version_loads
from tests.client import sample
from tests.models import MODELS
from tests.repositories import CONFIG_PBTXT, model_dir, scripted
from tests.servers import KilnServer, running, wait_until

MLP = MODELS["mlp"]


def versions(http: httpx.Client, name: str) -> list[int]:
    response = http.get(f"/v1/models/{name}")
    return [v["version"] for v in response.json()["versions"]] if response.status_code == 200 else []


def post_infer(http: httpx.Client, name: str, x: np.ndarray) -> httpx.Response:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    return http.post(f"/v2/models/{name}/infer", json=body)


def infer(http: httpx.Client, name: str, x: np.ndarray) -> np.ndarray:
    response = post_infer(http, name, x)
    assert response.status_code == 200, response.text
    return np.asarray(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(len(x), -1)


def start(data: Path, repo: Path, log: Path, **env: str) -> KilnServer:
    """Two worker processes: both deploy, one after the other, the second finding what the first did."""
    return KilnServer({"KILN_DATA_DIR": str(data), "KILN_MODEL_REPOSITORY": str(repo), **env}, log, workers=2)


def deployed(server: KilnServer, http: httpx.Client) -> None:
    """Until both processes have deployed (each answers readiness for itself)."""
    wait_until(lambda: server.log.read_text().count("model 'mlp' deployed") == 2, 180, "both deploys")
    wait_until(lambda: http.get("/readyz").status_code == 200, 60, "readiness")


def test_a_model_repository_is_deployed_before_the_server_is_ready(tmp_path: Path) -> None:
    repo, data = tmp_path / "models", tmp_path / "data"
    newer = scripted(7)
    served = model_dir(repo, "mlp", CONFIG_PBTXT, {"1": MLP.torchscript(), "2": newer})
    (served / "labels.txt").write_text("\n".join(f"class-{i}" for i in range(10)))
    unlabelled = CONFIG_PBTXT.replace(' label_filename: "labels.txt"', "")
    model_dir(repo, "broken", unlabelled, {"1": MLP.torchscript(), "2": b"not a model", "3": scripted(8)})
    model_dir(repo, "garbled", "max_batch_size: [", {"1": MLP.torchscript()})
    (repo / "notes").mkdir()

    server = start(data, repo, tmp_path / "first.log")
    with running(server), httpx.Client(base_url=server.url, timeout=60) as http:
        deployed(server, http)
        # What deployed serves; two processes deployed it, once.
        assert versions(http, "mlp") == [1, 2]
        assert versions(http, "broken") == [1]  # the failed version 2 keeps 3 out too
        assert versions(http, "garbled") == []
        x = sample(MLP, 3)
        with torch.inference_mode():
            want = torch.jit.load(io.BytesIO(newer))(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(infer(http, "mlp", x), want, rtol=1e-5, atol=1e-6)
        config = http.get("/v2/models/mlp/config").json()
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
        assert http.get("/v2/models/broken/ready").status_code == 200
        assert http.post("/v2/repository/models/mlp/unload").status_code == 200
    log = server.log.read_text()
    assert "model 'broken' version 2" in log and "versions 3 were left out" in log
    # One process deployed after the other, not beside it (where both could record a version).
    events = [
        "mlp" if "model 'mlp' deployed" in line else "broken"
        for line in log.splitlines()
        if "model 'mlp' deployed" in line or "model 'broken' version 2" in line
    ]
    assert events == ["broken", "mlp", "broken", "mlp"], log
    assert "garbled" in log and "config.pbtxt" in log
    assert "holds no config.pbtxt" in log
    assert "Traceback" not in log

    # A restart deploys nothing new, but a new version directory as Kiln's next version, and
    # serves what the repository holds, an unloaded model again too.
    model_dir(repo, "mlp", CONFIG_PBTXT, {"3": scripted(9)})
    again = start(data, repo, tmp_path / "again.log")
    with running(again), httpx.Client(base_url=again.url, timeout=60) as http:
        deployed(again, http)
        assert versions(http, "mlp") == [1, 2, 3]
        assert versions(http, "broken") == [1]
        assert http.get("/v1/models/mlp").json()["active"]["version"] == 3
        assert http.get("/v2/models/mlp/ready").status_code == 200
        assert http.put("/v1/models/mlp/default-version", json={"version": 1}).status_code == 200

    # What was deployed is known, not checked again by running it: a check could not finish now.
    third = start(data, repo, tmp_path / "third.log", KILN_VALIDATE_TIMEOUT_S="0.001")
    with running(third), httpx.Client(base_url=third.url, timeout=60) as http:
        deployed(third, http)
        assert versions(http, "mlp") == [1, 2, 3]
        # The repository did not change: the default version set through the API stays.
        assert http.get("/v1/models/mlp").json()["default_version"] == 1
        assert infer(http, "mlp", x).shape == (3, 10)
    assert "model 'mlp' version" not in third.log.read_text()


def test_a_polled_repository_deploys_the_model_directories_that_change(tmp_path: Path) -> None:
    """tritonserver's --repository-poll-secs: a new version, a new model and a changed serving
    setting are deployed as they appear, while the server serves; a version directory removed
    no longer serves requests naming none (a rollback), and a model directory removed is
    unloaded; a broken directory is logged once, not at every poll, and tried again when it
    changes. Each change is renamed into place, as the README asks, so that no poll reads it
    half-written."""
    repo, staging = tmp_path / "models", tmp_path / "staging"
    unlabelled = CONFIG_PBTXT.replace(' label_filename: "labels.txt"', "")
    served = model_dir(repo, "mlp", unlabelled, {"1": MLP.torchscript()})

    def put(made: Path, where: Path) -> None:
        where.parent.mkdir(parents=True, exist_ok=True)
        os.replace(made, where)

    env = {"KILN_DATA_DIR": str(tmp_path / "data"), "KILN_MODEL_REPOSITORY": str(repo)}
    server = KilnServer({**env, "KILN_MODEL_REPOSITORY_POLL_S": "0.3"}, tmp_path / "kiln.log")
    with running(server), httpx.Client(base_url=server.url, timeout=60) as http:
        wait_until(lambda: http.get("/readyz").status_code == 200, 120, "readiness")
        assert versions(http, "mlp") == [1]

        put(model_dir(staging, "mlp", unlabelled, {"2": scripted(3)}) / "2", served / "2")
        wait_until(lambda: versions(http, "mlp") == [1, 2], 60, "version 2")
        wait_until(lambda: http.get("/v1/models/mlp").json()["active"]["version"] == 2, 30, "it serving")

        # Its directory taken out, the newest version left serves; put back, it serves again.
        os.replace(served / "2", staging / "2")
        wait_until(lambda: http.get("/v1/models/mlp").json()["active"]["version"] == 1, 60, "the rollback")
        assert http.get("/v1/models/mlp").json()["default_version"] == 1
        put(staging / "2", served / "2")
        wait_until(lambda: http.get("/v1/models/mlp").json()["active"]["version"] == 2, 60, "version 2 again")
        assert http.get("/v1/models/mlp").json()["default_version"] is None

        # A version that fails leaves what served serving, and nothing pinned.
        put(model_dir(staging, "mlp", unlabelled, {"3": b"not a model"}) / "3", served / "3")
        wait_until(lambda: "model 'mlp' version 3" in server.log.read_text(), 60, "the failed version")
        model = http.get("/v1/models/mlp").json()
        assert (model["active"]["version"], model["default_version"]) == (2, None)
        os.replace(served / "3", staging / "broken-3")

        put(model_dir(staging, "late", unlabelled, {"1": MLP.torchscript()}), repo / "late")
        wait_until(lambda: versions(http, "late") == [1], 60, "the new model")
        assert infer(http, "late", sample(MLP, 2)).shape == (2, 10)
        os.replace(repo / "late", staging / "gone")
        wait_until(lambda: http.get("/v2/models/late/ready").status_code != 200, 60, "the unload")
        assert post_infer(http, "late", sample(MLP, 2)).status_code == 409
        wait_until(
            lambda: "model 'late' is no longer in the model repository" in server.log.read_text(),
            10,
            "its log",
        )
        put(staging / "gone", repo / "late")
        wait_until(lambda: http.get("/v2/models/late/ready").status_code == 200, 60, "the model back")
        assert infer(http, "late", sample(MLP, 2)).shape == (2, 10)

        (staging / "config.pbtxt").write_text(unlabelled.replace("500", "900"))
        put(staging / "config.pbtxt", served / "config.pbtxt")
        wait_until(
            lambda: (
                http.get("/v2/models/mlp/config").json()["dynamic_batching"]["max_queue_delay_microseconds"]
                == 900
            ),
            60,
            "the new delay",
        )
        assert versions(http, "mlp") == [1, 2]  # a serving setting: no new version

        put(model_dir(staging, "broken", unlabelled, {"1": b"not a model"}), repo / "broken")
        wait_until(lambda: "model 'broken' version 1" in server.log.read_text(), 60, "the failure")
        time.sleep(1.5)  # a few polls more
        assert server.log.read_text().count("model 'broken' version 1") == 1
        (staging / "model.pt").write_bytes(MLP.torchscript())
        put(staging / "model.pt", repo / "broken" / "1" / "model.pt")
        wait_until(lambda: versions(http, "broken") == [1], 60, "the fixed model")

        # A compiled setting changed records every version again. With a version that fails,
        # the version that served goes on serving, not the older ones recorded anew; once none
        # fails, the repository's newest serves.
        put(model_dir(staging, "mlp", unlabelled, {"3": b"not a model"}) / "3", served / "3")
        (staging / "config.pbtxt").write_text(
            unlabelled.replace("500", "900").replace("max_batch_size: 8", "max_batch_size: 4")
        )
        put(staging / "config.pbtxt", served / "config.pbtxt")
        wait_until(lambda: versions(http, "mlp") == [1, 2, 3, 4], 60, "versions recorded anew")
        wait_until(lambda: server.log.read_text().count("model 'mlp' version 3") >= 2, 60, "the failure")
        time.sleep(1.5)  # a few polls more: the deploy, if under way then, is done
        model = http.get("/v1/models/mlp").json()
        assert (model["active"]["version"], model["default_version"]) == (2, 2)
        # The setting put back, and then the version that failed taken out, the versions recorded
        # anew (3 and 4) are left behind: the held version goes on serving, as a default version.
        failures = server.log.read_text().count("model 'mlp' version 3")
        (staging / "config.pbtxt").write_text(unlabelled.replace("500", "900"))
        put(staging / "config.pbtxt", served / "config.pbtxt")
        wait_until(
            lambda: server.log.read_text().count("model 'mlp' version 3") > failures,
            60,
            "the reverted deploy",
        )
        wait_until(
            lambda: "model 'mlp' deployed" in server.log.read_text().rsplit("version 3", 1)[1], 60, "it done"
        )
        deploys = server.log.read_text().count("model 'mlp' deployed")
        os.replace(served / "3", staging / "broken-3-again")
        wait_until(
            lambda: server.log.read_text().count("model 'mlp' deployed") > deploys, 60, "the last deploy"
        )
        model = http.get("/v1/models/mlp").json()
        assert (model["active"]["version"], model["default_version"]) == (2, 2)
        assert versions(http, "mlp") == [1, 2, 3, 4]
    assert "Traceback" not in server.log.read_text()


def test_a_model_whose_directory_fails_after_a_restart_is_still_the_repositorys(tmp_path: Path) -> None:
    """A restart that cannot deploy a model's directory leaves the model as the store has it
    (other replicas may serve it); the directory's removal still unloads it."""
    repo, staging = tmp_path / "models", tmp_path / "staging"
    unlabelled = CONFIG_PBTXT.replace(' label_filename: "labels.txt"', "")
    served = model_dir(repo, "mlp", unlabelled, {"1": MLP.torchscript()})
    env = {"KILN_DATA_DIR": str(tmp_path / "data"), "KILN_MODEL_REPOSITORY": str(repo)}
    first = KilnServer(env, tmp_path / "first.log")
    with running(first), httpx.Client(base_url=first.url, timeout=60) as http:
        wait_until(lambda: http.get("/readyz").status_code == 200, 120, "readiness")
        assert versions(http, "mlp") == [1]

    (served / "config.pbtxt").write_text(unlabelled + "\nsequence_batching {}\n")
    second = KilnServer({**env, "KILN_MODEL_REPOSITORY_POLL_S": "0.3"}, tmp_path / "second.log")
    with running(second), httpx.Client(base_url=second.url, timeout=60) as http:
        wait_until(lambda: http.get("/readyz").status_code == 200, 120, "readiness")
        assert "sequence_batching" in second.log.read_text()
        assert http.get("/v2/models/mlp/ready").status_code == 200
        os.replace(served, staging)
        wait_until(lambda: http.get("/v2/models/mlp/ready").status_code == 409, 60, "the unload")


def test_a_version_policy_that_loads_older_versions_keeps_the_newest_serving(tmp_path: Path) -> None:
    """Loading every version where only the newest was: the older ones are recorded under newer
    Kiln numbers, and the repository's newest version goes on serving requests naming none."""
    repo = tmp_path / "models"
    unlabelled = CONFIG_PBTXT.replace(' label_filename: "labels.txt"', "")
    newest_only = unlabelled.replace("version_policy: { all { } }", "")
    served = model_dir(repo, "mlp", newest_only, {"1": scripted(1), "2": scripted(2)})
    env = {"KILN_DATA_DIR": str(tmp_path / "data"), "KILN_MODEL_REPOSITORY": str(repo)}
    server = KilnServer({**env, "KILN_MODEL_REPOSITORY_POLL_S": "0.3"}, tmp_path / "kiln.log")
    x = sample(MLP, 2)
    with running(server), httpx.Client(base_url=server.url, timeout=60) as http:
        wait_until(lambda: http.get("/readyz").status_code == 200, 120, "readiness")
        assert versions(http, "mlp") == [1]
        newest = infer(http, "mlp", x)

        (tmp_path / "config.pbtxt").write_text(unlabelled)
        os.replace(tmp_path / "config.pbtxt", served / "config.pbtxt")
        wait_until(lambda: versions(http, "mlp") == [1, 2], 60, "the older version recorded")
        wait_until(lambda: server.log.read_text().count("model 'mlp' deployed") == 2, 60, "the deploy")
        model = http.get("/v1/models/mlp").json()
        assert (model["active"]["version"], model["default_version"]) == (1, 1)
        np.testing.assert_array_equal(infer(http, "mlp", x), newest)


def test_file_names_in_a_config_stay_in_the_model_directory(tmp_path: Path) -> None:
    unlabelled = CONFIG_PBTXT.replace(' label_filename: "labels.txt"', "")
    for field, config in (
        ("label_filename", CONFIG_PBTXT.replace('"labels.txt"', '".."')),
        ("default_model_filename", unlabelled + '\ndefault_model_filename: "../../secret.pt"\n'),
    ):
        made = model_dir(tmp_path / field, "mlp", config, {"1": MLP.torchscript()})
        with pytest.raises(RepositoryError, match=f"{field} .* must name a file"):
            version_loads(made)


@pytest.mark.timeout(60)
def test_a_fingerprint_sees_what_a_load_reads_and_no_link_loop(tmp_path: Path) -> None:
    """A version directory linking to itself twice made 2^40 paths to walk: the deploy hung."""
    made = model_dir(tmp_path, "mlp", CONFIG_PBTXT, {"1": MLP.torchscript()})
    (made / "labels.txt").write_text("a\nb\n")
    for link in "abc":
        (made / "1" / link).symlink_to(".")
    before = fingerprint(made)
    assert {path for path, _, _ in before} == {"config.pbtxt", "labels.txt", "1/model.pt"}
    (made / "1" / "model.pt").write_bytes(MLP.torchscript() + b"\0")
    assert fingerprint(made) != before


def test_a_load_reads_the_model_directory_again_and_the_index_says_why_one_is_missing(tmp_path: Path) -> None:
    """As tritonserver's: a model whose directory did not deploy is in the index, UNAVAILABLE
    with the reason; a load deploys its directory again (a fixed file, a new version), or
    answers 400 with why not."""
    repo = tmp_path / "models"
    unlabelled = CONFIG_PBTXT.replace(' label_filename: "labels.txt"', "")
    good = model_dir(repo, "good", unlabelled, {"1": MLP.torchscript()})
    broken = model_dir(repo, "broken", unlabelled, {"1": b"not a model"})
    gone = model_dir(repo, "gone", unlabelled, {"1": b"not a model"})
    server = KilnServer(
        {"KILN_DATA_DIR": str(tmp_path / "data"), "KILN_MODEL_REPOSITORY": str(repo)}, tmp_path / "kiln.log"
    )
    with running(server), httpx.Client(base_url=server.url, timeout=120) as http:
        wait_until(lambda: http.get("/readyz").status_code == 200, 120, "readiness")
        index = {entry["name"]: entry for entry in http.post("/v2/repository/index").json()}
        assert index["good"]["state"] == "READY"
        assert index["broken"]["state"] == "UNAVAILABLE"
        assert index["broken"]["reason"].startswith("version 1 did not load: "), index["broken"]
        assert [e["name"] for e in http.post("/v2/repository/index", json={"ready": True}).json()] == ["good"]

        response = http.post("/v2/repository/models/broken/load")
        assert response.status_code == 400
        assert response.json()["error"].startswith(f"model 'broken' did not load from {broken}: version 1")
        (broken / "1" / "model.pt").write_bytes(MLP.torchscript())
        assert http.post("/v2/repository/models/broken/load").status_code == 200
        assert versions(http, "broken") == [1]
        assert infer(http, "broken", sample(MLP, 2)).shape == (2, 10)
        assert {e["name"]: e["state"] for e in http.post("/v2/repository/index").json()}["broken"] == "READY"

        model_dir(tmp_path / "staging", "good", unlabelled, {"2": scripted(3)})
        os.replace(tmp_path / "staging" / "good" / "2", good / "2")
        assert http.post("/v2/repository/models/good/load").status_code == 200
        assert versions(http, "good") == [1, 2]
        assert http.get("/v1/models/good").json()["active"]["version"] == 2
        # A version uploaded through the API serves on through a load of the directory.
        config = json.dumps(MLP.config(name="good", backends=[]))
        made = http.post("/v1/models", files={"file": ("m.pt", scripted(5))}, data={"config": config})
        assert made.status_code == 202, made.text
        assert http.post("/v2/repository/models/good/load").status_code == 200
        model = http.get("/v1/models/good").json()
        assert (model["active"]["version"], model["default_version"]) == (3, None)
        # A directory that failed, and is gone since, leaves the index once a load looks for it.
        assert "gone" in {e["name"] for e in http.post("/v2/repository/index").json()}
        os.replace(gone, tmp_path / "staging" / "gone")
        assert http.post("/v2/repository/models/gone/load").status_code == 404
        assert "gone" not in {e["name"] for e in http.post("/v2/repository/index").json()}
        # A name that is no model directory (the repository's parent, say) is no model.
        assert http.post("/v2/repository/models/../load").status_code == 404
        assert http.post("/v2/repository/models/%2E%2E/load").status_code == 404
    assert "Traceback" not in server.log.read_text()
