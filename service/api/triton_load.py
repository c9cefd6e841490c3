"""Triton's load with a model configuration and files (tritonclient's `load_model(name,
config=..., files=...)`, over HTTP and gRPC): the configuration, JSON of Triton's ModelConfig,
is read as Kiln's upload config. With a model file, the load uploads a new version, as Triton
loads an override model directory; without one, it changes the serving settings of the version
that serves, as Triton reloads a model with an edited configuration."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2 as config_pb

from compiler.runner import output_names
from compiler.spec import DTYPES
from service.api.deps import Services
from service.api.models import apply_serving, parse_config, store_version
from service.api.problems import validation_detail
from service.api.v2 import ROWS_PARAMETER, config_doc, described
from service.errors import BadRequestError, InvalidConfigError, PayloadTooLargeError
from service.records import (
    MAX_OUTPUT_NAMES,
    ModelConfig,
    OutputInfo,
    ServingConfig,
    TensorConfig,
    VersionRecord,
    name_index,
    own_names,
)
from service.tensors import DATATYPES
from service.triton_repository import foreign_platform

# `file:1/model.pt`: a version's model file (label files lie beside the versions: `file:labels.txt`).
VERSION_FILE = re.compile(r"file:\d+/[^/]+")
# The ModelConfig fields Kiln takes; a configuration that sets any other is refused, since Kiln
# would not do what it asks (sequence batching, ensembles, rate limits...).
APPLIED = {
    "name",
    "platform",
    "backend",
    "max_batch_size",
    "input",
    "output",
    "dynamic_batching",
    "instance_group",
    "response_cache",
    "parameters",
    "version_policy",
    # Hints to Triton's own execution, which leave the answers as they are: accepted and not
    # applied, so that a configuration taken from a Triton deployment loads. Kiln picks the
    # file, compiles, warms up and labels its metrics itself.
    "default_model_filename",
    "optimization",
    "model_warmup",
    "metric_tags",
    "model_transaction_policy",  # not decoupled
}
# An input's format (FORMAT_NCHW) is a hint too.
TENSOR_FIELDS = {
    "input": {"name", "data_type", "dims", "format"},
    "output": {"name", "data_type", "dims", "label_filename"},
}
BATCHING_FIELDS = {
    "preferred_batch_size",
    "max_queue_delay_microseconds",
    "preserve_ordering",
    "priority_levels",
    "default_priority_level",
    "default_queue_policy",
}
# The kind and GPUs are accepted; Kiln places a model by the targets it was compiled for.
INSTANCE_FIELDS = {"name", "count", "kind", "gpus"}
# Kiln's upload fields that Triton's configuration has no field for, which its `parameters`
# carry as JSON in `string_value`: {"backends": {"string_value": "[\"onnxruntime\"]"}}.
COMPILED_PARAMETERS = {
    "backends",
    "targets",
    "tuning_trials",
    "rtol",
    "atol",
    "fp16_rtol",
    "fp16_atol",
    "bf16_rtol",
    "bf16_atol",
}
SERVING_PARAMETERS = {"adaptive_queue_delay", "dynamic_batching"}
PRIORITIES = {"priority_levels", "default_priority_level"}
# The PyTorch backend's own parameters: hints to its execution, accepted and not applied.
PYTORCH_HINTS = {
    "DISABLE_OPTIMIZED_EXECUTION",
    "INFERENCE_MODE",
    "DISABLE_CUDNN",
    "ENABLE_WEIGHT_SHARING",
    "ENABLE_CACHE_CLEANING",
    "ENABLE_JIT_EXECUTOR",
    "ENABLE_JIT_PROFILING",
    "ENABLE_NVFUSER",
    "INTRA_OP_THREAD_COUNT",
    "INTER_OP_THREAD_COUNT",
}
# TYPE_FP32 -> float32: the data types of Triton's configuration that Kiln serves.
DTYPE_OF = {f"TYPE_{name}": dtype.name for name, dtype in DATATYPES.items()}
# An upload's inputs take fewer (compiler.spec.DType): UINT16 to UINT64 are outputs' alone.
INPUT_DTYPE_OF = {datatype: dtype for datatype, dtype in DTYPE_OF.items() if dtype in DTYPES}


@dataclass
class LoadRequest:
    """A load's parameters: the configuration, and the files by their `file:` path."""

    config: str | None
    files: dict[str, bytes]


