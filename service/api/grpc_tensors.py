"""Tensors over gRPC: Triton's ModelInferRequest decoded into the InferRequest that both
protocols run (`service.tensors`), in raw_input_contents or typed contents, and the outputs
encoded into a ModelInferResponse's raw_output_contents, or written to shared memory."""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from service.api.bodies import INLINE_JSON_ELEMENTS
from service.api.v2 import INLINE_BINARY_BYTES
from service.errors import BadRequestError, PayloadTooLargeError
from service.tensors import (
    DATATYPES,
    SHARED_KEYS,
    InferRequest,
    Output,
    SharedAccess,
    class_count,
    decode_tensors,
    encode_tensor,
    priority_parameter,
    shared_slice,
    timeout_parameter,
    write_shared,
)

# Datatype -> the InferTensorContents field that carries it; FP16 has none: it travels raw.
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
# What each field holds, read straight into an array: through a list of Python numbers, 38 MB of
# int64 zeros took 1.5 GB and 13 s.
FIELD_DTYPE: dict[str, type[np.generic]] = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}


def decodes_inline(request: Any) -> bool:
    """As for HTTP bodies: small requests decode on the event loop, big ones in the threadpool,
    as do those with tensors in shared memory, which asks the store where."""
    if any(shared_parameters(t.parameters) for t in [*request.inputs, *request.outputs]):
        return False
    raw = sum(len(r) for r in request.raw_input_contents)
    return raw <= INLINE_BINARY_BYTES and typed_elements(request) <= INLINE_JSON_ELEMENTS


def typed_elements(request: Any) -> int:
    return sum(
        len(getattr(t.contents, CONTENTS_FIELD[t.datatype]))
        for t in request.inputs
        if t.datatype in CONTENTS_FIELD
    )


def shared_parameters(parameters: Any) -> dict[str, object]:
    """A tensor's shared-memory parameters, as the HTTP codec reads them."""
    return {key: parameter(parameters, key) for key in SHARED_KEYS if key in parameters}


def decode(request: Any, shared: SharedAccess, max_json_bytes: int) -> InferRequest:
    """The request's tensors through the HTTP codec's checks: raw contents become binary
    tensors, typed contents JSON `data`; inputs in shared memory have no contents. Typed contents
    are held to the elements a JSON body of `max_json_bytes` carries (`0,` each), as they cost
    what JSON's do: each is a number object to read."""
    limit = max_json_bytes // 2
    if (typed := typed_elements(request)) > limit:
        raise PayloadTooLargeError(
            f"typed contents of {typed} elements, past the {limit} that KILN_MAX_JSON_MB allows; "
            "send large tensors in raw_input_contents"
        )
    raw = list(request.raw_input_contents)
    in_shared = [shared_parameters(t.parameters) for t in request.inputs]
    for tensor, params in zip(request.inputs, in_shared, strict=True):
        shared_slice(params, f"input {tensor.name!r}")  # a malformed region is the error, not the count
    sent = sum(not params for params in in_shared)
    if raw and len(raw) != sent:
        named = [t.name for t, params in zip(request.inputs, in_shared, strict=True) if params]
        raise BadRequestError(
            f"raw_input_contents has {len(raw)} entries for {sent} inputs outside shared memory"
            f"{f' ({named} name a region)' if named else ''}; send raw contents for every one of them "
            "or for none"
        )
    docs: list[dict[str, Any]] = []
    contents = iter(raw)
    for tensor, params in zip(request.inputs, in_shared, strict=True):
        doc: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        if params:
            if tensor.HasField("contents"):
                raise BadRequestError(
                    f"tensor {tensor.name!r} names a shared memory region and sends contents too; send one"
                )
            doc["parameters"] = params
        elif raw:
            if tensor.HasField("contents"):  # as Triton refuses it: which would be the tensor?
                raise BadRequestError(
                    f"tensor {tensor.name!r} has contents, and raw_input_contents are sent; send one"
                )
            doc["parameters"] = {"binary_data_size": len(next(contents))}
        elif tensor.datatype in CONTENTS_FIELD:
            field = CONTENTS_FIELD[tensor.datatype]
            others = [f.name for f, _ in tensor.contents.ListFields() if f.name != field]
            if others:  # else their values went unread, and the count was said to be `data`'s
                raise BadRequestError(
                    f"tensor {tensor.name!r}: {tensor.datatype} contents go in {field}, "
                    f"not {', '.join(others)}"
                )
            values = getattr(tensor.contents, field)
            doc["data"] = np.fromiter(values, FIELD_DTYPE[field], count=len(values))
        elif tensor.datatype in DATATYPES:  # FP16, which has no typed contents
            if 0 not in tensor.shape:
                raise BadRequestError(f"tensor {tensor.name!r}: send {tensor.datatype} in raw_input_contents")
            doc["parameters"] = {"binary_data_size": 0}  # no elements: no bytes to send
        docs.append(doc)
    wanted = [o.name for o in request.outputs]
    shared_outputs, counts = {}, {}
    for output in request.outputs:
        what = f"output {output.name!r}"
        where = shared_slice(shared_parameters(output.parameters), what)
        if where is not None:
            shared_outputs[output.name] = shared.bind(where, what)
        count = class_count(parameter(output.parameters, "classification") or 0, what)
        if count:
            counts[output.name] = count
    return InferRequest(
        id=request.id or None,
        inputs=decode_tensors(docs, b"".join(raw), shared, "raw_input_contents"),
        outputs=dict.fromkeys(wanted, True) if wanted else None,
        binary_output=True,
        timeout_us=timeout_parameter(parameter(request.parameters, "timeout")),
        shared_outputs=shared_outputs,
        classifications=counts,
        priority=priority_parameter(parameter(request.parameters, "priority") or 0),
    )


def parameter(parameters: Any, key: str) -> object:
    """A request parameter's value, in whichever of InferParameter's fields it came."""
    if key not in parameters:
        return None
    field = parameters[key].WhichOneof("parameter_choice")
    return None if field is None else getattr(parameters[key], field)


def encode(
    name: str, version: int, rid: str, infer: InferRequest, outputs: list[Output], shared: SharedAccess
) -> Any:
    response = pb.ModelInferResponse(model_name=name, model_version=str(version), id=rid)
    for output, array, _ in outputs:
        where = infer.shared_outputs.get(output)
        if where is None:
            doc, raw = encode_tensor(output, array, binary=True)
            response.outputs.add(name=output, datatype=doc["datatype"], shape=doc["shape"])
        else:
            doc, raw = write_shared(output, array, where, shared), b""
            tensor = response.outputs.add(name=output, datatype=doc["datatype"], shape=doc["shape"])
            for key, value in doc["parameters"].items():
                if isinstance(value, str):
                    tensor.parameters[key].string_param = value
                else:
                    tensor.parameters[key].int64_param = value
        # One entry per output, empty for those in shared memory: clients find an output's
        # contents by its index.
        response.raw_output_contents.append(raw)
    return response
