"""Triton's load with a model configuration and files, against a real server through tritonclient
unchanged (HTTP and gRPC): a model file uploads a new version configured by Triton's model
configuration, a configuration alone changes how the serving version is served, and whatever
Kiln would not do as asked is refused with a message that says what to change, leaving the
model as it was."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from torch import nn
from tritonclient.utils import InferenceServerException

from tests import models
from tests.client import expected, infer_body, sample, upload
from tests.repositories import CONFIG_PBTXT, model_dir, scripted
from tests.servers import ROOT, KilnServer

ADMIN, INFER = "admin-secret", "infer-secret"
MLP = models.MODELS["mlp"]
CNN = models.MODELS["cnn"]
LABELS = [f"class-{i}" for i in range(10)]


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def user() -> dict[str, str]:
    return {"Authorization": f"Bearer {INFER}"}


def triton_config(name: str, **extra: Any) -> dict[str, Any]:
    """The MLP's configuration as a Triton user writes it: batch left out of the dims."""
    return {
        "name": name,
        "platform": "pytorch_libtorch",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [64]}],
        "output": [{"name": "output0", "data_type": "TYPE_FP32", "dims": [10]}],
        "parameters": {"backends": {"string_value": "[]"}},  # TorchScript alone: nothing to compile
        **extra,
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    root = tmp_path_factory.mktemp("triton-load")
    env = {
        "KILN_DATA_DIR": str(root / "data"),
        "KILN_API_KEYS": f"{ADMIN}:admin,{INFER}:infer",
        "KILN_MAX_UPLOAD_MB": "1",  # the MLP's file is about 0.1 MB
    }
    srv = KilnServer(env, root / "kiln.log")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: KilnServer) -> Iterator[triton.InferenceServerClient]:
    triton_client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    yield triton_client
    triton_client.close()


def versions(server: KilnServer, name: str) -> list[int]:
    response = httpx.get(f"{server.url}/v1/models/{name}", headers=admin())
    if response.status_code == 404:
        return []
    return [v["version"] for v in response.json()["versions"]]


def infer(client: triton.InferenceServerClient, name: str, x: np.ndarray, **output: Any) -> Any:
    tensor = triton.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    outputs = [triton.InferRequestedOutput("output0", **output)]
    return client.infer(name, [tensor], outputs=outputs, headers=user())