def load_request(parameters: Mapping[str, object], files: Mapping[str, bytes]) -> LoadRequest:
    """The load's parameters, whichever protocol brought them: only `config` and `file:` ones."""
    unknown = sorted(k for k in parameters if k != "config")
    if unknown:
        raise BadRequestError(f"unknown load parameter(s) {unknown}; Triton's are config and file:<path>")
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise BadRequestError(
            "the config parameter must be a string: the JSON of Triton's model configuration"
        )
    if files and config is None:
        raise BadRequestError(
            "files need a config parameter too, the model configuration they are loaded with"
        )
    return LoadRequest(config, dict(files))


def load_with(svc: Services, name: str, request: LoadRequest) -> int:
    """Blocking (a new model is checked by running it, and a configuration may be large): upload the
    request's model file as a new version, or apply its configuration to the version that serves;
    the number of the version it made, found or changed."""
    assert request.config is not None
    config = triton_config(request.config, name)
    model_file, labels, unsent = split_files(request.files, config)
    doc = kiln_config(config, name)
    if model_file is None:
        return reconfigure(svc, name, config, doc, labels, unsent)
    path, data = model_file
    if len(data) > svc.settings.max_request_bytes:
        raise PayloadTooLargeError(
            f"{path}: {len(data)} bytes; KILN_MAX_UPLOAD_MB allows {svc.settings.max_request_bytes}"
        )
    if unsent:
        raise BadRequestError(f"config: label_filename {sorted(unsent.values())}: send the file too")
    if not config.input:
        raise BadRequestError("config: input: list the model's inputs (name, data_type, dims)")
    cfg = parse_config(json.dumps({**doc, "labels": labels}), svc)
    batching = config.max_batch_size > 0
    created, _ = store_version(
        svc, cfg, io.BytesIO(data), lambda outputs: check_outputs(config, outputs, batching)
    )
    return created.version.version


def triton_config(text: str, name: str) -> Any:
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise BadRequestError("config: a Triton model configuration is a JSON object")
        config = json_format.ParseDict(parsed, config_pb.ModelConfig())
    except (ValueError, RecursionError, json_format.ParseError) as exc:
        raise BadRequestError(f"config: not a Triton model configuration: {exc}") from None
    refused = sorted(set_fields(config) - APPLIED)
    if refused:
        raise BadRequestError(f"config: Kiln does not apply {refused}; leave them out")
    if config.max_batch_size < 0:
        raise BadRequestError("config: max_batch_size must be 0 (no batching) or more")
    if config.version_policy.HasField("specific"):  # latest and all: what Kiln does anyway
        raise BadRequestError(
            "config: version_policy: Kiln serves every version, by number, and the newest (or the "
            "default) to requests naming none, not specific ones; use latest or all, or leave it out"
        )
    if config.model_transaction_policy.decoupled:
        raise BadRequestError(
            "config: model_transaction_policy: Kiln answers each request once; not decoupled"
        )
    if config.name and config.name != name:
        raise BadRequestError(f"config: name {config.name!r} is not the model loaded, {name!r}")
    rows = [t.name for t in config.input if t.dims[:1] == [-1]]
    if not config.max_batch_size and rows and not takes_rows(config):
        # Kiln reads a leading -1 as the rows all inputs share: ids [-1] beside scale [1] would
        # load and then refuse every request of more than one id.
        raise BadRequestError(
            f"config: input {rows}: with max_batch_size 0, Kiln reads a first dimension of -1 as "
            "rows that every input has; begin every input's dims with -1, or none"
        )
    foreign = foreign_platform(config)
    if foreign is not None:
        raise BadRequestError(f"config: {foreign}")
    for kind, allowed in TENSOR_FIELDS.items():
        for tensor in getattr(config, kind):
            extra = sorted(set_fields(tensor) - allowed)
            if extra:
                raise BadRequestError(f"config: {kind} {tensor.name!r}: Kiln does not apply {extra}")
    batching = config.dynamic_batching
    extra = sorted(set_fields(batching) - BATCHING_FIELDS)
    if extra:
        raise BadRequestError(f"config: dynamic_batching: Kiln does not apply {extra}")
    if batching.default_queue_policy.timeout_action == config_pb.ModelQueuePolicy.DELAY:
        raise BadRequestError(
            "config: dynamic_batching: Kiln rejects a request past its timeout; leave timeout_action out"
        )
    for group in config.instance_group:
        extra = sorted(set_fields(group) - INSTANCE_FIELDS)
        if extra:
            raise BadRequestError(
                f"config: instance_group: Kiln does not apply {extra}; it places models itself"
            )
    if ROWS_PARAMETER in config.parameters and not takes_rows(config):
        raise BadRequestError(
            "config: parameters: max_batch_size is how many rows Kiln takes of a model whose "
            "max_batch_size is 0 and whose inputs' dims all begin with -1; set max_batch_size itself"
        )
    unknown = sorted(
        set(config.parameters) - COMPILED_PARAMETERS - SERVING_PARAMETERS - PYTORCH_HINTS - {ROWS_PARAMETER}
    )
    if unknown:
        raise BadRequestError(
            f"config: parameters: Kiln does not know {unknown}; it reads "
            f"{sorted(COMPILED_PARAMETERS | SERVING_PARAMETERS)}"
        )
    return config


def set_fields(message: Message) -> set[str]:
    return {descriptor.name for descriptor, _ in message.ListFields()}


def split_files(
    files: Mapping[str, bytes], config: Any
) -> tuple[tuple[str, bytes] | None, dict[str, list[str]], dict[str, str]]:
    """The model file, if any; the labels of each output whose label_filename names a file sent
    (one label a line, as Triton reads it); and output -> label_filename for those not sent."""
    label_of: dict[str, list[str]] = {}  # a label file may serve several outputs
    for output in config.output:
        if output.label_filename:
            label_of.setdefault(f"file:{output.label_filename}", []).append(output.name)
    model_files = {p: data for p, data in files.items() if VERSION_FILE.fullmatch(p) and p not in label_of}
    if len(model_files) > 1:
        raise BadRequestError(f"files: {sorted(model_files)}; give one model file, file:<version>/model.pt")
    unused = sorted(set(files) - set(model_files) - set(label_of))
    if unused:
        raise BadRequestError(
            f"files: Kiln does not use {unused}; give the model as file:<version>/model.pt "
            "and label files as file:<name>, named by an output's label_filename"
        )
    try:
        read = {p: files[p].decode().splitlines() for p in label_of if p in files}
    except UnicodeDecodeError:
        raise BadRequestError("files: a label file must be UTF-8 text") from None
    labels = {output: read[p] for p, outputs in label_of.items() if p in read for output in outputs}
    unsent = {
        output: p.removeprefix("file:")
        for p, outputs in label_of.items()
        if p not in read
        for output in outputs
    }
    return next(iter(model_files.items()), None), labels, unsent


def takes_rows(config: Any) -> bool:
    """Triton's max_batch_size 0 with every input's first dimension variable."""
    return not config.max_batch_size and bool(config.input) and all(t.dims[:1] == [-1] for t in config.input)


def kiln_config(config: Any, name: str) -> dict[str, Any]:
    """The configuration as Kiln's upload config, with only the fields it sets (labels apart)."""
    batching = config.max_batch_size > 0
    doc: dict[str, Any] = {"name": name}
    if takes_rows(config):
        # Any number of rows, which Triton never merges, nothing saying they are a batch: Kiln
        # takes up to its max_batch_size of them (KILN_DEFAULT_MAX_BATCH_SIZE, or the
        # max_batch_size parameter) and runs each request alone.
        doc["dynamic_batching"] = False
    elif config.input or batching:  # proto3 cannot tell a max_batch_size of 0 from none given
        doc["max_batch_size"] = config.max_batch_size if batching else 1
    if config.input:
        doc["inputs"] = [
            {
                "name": t.name,
                "dtype": dtype_of(t, "input"),
                "shape": [-1, *t.dims] if batching else list(t.dims),
            }
            for t in model_inputs(config.input)
        ]
    names = own_names(served_output_names(config.output))
    if names:
        doc["output_names"] = names
    if config.response_cache.enable:
        doc["response_cache"] = True
    if config.instance_group:
        doc["instances"] = sum(group.count or 1 for group in config.instance_group)
    if config.HasField("dynamic_batching"):
        queue = config.dynamic_batching
        doc["max_queue_delay_us"] = queue.max_queue_delay_microseconds
        doc["preferred_batch_sizes"] = list(queue.preferred_batch_size)
        doc["priority_levels"] = queue.priority_levels
        # Without levels Triton ignores the default level: none is kept for later levels to use.
        doc["default_priority_level"] = (
            (queue.default_priority_level or None) if queue.priority_levels else None
        )
        if queue.HasField("default_queue_policy"):
            policy = queue.default_queue_policy
            doc["max_queue_size"] = policy.max_queue_size
            doc["default_timeout_us"] = policy.default_timeout_microseconds or None
    for key, parameter in config.parameters.items():
        if key in PYTORCH_HINTS:
            continue
        try:
            doc[key] = json.loads(parameter.string_value)
        except (ValueError, RecursionError):
            raise BadRequestError(
                f'config: parameters: {key}\'s string_value must be JSON, e.g. "true" or "[\\"tvm\\"]"'
            ) from None
    return doc