def test_tritonclient_uploads_a_model_with_its_configuration(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    config = triton_config(
        "loaded",
        output=[{"name": "output0", "data_type": "TYPE_FP32", "dims": [10], "label_filename": "labels.txt"}],
        dynamic_batching={"max_queue_delay_microseconds": 2000, "preferred_batch_size": [4]},
        instance_group=[{"count": 2, "kind": "KIND_CPU"}],
        response_cache={"enable": True},
    )
    files = {"file:1/model.pt": MLP.torchscript(), "file:labels.txt": "\n".join(LABELS).encode()}
    client.load_model("loaded", config=json.dumps(config), files=files, headers=admin())

    assert client.is_model_ready("loaded", headers=user())
    x = sample(MLP, 3)
    np.testing.assert_allclose(
        infer(client, "loaded", x).as_numpy("output0"), expected(MLP, x), rtol=1e-5, atol=1e-6
    )
    top = infer(client, "loaded", x[:1], class_count=1).as_numpy("output0")[0, 0].decode()
    assert top.split(":")[2] == LABELS[int(np.argmax(expected(MLP, x[:1])))]

    shown = client.get_model_config("loaded", headers=user())
    assert shown["max_batch_size"] == 8
    assert shown["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [64]}]
    assert shown["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert shown["dynamic_batching"]["preferred_batch_size"] == [4]
    assert shown["instance_group"][0]["count"] == 2
    assert shown["response_cache"] == {"enable": True}
    assert versions(server, "loaded") == [1]

    # What get_model_config returns loads back unchanged: no new version, the same settings.
    client.load_model("loaded", config=json.dumps(shown), headers=admin())
    assert client.get_model_config("loaded", headers=user()) == shown
    # The same file and configuration again is the same version, as an upload is.
    client.load_model("loaded", config=json.dumps(config), files=files, headers=admin())
    assert versions(server, "loaded") == [1]


def test_a_configuration_alone_reconfigures_the_serving_version(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    files = {"file:1/model.pt": MLP.torchscript()}
    config = triton_config("edited", dynamic_batching={"max_queue_delay_microseconds": 1000})
    client.load_model("edited", config=json.dumps(config), files=files, headers=admin())
    # As Triton reads an edited configuration: what it sets applies, and what it leaves out
    # returns to its default (here the instance count, and the labels).
    edited = triton_config(
        "edited",
        dynamic_batching={
            "max_queue_delay_microseconds": 5000,
            "priority_levels": 2,
            "default_priority_level": 2,
            "default_queue_policy": {"max_queue_size": 7, "default_timeout_microseconds": 90000},
        },
        parameters={"adaptive_queue_delay": {"string_value": "false"}},
    )
    del edited["input"], edited["output"]  # what was compiled may be left out
    client.load_model("edited", config=json.dumps(edited), headers=admin())
    batching = client.get_model_config("edited", headers=user())["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 5000
    assert (batching["priority_levels"], batching["default_priority_level"]) == (2, 2)
    assert batching["default_queue_policy"]["max_queue_size"] == 7
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 90000
    assert (
        client.get_model_config("edited", headers=user())["parameters"]["adaptive_queue_delay"][
            "string_value"
        ]
        == "false"
    )
    assert versions(server, "edited") == [1]
    # Without dynamic_batching, the batching settings return to Kiln's defaults.
    client.load_model("edited", config=json.dumps({"max_batch_size": 8}), headers=admin())
    assert (
        client.get_model_config("edited", headers=user())["dynamic_batching"]["max_queue_delay_microseconds"]
        == 0
    )

    # Another file is a new version, which serves.
    files = {"file:2/model.pt": CNN.torchscript()}
    cnn = triton_config(
        "edited",
        input=[{"name": "x", "data_type": "TYPE_FP32", "dims": [3, 16, 16]}],
        output=[{"name": "output0", "data_type": "TYPE_FP32", "dims": [-1]}],
    )
    client.load_model("edited", config=json.dumps(cnn), files=files, headers=admin())
    assert versions(server, "edited") == [1, 2]
    x = sample(CNN, 2)
    np.testing.assert_allclose(
        infer(client, "edited", x).as_numpy("output0"), expected(CNN, x), rtol=1e-4, atol=1e-5
    )


def test_a_configuration_taken_from_triton_loads(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    """What Triton's get_model_config returns for a PyTorch model, defaults written out and hints
    to its own execution included: Kiln accepts the hints and applies the rest."""
    config = {
        "name": "from-triton",
        "platform": "pytorch_libtorch",
        "backend": "pytorch",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 8,
        "input": [
            {
                "name": "x",
                "data_type": "TYPE_FP32",
                "format": "FORMAT_NONE",
                "dims": ["64"],
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": False,
            }
        ],
        "output": [
            {
                "name": "output0",
                "data_type": "TYPE_FP32",
                "dims": ["10"],
                "label_filename": "",
                "is_shape_tensor": False,
            }
        ],
        "batch_input": [],
        "batch_output": [],
        "optimization": {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": True}},
        "dynamic_batching": {
            "preferred_batch_size": [4],
            "max_queue_delay_microseconds": "3000",
            "preserve_ordering": False,
            "priority_levels": "0",
            "default_priority_level": "0",
            "priority_queue_policy": {},
        },
        "instance_group": [
            {
                "name": "from-triton_0",
                "kind": "KIND_GPU",
                "count": 2,
                "gpus": [0],
                "secondary_devices": [],
                "profile": [],
                "passive": False,
                "host_policy": "",
            }
        ],
        "default_model_filename": "model.pt",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {"backends": {"string_value": "[]"}},
        "model_warmup": [],
    }
    client.load_model(
        "from-triton",
        config=json.dumps(config),
        files={"file:1/model.pt": MLP.torchscript()},
        headers=admin(),
    )
    shown = client.get_model_config("from-triton", headers=user())
    assert shown["dynamic_batching"]["max_queue_delay_microseconds"] == 3000
    assert shown["instance_group"][0]["count"] == 2
    for field, value, message in [
        ("version_policy", {"specific": {"versions": [1]}}, "not specific ones"),
        ("instance_group", [{"count": 1, "passive": True}], "Kiln does not apply ['passive']"),
        ("sequence_batching", {"max_sequence_idle_microseconds": 5}, "['sequence_batching']"),
        ("ensemble_scheduling", {"step": []}, "['ensemble_scheduling']"),
    ]:
        with pytest.raises(InferenceServerException, match=re.escape(message)):
            refused = {k: v for k, v in config.items() if k != "dynamic_batching"}  # a oneof with these
            client.load_model("from-triton", config=json.dumps({**refused, field: value}), headers=admin())


def test_an_unloaded_model_loaded_with_a_configuration_serves_again(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    config = triton_config("revived")
    client.load_model(
        "revived", config=json.dumps(config), files={"file:1/model.pt": MLP.torchscript()}, headers=admin()
    )
    client.unload_model("revived", headers=admin())
    assert not client.is_model_ready("revived", headers=user())
    client.load_model(
        "revived", config=json.dumps({"instance_group": [{"count": 1}, {"count": 2}]}), headers=admin()
    )
    assert client.is_model_ready("revived", headers=user())
    assert client.get_model_config("revived", headers=user())["instance_group"][0]["count"] == 3


def serving(server: KilnServer, name: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/v1/models/{name}/versions/1", headers=admin())
    assert response.status_code == 200, response.text
    settings: dict[str, Any] = response.json()["serving"]
    return settings


def test_what_kiln_shows_loads_back_as_it_was(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    """Loading back what get_model_config returns changes nothing: not settings it cannot show
    (a model that cannot batch shows no queue policy), nor server defaults it shows resolved."""
    with httpx.Client(base_url=server.url, headers=admin(), timeout=60) as http:
        static = [{"name": "x", "dtype": "float32", "shape": [2, 64]}]  # cannot batch: no -1
        for name, config in [
            ("static", {"inputs": static, "max_queue_size": 5, "default_timeout_us": 1000}),
            ("defaults", {"labels": {"output0": LABELS}}),
            ("wide", {"instances": 9}),  # more than the lanes it shows (KILN_INFERENCE_WORKERS)
            ("one", {"max_batch_size": 1}),  # shown with max_batch_size 0 and the rows it takes
            ("alone", {"dynamic_batching": False}),
        ]:
            assert upload(http, MLP, name=name, backends=[], **config).status_code == 202, name
            before = serving(server, name)
            shown = client.get_model_config(name, headers=user())
            client.load_model(name, config=json.dumps(shown), headers=admin())
            assert serving(server, name) == before, name
            assert client.get_model_config(name, headers=user()) == shown
    # The labels are shown as a file, and kept while the configuration names it.
    [output] = client.get_model_config("defaults", headers=user())["output"]
    assert output["label_filename"] == "output0_labels.txt"
    assert serving(server, "defaults")["max_queue_size"] is None  # the server default, not pinned


def test_what_was_compiled_may_be_restated(server: KilnServer, client: triton.InferenceServerClient) -> None:
    config = triton_config("restated")
    client.load_model(
        "restated", config=json.dumps(config), files={"file:1/model.pt": MODEL}, headers=admin()
    )
    config["parameters"]["rtol"] = {"string_value": "0.0001"}  # the default, as stored
    config["parameters"]["INFERENCE_MODE"] = {"string_value": "true"}  # PyTorch's hint
    config["model_transaction_policy"] = {"decoupled": False}
    config["input"][0]["format"] = "FORMAT_NONE"
    config["dynamic_batching"] = {"max_queue_delay_microseconds": 700}
    client.load_model("restated", config=json.dumps(config), headers=admin())
    assert serving(server, "restated")["max_queue_delay_us"] == 700
    assert versions(server, "restated") == [1]


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 3), nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x)


TWO_HEADS = models.TestModel("two-heads", TwoHeads, MLP.inputs)


class Difference(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a - b


def difference() -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(Difference()), buf)
    return buf.getvalue()


def test_outputs_may_share_a_label_file(server: KilnServer, client: triton.InferenceServerClient) -> None:
    heads = [
        {"name": f"output{i}", "data_type": "TYPE_FP32", "dims": [3], "label_filename": "l.txt"}
        for i in (0, 1)
    ]
    config = json.dumps(triton_config("shared", output=heads))
    files = {"file:1/model.pt": TWO_HEADS.torchscript(), "file:l.txt": b"a\nb\nc"}
    client.load_model("shared", config=config, files=files, headers=admin())
    assert serving(server, "shared")["labels"] == {"output0": ["a", "b", "c"], "output1": ["a", "b", "c"]}
    client.load_model("shared", config=config, files={"file:l.txt": b"x\ny\nz"}, headers=admin())
    assert serving(server, "shared")["labels"] == {"output0": ["x", "y", "z"], "output1": ["x", "y", "z"]}


def test_outputs_are_served_under_the_names_the_configuration_gives(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    """Triton's PyTorch backend reads an output named <name>__<index> as the model's index-th,
    however the configuration orders them, and otherwise takes the configuration's order as the
    model's; an input is the model's argument at its place. Kiln serves the outputs under those
    names, on every protocol, and an upload config names them with `output_names`."""
    x = sample(MLP, 3)
    with torch.inference_mode():
        heads = [t.numpy() for t in TWO_HEADS.module()(torch.from_numpy(x))]
    indexed = [
        {"name": "OUTPUT__1", "data_type": "TYPE_FP32", "dims": [3], "label_filename": "l.txt"},
        {"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [3]},
    ]
    ordered = [{"name": n, "data_type": "TYPE_FP32", "dims": [3]} for n in ("logits", "scores")]
    inputs = [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [64]}]
    for name, outputs, served in [
        ("indexed", indexed, ["OUTPUT__0", "OUTPUT__1"]),
        ("ordered", ordered, ["logits", "scores"]),
    ]:
        config = json.dumps(triton_config(name, input=inputs, output=outputs))
        labels = {"file:l.txt": b"a\nb\nc"} if name == "indexed" else {}
        client.load_model(
            name, config=config, files={"file:1/model.pt": TWO_HEADS.torchscript(), **labels}, headers=admin()
        )
        metadata = client.get_model_metadata(name, headers=user())
        assert [o["name"] for o in metadata["outputs"]] == served
        assert [o["name"] for o in client.get_model_config(name, headers=user())["output"]] == served
        client.load_model(name, config=config, headers=admin())  # what it shows loads back
        tensor = triton.InferInput("INPUT__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        result = client.infer(
            name, [tensor], outputs=[triton.InferRequestedOutput(served[1])], headers=user()
        )
        np.testing.assert_allclose(result.as_numpy(served[1]), heads[1], rtol=1e-5, atol=1e-6)
        assert result.as_numpy(served[0]) is None  # not asked for
    assert serving(server, "indexed")["labels"] == {"OUTPUT__1": ["a", "b", "c"]}
    tensor = triton.InferInput("INPUT__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    ranked = triton.InferRequestedOutput("OUTPUT__1", class_count=1)
    top = client.infer("indexed", [tensor], outputs=[ranked], headers=user()).as_numpy("OUTPUT__1")
    assert [row[0].decode().split(":")[1:] for row in top] == [
        [str(i), "abc"[i]] for i in heads[1].argmax(axis=1)
    ]

    for outputs, message in [
        ([indexed[1], {**indexed[1], "name": "LOGITS__0"}], "'OUTPUT__0' and 'LOGITS__0' are both output 0"),
        ([{**indexed[1], "name": "OUTPUT__2"}], "name 3 outputs; the model returns 2"),
        ([{**indexed[1], "name": "OUTPUT__256"}], "Kiln reads indices below 256"),
    ]:
        with pytest.raises(InferenceServerException, match=re.escape(message)):
            config = json.dumps(triton_config("misnamed", input=inputs, output=outputs))
            client.load_model(
                "misnamed", config=config, files={"file:1/model.pt": TWO_HEADS.torchscript()}, headers=admin()
            )

    # A configuration alone may not move the names to other outputs: that takes a new version.
    swapped = json.dumps(triton_config("ordered", input=inputs, output=ordered[::-1]))
    with pytest.raises(
        InferenceServerException, match=re.escape("serves its outputs as ['logits', 'scores']")
    ):
        client.load_model("ordered", config=swapped, headers=admin())

    # Inputs are the model's arguments by their <name>__<index>, or by forward()'s argument
    # names (forward(a, b)), however listed.
    y = sample(MLP, 3, seed=2)
    for name, inputs in [
        ("by-index", ("B__1", "A__0")),
        ("by-argument", ("b", "a")),
        ("in-order", ("p", "q")),
    ]:
        config = triton_config(
            name,
            input=[{"name": n, "data_type": "TYPE_FP32", "dims": [64]} for n in inputs],
            output=[{"name": "DIFF__0", "data_type": "TYPE_FP32", "dims": [64]}],
        )
        client.load_model(
            name, config=json.dumps(config), files={"file:1/model.pt": difference()}, headers=admin()
        )
        first, second = inputs if name == "in-order" else sorted(inputs, key=str.lower)
        assert [t["name"] for t in client.get_model_metadata(name, headers=user())["inputs"]] == [
            first,
            second,
        ]
        tensors = [triton.InferInput(n, list(x.shape), "FP32") for n in (first, second)]
        for tensor, data in zip(tensors, (x, y), strict=True):
            tensor.set_data_from_numpy(data)
        np.testing.assert_allclose(client.infer(name, tensors, headers=user()).as_numpy("DIFF__0"), x - y)
        client.load_model(name, config=json.dumps(config), headers=admin())  # as it was: no change
    # Inputs not named after forward()'s arguments are in the order given: another is another model.
    swapped_inputs = triton_config(
        "in-order",
        input=[{"name": n, "data_type": "TYPE_FP32", "dims": [64]} for n in ("q", "p")],
        output=[{"name": "DIFF__0", "data_type": "TYPE_FP32", "dims": [64]}],
    )
    with pytest.raises(InferenceServerException, match=re.escape("['inputs'] differ from version 1's")):
        client.load_model("in-order", config=json.dumps(swapped_inputs), headers=admin())
    partial = triton_config(
        "partial",
        input=[{"name": "b", "data_type": "TYPE_FP32", "dims": [64]}],
        output=[{"name": "DIFF__0", "data_type": "TYPE_FP32", "dims": [64]}],
    )
    with pytest.raises(InferenceServerException, match=re.escape("not its first 1: give ['a']")):
        client.load_model(
            "partial", config=json.dumps(partial), files={"file:1/model.pt": difference()}, headers=admin()
        )

    with httpx.Client(base_url=server.url, headers=admin(), timeout=60) as http:
        assert upload(http, TWO_HEADS, name="named", backends=[], output_names=["logits"]).status_code == 202
        predicted = http.post("/v1/models/named/predict", json={"inputs": {"x": x.tolist()}})
        assert predicted.status_code == 200, predicted.text
        assert sorted(predicted.json()["outputs"]) == ["logits", "output1"]  # the second keeps its name
        same = upload(http, TWO_HEADS, name="named", backends=[], output_names=["logits", "output1"])
        assert same.json()["version"] == 1  # a name Kiln gives anyway changes nothing
        plain = upload(http, TWO_HEADS, name="named", backends=[], output_names=["output0", "output1"])
        assert plain.json()["version"] == 2 and versions(server, "named") == [1, 2]  # Kiln's own names
        again = upload(http, TWO_HEADS, name="named", backends=[])
        assert again.json()["version"] == 2 and versions(server, "named") == [1, 2]  # the same upload
        for names, message in [
            (["a", "a"], "unique"),
            (["output1"], "'output1', 'output1'"),
            (["b__1", "a__0"], "'b__1' names output 1"),
        ]:
            refused = upload(http, TWO_HEADS, name="named", backends=[], output_names=names)
            assert refused.status_code == 422 and message in refused.text, refused.text
        swapped = [{"name": n, "dtype": "float32", "shape": [-1, 64]} for n in ("b__1", "a__0")]
        refused = upload(http, TWO_HEADS, name="named", backends=[], inputs=swapped)
        assert refused.status_code == 422 and "listed by index from 0" in refused.text, refused.text


def test_priorities_and_a_queue_policy_apply_as_stated(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    with httpx.Client(base_url=server.url, headers=admin(), timeout=60) as http:
        assert upload(http, MLP, name="levels", backends=[], priority_levels=3).status_code == 202
        static = [{"name": "x", "dtype": "float32", "shape": [2, 64]}]
        queued = {"default_timeout_us": 1000, "max_queue_size": 5}
        assert upload(http, MLP, name="unbatched", inputs=static, backends=[], **queued).status_code == 202
    # The default level is shown resolved (3, the lowest); stated with other levels, it is kept.
    shown = client.get_model_config("levels", headers=user())
    assert shown["dynamic_batching"]["default_priority_level"] == 3
    shown["dynamic_batching"]["priority_levels"] = 5
    client.load_model("levels", config=json.dumps(shown), headers=admin())
    assert (
        serving(server, "levels")["priority_levels"],
        serving(server, "levels")["default_priority_level"],
    ) == (5, 3)
    shown["dynamic_batching"]["priority_levels"] = 2
    with pytest.raises(
        InferenceServerException, match=re.escape("default_priority_level: 3 must lie in 1..priority_levels")
    ):
        client.load_model("levels", config=json.dumps(shown), headers=admin())
    # A model that cannot batch shows no queue policy; one stated applies whole: no timeout.
    policy = {"max_batch_size": 0, "dynamic_batching": {"default_queue_policy": {"max_queue_size": 7}}}
    client.load_model("unbatched", config=json.dumps(policy), headers=admin())
    assert (
        serving(server, "unbatched")["max_queue_size"],
        serving(server, "unbatched")["default_timeout_us"],
    ) == (7, None)


def test_a_first_dimension_that_is_not_a_batch_takes_rows_never_merged(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    """Triton's max_batch_size 0 with dims [-1, ...]: a request of any number of rows, up to
    Kiln's max_batch_size (the server's default, or the parameter), runs alone, never merged,
    as Triton runs it (nothing says the rows are a batch). What is shown loads back as it was."""
    config = triton_config(
        "rows",
        max_batch_size=0,
        input=[{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 64]}],
        output=[{"name": "output0", "data_type": "TYPE_FP32", "dims": [-1, 10]}],
    )
    model = {"file:1/model.pt": MLP.torchscript()}
    client.load_model("rows", config=json.dumps(config), files=model, headers=admin())
    shown = client.get_model_config("rows", headers=user())
    assert (shown["max_batch_size"], shown["input"][0]["dims"], shown["output"][0]["dims"]) == (
        0,
        [-1, 64],
        [-1, 10],
    )
    assert shown["parameters"] == {"max_batch_size": {"string_value": "8"}}  # the server's default
    assert "dynamic_batching" not in shown and serving(server, "rows")["dynamic_batching"] is False
    xs = [sample(MLP, 2, seed=seed) for seed in range(8)]

    async def burst() -> list[httpx.Response]:  # at once: tritonclient's HTTP client is one thread's
        async with httpx.AsyncClient(base_url=server.url, headers=user(), timeout=60) as http:
            return await asyncio.gather(*(http.post("/v2/models/rows/infer", json=infer_body(x)) for x in xs))

    for x, answer in zip(xs, asyncio.run(burst()), strict=True):
        assert answer.status_code == 200, answer.text
        got = np.asarray(answer.json()["outputs"][0]["data"], np.float32).reshape(2, 10)
        np.testing.assert_allclose(got, expected(MLP, x), rtol=1e-5, atol=1e-6)
    [stats] = client.get_inference_statistics("rows", headers=user())["model_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (16, 8)  # a run each, none merged
    with pytest.raises(InferenceServerException, match="batch size 9 is over this model's max_batch_size 8"):
        infer(client, "rows", sample(MLP, 9))
    for again in (shown, config):
        client.load_model("rows", config=json.dumps(again), headers=admin())
    # A configuration that states no inputs keeps them as shown: still rows, never merged.
    client.load_model("rows", config=json.dumps({"instance_group": [{"count": 2}]}), headers=admin())
    assert (serving(server, "rows")["dynamic_batching"], serving(server, "rows")["instances"]) == (False, 2)
    assert client.get_model_config("rows", headers=user())["max_batch_size"] == 0
    assert versions(server, "rows") == [1]
    # More rows are compiled: a new version, with the model file.
    shown["parameters"]["max_batch_size"]["string_value"] = "16"
    shown["parameters"]["backends"] = {"string_value": "[]"}
    with pytest.raises(InferenceServerException, match=re.escape("['max_batch_size'] differ")):
        client.load_model("rows", config=json.dumps(shown), headers=admin())
    client.load_model("rows", config=json.dumps(shown), files=model, headers=admin())
    assert versions(server, "rows") == [1, 2]
    assert infer(client, "rows", sample(MLP, 12)).as_numpy("output0").shape == (12, 10)
    # The parameter is for such a model alone: a batching one's rows are its max_batch_size.
    batching = triton_config("rows-batched", parameters={"max_batch_size": {"string_value": "16"}})
    with pytest.raises(InferenceServerException, match="set max_batch_size itself"):
        client.load_model("rows-batched", config=json.dumps(batching), files=model, headers=admin())


def test_a_batch_of_one_reloads_as_it_loaded(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    """max_batch_size 1 leaves the batch out of the dims, with a file and without."""
    config = json.dumps(triton_config("one", max_batch_size=1))
    client.load_model("one", config=config, files={"file:1/model.pt": MODEL}, headers=admin())
    client.load_model("one", config=config, headers=admin())
    assert versions(server, "one") == [1]


def test_tritonclient_grpc_uploads_a_model(server: KilnServer) -> None:
    """Over gRPC the file is a bytes parameter, not base64."""
    grpc_admin = {"authorization": f"Bearer {ADMIN}"}
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        config = triton_config("over-grpc")
        client.load_model(
            "over-grpc",
            config=json.dumps(config),
            files={"file:1/model.pt": MLP.torchscript()},
            headers=grpc_admin,
        )
        assert client.is_model_ready("over-grpc", headers={"authorization": f"Bearer {INFER}"})
        x = sample(MLP, 2)
        tensor = triton_grpc.InferInput("x", [2, 64], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("over-grpc", [tensor], headers={"authorization": f"Bearer {INFER}"})
        np.testing.assert_allclose(result.as_numpy("output0"), expected(MLP, x), rtol=1e-5, atol=1e-6)
        with pytest.raises(InferenceServerException, match="Kiln does not apply") as caught:
            bad = triton_config("over-grpc", sequence_batching={})
            client.load_model(
                "over-grpc",
                config=json.dumps(bad),
                files={"file:1/model.pt": MLP.torchscript()},
                headers=grpc_admin,
            )
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert versions(server, "over-grpc") == [1]


MODEL = MLP.torchscript()
REFUSED = [
    (
        "not json",
        {"config": "{", "files": {"file:1/model.pt": MODEL}},
        400,
        "not a Triton model configuration",
    ),
    ("unknown field", {"config": {"max_batch_sizes": 8}}, 400, "has no field named"),
    (
        "sequence batching",
        {"config": triton_config("refused", sequence_batching={}), "files": {"file:1/model.pt": MODEL}},
        400,
        "Kiln does not apply ['sequence_batching']",
    ),
    (
        "onnx",
        {
            "config": triton_config("refused", platform="onnxruntime_onnx"),
            "files": {"file:1/model.onnx": MODEL},
        },
        400,
        "Kiln serves TorchScript",
    ),
    (
        "another name",
        {"config": triton_config("other"), "files": {"file:1/model.pt": MODEL}},
        400,
        "is not the model loaded",
    ),
    (
        "two versions",
        {"config": triton_config("refused"), "files": {"file:1/model.pt": MODEL, "file:2/model.pt": MODEL}},
        400,
        "give one model file",
    ),
    (
        "a stray file",
        {"config": triton_config("refused"), "files": {"file:1/model.pt": MODEL, "file:notes.txt": b"hi"}},
        400,
        "Kiln does not use ['file:notes.txt']",
    ),
    (
        "a missing label file",
        {
            "config": triton_config(
                "refused",
                output=[
                    {"name": "output0", "data_type": "TYPE_FP32", "dims": [10], "label_filename": "l.txt"}
                ],
            ),
            "files": {"file:1/model.pt": MODEL},
        },
        400,
        "send the file too",
    ),
    (
        "strings",
        {
            "config": triton_config(
                "refused", input=[{"name": "x", "data_type": "TYPE_STRING", "dims": [64]}]
            ),
            "files": {"file:1/model.pt": MODEL},
        },
        400,
        "data_type TYPE_STRING",
    ),
    (
        # An output's type alone: the refusal of another input type listed it, and then a 422.
        "an input of an output's type",
        {
            "config": triton_config(
                "refused", input=[{"name": "x", "data_type": "TYPE_UINT16", "dims": [64]}]
            ),
            "files": {"file:1/model.pt": MODEL},
        },
        400,
        "data_type TYPE_UINT16; Kiln serves inputs of ['TYPE_BOOL', 'TYPE_FP16', 'TYPE_FP32', 'TYPE_FP64', "
        "'TYPE_INT16', 'TYPE_INT32', 'TYPE_INT64', 'TYPE_INT8', 'TYPE_UINT8']",
    ),
    (
        "an output the model does not have",
        {
            "config": triton_config(
                "refused",
                output=[{"name": n, "data_type": "TYPE_FP32", "dims": [10]} for n in ("logits", "scores")],
            ),
            "files": {"file:1/model.pt": MODEL},
        },
        422,
        "name 2 outputs; the model returns 1",
    ),
    (
        "wrong output dims",
        {
            "config": triton_config(
                "refused", output=[{"name": "output0", "data_type": "TYPE_FP32", "dims": [9]}]
            ),
            "files": {"file:1/model.pt": MODEL},
        },
        422,
        "dims [9], but the model's are [10]",
    ),
    (
        "an unknown parameter",
        {
            "config": triton_config("refused", parameters={"batching": {"string_value": "1"}}),
            "files": {"file:1/model.pt": MODEL},
        },
        400,
        "Kiln does not know ['batching']",
    ),
    (
        "a parameter not JSON",
        {
            "config": triton_config("refused", parameters={"backends": {"string_value": "tvm"}}),
            "files": {"file:1/model.pt": MODEL},
        },
        400,
        "must be JSON",
    ),
    (
        "an unknown backend",
        {
            "config": triton_config("refused", parameters={"backends": {"string_value": '["nope"]'}}),
            "files": {"file:1/model.pt": MODEL},
        },
        422,
        "unknown backend(s) ['nope']",
    ),
    (
        "too many instances",
        {
            "config": triton_config("refused", instance_group=[{"count": 65}]),
            "files": {"file:1/model.pt": MODEL},
        },
        422,
        "instances",
    ),
    (
        "not torchscript",
        {"config": triton_config("refused"), "files": {"file:1/model.pt": b"not a model"}},
        400,
        "TorchScript",
    ),
    ("no inputs", {"config": {"max_batch_size": 8}, "files": {"file:1/model.pt": MODEL}}, 400, "input: list"),
    ("an array", {"config": "[]", "files": {"file:1/model.pt": MODEL}}, 400, "is a JSON object"),
    (
        "rows beside a whole input",
        {
            "config": {
                "max_batch_size": 0,
                "input": [
                    {"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 64]},
                    {"name": "scale", "data_type": "TYPE_FP32", "dims": [1]},
                ],
            },
            "files": {"file:1/model.pt": MODEL},
        },
        400,
        "input ['x']: with max_batch_size 0, Kiln reads a first dimension of -1 as rows",
    ),
    (
        "a negative batch",
        {"config": triton_config("refused", max_batch_size=-4), "files": {"file:1/model.pt": MODEL}},
        400,
        "max_batch_size must be 0",
    ),
    (
        "decoupled",
        {
            "config": triton_config("refused", model_transaction_policy={"decoupled": True}),
            "files": {"file:1/model.pt": MODEL},
        },
        400,
        "not decoupled",
    ),
    (
        "too large",
        {"config": triton_config("refused"), "files": {"file:1/model.pt": bytes(1024 * 1024 + 1)}},
        413,
        "KILN_MAX_UPLOAD_MB",
    ),
    ("a configuration for no model", {"config": {"max_batch_size": 8}}, 404, "no model named 'refused'"),
]


@pytest.mark.parametrize(
    ("request_", "status", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_refused_loads_say_what_to_change(
    server: KilnServer,
    client: triton.InferenceServerClient,
    request_: dict[str, Any],
    status: int,
    message: str,
) -> None:
    config = request_["config"]
    text = config if isinstance(config, str) else json.dumps(config)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("refused", config=text, files=request_.get("files"), headers=admin())
    assert message in str(caught.value.message()), caught.value.message()
    assert caught.value.status() == str(status)
    assert versions(server, "refused") == []


def test_a_configuration_alone_cannot_change_what_was_compiled(
    server: KilnServer, client: triton.InferenceServerClient
) -> None:
    client.load_model(
        "fixed", config=json.dumps(triton_config("fixed")), files={"file:1/model.pt": MODEL}, headers=admin()
    )
    before = client.get_model_config("fixed", headers=user())
    changed = [
        (
            {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [32]}], "max_batch_size": 8},
            "['inputs']",
        ),
        ({"max_batch_size": 4}, "['max_batch_size']"),
        ({"parameters": {"backends": {"string_value": '["tvm"]'}}}, "['backends']"),
        (
            {"output": [{"name": "output0", "data_type": "TYPE_FP64", "dims": [10]}], "max_batch_size": 8},
            "outputs float32",
        ),
        (
            {"dynamic_batching": {"preferred_batch_size": [16]}, "max_batch_size": 8},
            "must lie in 1..max_batch_size",
        ),
    ]
    for config, message in changed:
        with pytest.raises(InferenceServerException, match=re.escape(message)) as caught:
            client.load_model("fixed", config=json.dumps(config), headers=admin())
        assert caught.value.status() == "422"
    assert client.get_model_config("fixed", headers=user()) == before
    assert versions(server, "fixed") == [1]


def test_the_http_body_is_checked(server: KilnServer) -> None:
    url = f"{server.url}/v2/repository/models/checked/load"
    with httpx.Client(headers=admin(), timeout=60) as http:

        def error(body: object, status: int, **kwargs: Any) -> str:
            response = http.post(url, json=body, **kwargs) if body is not None else http.post(url, **kwargs)
            assert response.status_code == status, response.text
            return str(response.json()["error"])

        config = json.dumps(triton_config("checked"))
        assert "must be base64" in error({"parameters": {"config": config, "file:1/model.pt": "no!"}}, 400)
        assert "need a config parameter" in error(
            {"parameters": {"file:1/model.pt": base64.b64encode(MODEL).decode()}}, 400
        )
        assert "must be a string" in error({"parameters": {"config": True}}, 400)
        assert "unknown load parameter(s) ['unload_dependents']" in error(
            {"parameters": {"unload_dependents": True}}, 400
        )
        assert "the body must be Triton's load request" in error([1], 400)
        assert "KILN_MAX_UPLOAD_MB" in error(None, 413, content=b" " * (3 * 1024 * 1024))
        infer_only = {"Authorization": f"Bearer {INFER}"}
        response = http.post(url, json={"parameters": {"config": config}}, headers=infer_only)
        assert response.status_code == 403, response.text
    assert versions(server, "checked") == []


def import_triton(server: KilnServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "import-triton",
            *args,
            "--url",
            server.url,
            "--api-key",
            ADMIN,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "400"},  # rich wraps a table to the terminal's width
    )


def rows(done: subprocess.CompletedProcess[str], model: str) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith(f"│ {model} ")]


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip("│").split("│")]


def test_kiln_imports_a_triton_model_repository(
    server: KilnServer, client: triton.InferenceServerClient, tmp_path: Path
) -> None:
    """`kiln import-triton` deploys a Triton model repository: the versions of every model with a
    config.pbtxt that Triton would load, oldest first, and says which could not be, and why."""
    repo = tmp_path / "models"
    newer = scripted(7)
    # 01 and 0 are not versions to Triton, nor to Kiln; version_policy all loads 1 and 2.
    imported = model_dir(
        repo, "imported", CONFIG_PBTXT, {"1": MLP.torchscript(), "2": newer, "01": b"", "0": b""}
    )
    (imported / "labels.txt").write_text("\n".join(LABELS))
    model_dir(repo, "onnx", 'platform: "onnxruntime_onnx"', {"1": b"onnx"}, "model.onnx")
    model_dir(repo, "garbled", "max_batch_size: [", {"1": MLP.torchscript()})
    outside = CONFIG_PBTXT.replace('label_filename: "labels.txt"', 'label_filename: "/etc/hostname"')
    model_dir(repo, "outside", outside, {"1": MLP.torchscript()})
    (repo / "notes").mkdir()  # no config.pbtxt: not a model

    done = import_triton(server, str(repo))
    assert done.returncode == 1, done.stdout + done.stderr
    assert [cells(line) for line in rows(done, "imported")] == [
        ["imported", "1", "1", "loaded"],
        ["imported", "2", "2", "loaded"],
    ], done.stdout
    assert "Kiln serves TorchScript" in "".join(rows(done, "onnx")), done.stdout
    assert "config.pbtxt" in "".join(rows(done, "garbled")), done.stdout
    assert "must name a file in the model's directory" in "".join(rows(done, "outside")), done.stdout
    assert "skipped: no config.pbtxt" in "".join(rows(done, "notes")), done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert versions(server, "outside") == []

    assert versions(server, "imported") == [1, 2]
    x = sample(MLP, 2)
    with torch.inference_mode():
        want = torch.jit.load(io.BytesIO(newer))(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(infer(client, "imported", x).as_numpy("output0"), want, rtol=1e-5, atol=1e-6)
    shown = client.get_model_config("imported", headers=user())
    assert shown["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert shown["instance_group"][0]["count"] == 2
    assert serving(server, "imported")["labels"] == {"output0": LABELS}

    again = import_triton(server, str(repo), "--model", "imported")  # the same files: nothing new
    assert again.returncode == 0, again.stdout + again.stderr
    assert versions(server, "imported") == [1, 2]
    missing = import_triton(server, str(repo), "--model", "nope")
    assert missing.returncode == 1 and "no model directory" in missing.stderr


def test_import_names_the_version_it_found_when_another_holds_its_file(
    server: KilnServer, tmp_path: Path
) -> None:
    """The file imported again after an upload of it under another configuration: the import
    finds its own version, not the newest holding the file, and says that the newest serves."""
    repo = tmp_path / "models"
    model_dir(
        repo, "twice", CONFIG_PBTXT.replace(' label_filename: "labels.txt"', ""), {"1": MLP.torchscript()}
    )
    first = import_triton(server, str(repo))
    assert [cells(row) for row in rows(first, "twice")] == [["twice", "1", "1", "loaded"]], first.stdout
    with httpx.Client(base_url=server.url, headers=admin(), timeout=60) as http:
        assert upload(http, MLP, name="twice", backends=[], max_batch_size=4).status_code == 202
    again = import_triton(server, str(repo))
    assert again.returncode == 0, again.stdout + again.stderr
    found = rows(again, "twice")
    assert cells(found[0]) == ["twice", "1", "1", "loaded"], again.stdout
    assert "serves requests naming no version, not 1: version 2 is newer" in found[1], again.stdout
    assert versions(server, "twice") == [1, 2]


def test_import_loads_the_versions_triton_would_and_says_what_serves(
    server: KilnServer, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    config = CONFIG_PBTXT.replace(' label_filename: "labels.txt"', "").replace(
        "version_policy: { all { } }", ""
    )
    # Triton's default policy loads the newest version alone.
    model_dir(repo, "newest", config, {"1": MLP.torchscript(), "2": scripted(8)})
    # A rollback: version 3 is version 1's file, which Kiln already holds as its version 1.
    every = config + "version_policy: { all { } }"
    model_dir(repo, "rollback", every, {"1": MLP.torchscript(), "2": scripted(9), "3": MLP.torchscript()})
    # A specific policy picks the versions here; the load is sent without it.
    specific = config + "version_policy: { specific { versions: [ 1 ] } }"
    model_dir(repo, "specific", specific, {"1": MLP.torchscript(), "2": scripted(11)})
    # A version that fails: the newer ones are not loaded, so none serves in its place.
    model_dir(repo, "broken", every, {"1": MLP.torchscript(), "2": b"not a model", "3": scripted(10)})
    done = import_triton(server, str(repo))
    assert done.returncode == 1, done.stdout + done.stderr
    assert versions(server, "newest") == [1]  # Triton's version 2, as Kiln's first
    rollback = rows(done, "rollback")
    assert len(rollback) == 4, done.stdout
    assert "serves requests naming no version, not 1: version 2 is newer" in rollback[3], done.stdout
    broken = rows(done, "broken")
    assert "400" in broken[1] and "not loaded: an older version failed" in broken[2], done.stdout
    assert versions(server, "broken") == [1]
    assert [cells(row)[1:] for row in rows(done, "specific")] == [["1", "1", "loaded"]], done.stdout