def by_index(tensors: Any, kind: str) -> dict[int, str] | None:
    """The index of the model's input or output that each of a configuration's names, when all
    have Triton's PyTorch form <name>__<index>: its backend matches them so; None when not all do,
    and the configuration lists them in the model's order."""
    found: dict[int, str] = {}
    for tensor in tensors:
        index = name_index(tensor.name)
        if index is None:
            return None
        if index >= MAX_OUTPUT_NAMES:
            raise BadRequestError(
                f"config: {kind} {tensor.name!r}: index {index}; Kiln reads indices below {MAX_OUTPUT_NAMES}"
            )
        if index in found:
            raise BadRequestError(
                f"config: {kind}s {found[index]!r} and {tensor.name!r} are both {kind} {index}"
            )
        found[index] = tensor.name
    return found


def output_positions(outputs: Any) -> dict[int, str]:
    """Which of the model's outputs each of a configuration's names is: by its index, or else
    in the configuration's order."""
    indexed = by_index(outputs, "output")
    return dict(enumerate(o.name for o in outputs)) if indexed is None else indexed


def served_output_names(outputs: Any) -> list[str]:
    """The names of the model's outputs, in the order it returns them; those the configuration
    does not name keep Kiln's."""
    positions = output_positions(outputs)
    return [positions.get(i, name) for i, name in enumerate(output_names(max(positions, default=-1) + 1))]


def model_inputs(inputs: Any) -> list[Any]:
    """The configuration's inputs in the order the model takes them: by their index, or else as
    listed (inputs named after forward()'s arguments are matched to them by the check run)."""
    indexed = by_index(inputs, "input")
    if indexed is None:
        return list(inputs)
    if sorted(indexed) != list(range(len(indexed))):
        raise BadRequestError(
            f"config: input indices {sorted(indexed)}: name the model's inputs "
            f"<name>__0 to <name>__{len(indexed) - 1}"
        )
    named = {t.name: t for t in inputs}
    return [named[indexed[i]] for i in range(len(indexed))]


def dtype_of(tensor: Any, kind: str) -> str:
    datatype = config_pb.DataType.Name(tensor.data_type)
    served = INPUT_DTYPE_OF if kind == "input" else DTYPE_OF
    dtype = served.get(datatype)
    if dtype is None:
        raise BadRequestError(
            f"config: {kind} {tensor.name!r}: data_type {datatype}; Kiln serves {kind}s of {sorted(served)}"
        )
    return dtype


def check_outputs(config: Any, outputs: list[OutputInfo], batching: bool) -> None:
    """The configuration's outputs, where it lists them, are the model's: the names its requests
    will ask for, with their data types and dims (-1 matching any size; the batch left out when
    `batching`)."""
    by_name = {o.name: o for o in outputs}
    for tensor in config.output:
        output = by_name.get(tensor.name)
        if output is None:
            raise InvalidConfigError(f"config: output {tensor.name!r}: the model outputs {list(by_name)}")
        if dtype_of(tensor, "output") != output.dtype:
            raise InvalidConfigError(f"config: output {tensor.name!r}: the model outputs {output.dtype}")
        shape = output.shape[1:] if batching else output.shape
        if len(shape) != len(tensor.dims) or any(
            a != b and -1 not in (a, b) for a, b in zip(shape, tensor.dims, strict=True)
        ):
            raise InvalidConfigError(
                f"config: output {tensor.name!r}: dims {list(tensor.dims)}, but the model's are {shape}"
            )


def reconfigure(
    svc: Services,
    name: str,
    config: Any,
    doc: dict[str, Any],
    labels: dict[str, list[str]],
    unsent: dict[str, str],
) -> int:
    """A configuration without a model file, for the version that serves requests naming none,
    read as Triton reads an edited configuration: against what Kiln shows of the version
    (`GET .../config`), a setting changed is applied, and one left out returns to its default;
    what the configuration says as shown is kept as stored, so one loaded back as it was
    changes nothing; a setting Kiln cannot show for this model is kept unless stated. What was
    compiled must be as shown. An output's labels are kept when its
    label_filename is given without the file, as Triton keeps a model directory's files."""
    _, current = described(svc, name, None)
    raw = config_doc(svc, name, current.version)
    shown = kiln_config(json_format.ParseDict(raw, config_pb.ModelConfig()), name)  # Kiln's own: no checks
    differ: list[str] = [k for k in ("max_batch_size", "inputs") if k in doc and doc[k] != shown[k]]
    if "inputs" in differ and sent_at_upload(svc, current, doc["inputs"]):
        differ.remove("inputs")
    given = {k: doc[k] for k in COMPILED_PARAMETERS if k in doc}
    if given:
        try:
            probe = ModelConfig.model_validate({**current.config.model_dump(), **given})
        except ValidationError as exc:
            raise InvalidConfigError(f"config: {validation_detail(exc)}") from None
        differ += sorted(k for k in given if compiled(probe, k) != compiled(current.config, k))
    if differ:
        raise InvalidConfigError(
            f"config: {differ} differ from version {current.version}'s (inputs compare by name, "
            "order, data type and dims), which was compiled with them; load the model file too "
            "(file:1/model.pt) for a new version"
        )
    stated = bool(config.input or config.max_batch_size)  # else as shown: proto3 has no unset
    if not stated and "dynamic_batching" in shown and "dynamic_batching" not in doc:
        doc["dynamic_batching"] = shown["dynamic_batching"]  # rows shown are not made a batch
    check_outputs(config, current.outputs, config.max_batch_size > 0 if stated else raw["max_batch_size"] > 0)
    served = [o.name for o in current.outputs]
    moved = [
        f"{n!r} as output {i}" for i, n in output_positions(config.output).items() if served[i : i + 1] != [n]
    ]
    if moved:
        raise InvalidConfigError(
            f"config: {moved}, but version {current.version} serves its outputs as {served}; load the "
            "model file too (file:1/model.pt) for a new version with other names"
        )
    missing = sorted(path for output, path in unsent.items() if output not in current.config.labels)
    if missing:
        raise BadRequestError(f"config: label_filename {missing}: send the file too")
    wanted, was, stored = serving(doc), serving(shown), current.config.serving().model_dump()
    # Against what is shown; a setting Kiln cannot show for this model (a queue policy without
    # batching) against what is stored, and only when the configuration states it.
    changes = {
        key: value
        for key, value in wanted.items()
        if key != "labels" and (value != was[key] if key in shown else key in doc and value != stored[key])
    }
    if PRIORITIES & changes.keys():  # the default level is shown resolved by the levels
        changes.update({key: wanted[key] for key in PRIORITIES})
    labels = {**labels, **{output: current.config.labels[output] for output in unsent}}
    if labels != current.config.labels:
        changes["labels"] = labels
    apply_serving(svc, current, changes)
    return current.version


def sent_at_upload(svc: Services, version: VersionRecord, inputs: list[dict[str, Any]]) -> bool:
    """Whether the version's upload sent these inputs, which its check run then put in forward()'s
    order: the same inputs, by their names."""
    try:
        sent = version.config.model_copy(update={"inputs": [TensorConfig.model_validate(t) for t in inputs]})
    except ValidationError:
        return False
    found = svc.registry.uploaded(sent, version.sha256)
    return found is not None and found.version == version.version


def compiled(config: ModelConfig, key: str) -> Any:
    return config.backend_requests() if key == "backends" else getattr(config, key)


def serving(doc: dict[str, Any]) -> dict[str, Any]:
    """Every serving setting of an upload config, those it leaves out at their defaults."""
    try:
        settings = ServingConfig.model_validate(
            {k: v for k, v in doc.items() if k in ServingConfig.model_fields}
        )
    except ValidationError as exc:
        raise InvalidConfigError(f"config: {validation_detail(exc)}") from None
    return settings.model_dump()
