"""Open Inference Protocol (v2) tensors <-> numpy: JSON data and Triton's binary tensor extension.

A pure codec with no HTTP in it. Every malformed tensor raises BadRequestError with a message that
names the tensor and says what to fix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import numpy as np

from compiler.spec import bool_among_numbers
from service.errors import BadRequestError
from service.headers import byte_count

DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(dtype)
    for name, dtype in [
        ("BOOL", np.bool_),
        ("INT8", np.int8),
        ("INT16", np.int16),
        ("INT32", np.int32),
        ("INT64", np.int64),
        ("UINT8", np.uint8),
        ("UINT16", np.uint16),
        ("UINT32", np.uint32),
        ("UINT64", np.uint64),
        ("FP16", np.float16),
        ("FP32", np.float32),
        ("FP64", np.float64),
    ]
}
_DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items()}
MAX_DIMS = 32  # numpy 1.x's limit; numpy raises past its own
MAX_ARRAY_BYTES = np.iinfo(np.intp).max

# Which kinds of JSON-parsed arrays each dtype kind takes: never a float into an int, nor a
# number into a bool, so no value is changed silently.
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
_JSON_WHAT = {"b": "true/false", "i": "integers", "u": "integers", "f": "numbers"}


def numpy_dtype(datatype: object, name: str) -> np.dtype:
    if datatype == "BYTES":
        raise BadRequestError(f"tensor {name!r}: BYTES tensors are not supported; Kiln serves numbers")
    found = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if found is None:
        raise BadRequestError(
            f"tensor {name!r}: unknown datatype {_short(datatype)}; use one of {list(DATATYPES)}"
        )
    return found


def datatype_of(dtype: np.dtype, name: str) -> str:
    found = _DATATYPE_OF.get(np.dtype(dtype))
    if found is None:
        raise BadRequestError(f"tensor {name!r} has dtype {dtype}, which the v2 protocol cannot carry")
    return found


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value) if isinstance(value, str | int | float | list | dict | None) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _header(doc: object) -> tuple[str, tuple[int, ...], np.dtype]:
    if not isinstance(doc, dict):
        raise BadRequestError(f"each tensor must be a JSON object; got {_short(doc)}")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequestError(f"each tensor needs a string `name`; got {_short(name)}")
    shape = doc.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BadRequestError(f"tensor {name!r}: `shape` must be a list of non-negative integers")
    if len(shape) > MAX_DIMS:
        raise BadRequestError(f"tensor {name!r}: {len(shape)} dimensions; at most {MAX_DIMS} are supported")
    dtype = numpy_dtype(doc.get("datatype"), name)
    # numpy sizes even an empty array by its other dimensions: [0, 2**62] is no array either.
    if math.prod(d for d in shape if d) * dtype.itemsize > MAX_ARRAY_BYTES:
        raise BadRequestError(f"tensor {name!r}: shape {shape} is larger than any array can be")
    return name, tuple(shape), dtype


def _parameters(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    params = doc.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise BadRequestError(f"{name}: `parameters` must be a JSON object")
    return params


def _binary_size(doc: Mapping[str, Any], name: str) -> int | None:
    size = _parameters(doc, f"tensor {name!r}").get("binary_data_size")
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadRequestError(f"tensor {name!r}: binary_data_size must be a non-negative integer")
    if "data" in doc:
        raise BadRequestError(f"tensor {name!r} has both `data` and binary_data_size; send one")
    return size


@dataclass(frozen=True)
class SharedSlice:
    """Where a tensor lies in a registered shared-memory region (service.shared_memory)."""

    region: str
    byte_size: int
    offset: int = 0
    # An output's segment, looked up with the request (SharedAccess.bind): the write goes
    # where the region pointed then, whatever is registered under its name by the time it runs.
    segment: object = None


class SharedAccess(Protocol):
    """Shared-memory regions as the codec uses them; `what` names the tensor in errors."""

    def read(self, where: SharedSlice, what: str) -> bytes: ...

    def bind(self, where: SharedSlice, what: str) -> SharedSlice: ...

    def write(self, where: SharedSlice, data: bytes, what: str) -> None: ...


class Unshared:
    """For a codec with no regions: every use of one is refused."""

    def _refuse(self, what: str) -> NoReturn:
        raise BadRequestError(f"{what}: shared memory is not offered here")

    def read(self, where: SharedSlice, what: str) -> bytes:
        self._refuse(what)

    def bind(self, where: SharedSlice, what: str) -> SharedSlice:
        self._refuse(what)

    def write(self, where: SharedSlice, data: bytes, what: str) -> None:
        self._refuse(what)


UNSHARED = Unshared()
SHARED_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def _count(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequestError(f"{what} must be a non-negative integer; got {_short(value)}")
    return value


def shared_slice(params: Mapping[str, Any], what: str) -> SharedSlice | None:
    """The tensor's place in shared memory, when its parameters name a region."""
    if not any(key in params for key in SHARED_KEYS):
        return None
    region = params.get("shared_memory_region")
    if not isinstance(region, str) or not region:
        raise BadRequestError(f"{what}: shared_memory_region must name a registered region")
    if "shared_memory_byte_size" not in params:
        raise BadRequestError(f"{what}: shared_memory_byte_size is missing")
    size = _count(params["shared_memory_byte_size"], f"{what}: shared_memory_byte_size")
    offset = _count(params.get("shared_memory_offset", 0), f"{what}: shared_memory_offset")
    return SharedSlice(region, size, offset)


def _check_size(size: int, name: str, shape: tuple[int, ...], dtype: np.dtype, source: str) -> None:
    needed = math.prod(shape) * dtype.itemsize
    if size != needed:
        raise BadRequestError(
            f"tensor {name!r}: {source} is {size} bytes, but shape {list(shape)} "
            f"of {datatype_of(dtype, name)} needs {needed}"
        )


def _from_bytes(
    raw: memoryview | bytes,
    name: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    source: str = "binary_data_size",
) -> np.ndarray:
    _check_size(len(raw), name, shape, dtype, source)
    if dtype.kind == "b":
        return np.frombuffer(raw, np.uint8).astype(bool).reshape(shape)  # any non-zero byte is true
    # The extension is little-endian; astype also copies out of the read-only request buffer.
    return np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _from_json(doc: Mapping[str, Any], name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if "data" not in doc:
        raise BadRequestError(f"tensor {name!r} has neither `data` nor a binary_data_size parameter")
    try:
        raw = np.asarray(doc["data"])
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequestError(f"tensor {name!r}: `data` is not a regular array: {exc}") from None
    count = math.prod(shape)
    if raw.size != count:
        raise BadRequestError(
            f"tensor {name!r}: shape {list(shape)} holds {count} elements, but `data` has {raw.size}"
        )
    datatype = datatype_of(dtype, name)
    if count and dtype.kind != "b" and bool_among_numbers(doc["data"], raw):
        raise BadRequestError(
            f"tensor {name!r}: {datatype} data must be {_JSON_WHAT[dtype.kind]}, not true/false"
        )
    kind = raw.dtype.kind
    if dtype.kind in "iu" and kind in "fO":
        # numpy makes floats of integers past INT64 (UINT64's top half): keep them exact instead.
        exact = np.asarray(doc["data"], dtype=object)
        if all(isinstance(v, int) for v in exact.flat):
            raw, kind = exact, "i"
    if count and kind not in _JSON_KINDS[dtype.kind]:
        raise BadRequestError(f"tensor {name!r}: {datatype} data must be {_JSON_WHAT[dtype.kind]}")
    if count and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if int(raw.min()) < info.min or int(raw.max()) > info.max:
            raise BadRequestError(f"tensor {name!r}: values out of the range of {datatype}")
    # Nesting is only a notation: the data is row-major, and `shape` is the truth.
    return raw.astype(dtype).reshape(shape)


def decode_tensors(
    docs: object,
    binary: bytes | memoryview = b"",
    shared: SharedAccess = UNSHARED,
    binary_source: str = "binary_data_size",
) -> dict[str, np.ndarray]:
    """v2 tensor objects (plus the binary bytes after the JSON header) -> name -> array.

    Binary tensors take consecutive slices of `binary` in the order they are listed; a tensor
    whose parameters name a shared-memory region is read from there by `shared`. Errors call a
    binary tensor's bytes `binary_source` (gRPC's raw_input_contents).
    """
    if not isinstance(docs, list) or not docs:
        raise BadRequestError("`inputs` must be a non-empty list of tensors")
    view = memoryview(binary)
    offset = 0
    tensors: dict[str, np.ndarray] = {}
    for doc in docs:
        name, shape, dtype = _header(doc)
        if name in tensors:
            raise BadRequestError(f"tensor {name!r} is given twice")
        where = shared_slice(_parameters(doc, f"tensor {name!r}"), f"tensor {name!r}")
        if where is not None:
            if "data" in doc or "binary_data_size" in doc.get("parameters", {}):
                raise BadRequestError(
                    f"tensor {name!r} names a shared memory region and sends data too; send one"
                )
            # Checked before reading, so that a region's size is never allocated for nothing.
            _check_size(where.byte_size, name, shape, dtype, "shared_memory_byte_size")
            raw = shared.read(where, f"tensor {name!r}")
            tensors[name] = _from_bytes(raw, name, shape, dtype, "shared_memory_byte_size")
            continue
        size = _binary_size(doc, name)
        if size is None:
            tensors[name] = _from_json(doc, name, shape, dtype)
            continue
        if offset + size > len(view):
            raise BadRequestError(
                f"tensor {name!r}: binary_data_size {size} runs past the end of the body "
                f"({len(view) - offset} bytes left)"
            )
        tensors[name] = _from_bytes(view[offset : offset + size], name, shape, dtype, binary_source)
        offset += size
    if offset != len(view):
        raise BadRequestError(
            f"the body has {len(view) - offset} bytes after the JSON header that no binary_data_size claims"
        )
    return tensors


def encode_tensor(name: str, array: np.ndarray, binary: bool) -> tuple[dict[str, Any], bytes]:
    """One output tensor object, and its raw little-endian bytes when `binary`. An array of
    Python bytes objects goes as BYTES (the classification extension's strings)."""
    strings = array.dtype == object
    datatype = "BYTES" if strings else datatype_of(array.dtype, name)
    doc: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if not binary:
        doc["data"] = [v.decode() for v in array.flat] if strings else array.ravel().tolist()
        return doc, b""
    if strings:  # each element its little-endian uint32 length, then its bytes
        raw = b"".join(len(v).to_bytes(4, "little") + v for v in array.flat)
    else:
        raw = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
    doc["parameters"] = {"binary_data_size": len(raw)}
    return doc, raw


Output = tuple[str, np.ndarray, bool]  # a response's tensor: name, values, whether it goes as binary


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    # Requested output -> whether it goes back as binary; None asks for every output.
    outputs: dict[str, bool] | None
    binary_output: bool
    # The request's `timeout` parameter, in microseconds, as Triton takes it; None: the model's.
    timeout_us: int | None = None
    # Requested outputs to write into shared memory instead of the response.
    shared_outputs: dict[str, SharedSlice] = field(default_factory=dict)
    # Requested outputs to answer with their top classes (service.classification): how many.
    classifications: dict[str, int] = field(default_factory=dict)
    # Triton's `priority` parameter: 1 is the highest; 0, none (service.batcher.BatchPolicy.level).
    priority: int = 0

    def __post_init__(self) -> None:
        both = sorted(self.shared_outputs.keys() & self.classifications.keys())
        if both:  # as tritonclient refuses to ask for it
            raise BadRequestError(
                f"output {both[0]!r}: classification is answered in the response, not in shared "
                "memory; ask for one or the other"
            )

    def check_outputs(self, names: Iterable[str]) -> None:
        """An unknown requested output is an error: checked before inference, not after."""
        known = list(names)
        unknown = [name for name in self.outputs or () if name not in known]
        if unknown:
            raise BadRequestError(f"unknown output(s) {unknown}; the model outputs {known}")

    def select(self, available: Mapping[str, np.ndarray]) -> list[Output]:
        """The outputs to send, each with its binary flag; an unknown requested name is an error."""
        if self.outputs is None:
            return [(name, array, self.binary_output) for name, array in available.items()]
        self.check_outputs(available)
        return [(name, available[name], binary) for name, binary in self.outputs.items()]


def _flag(params: Mapping[str, Any], key: str, default: bool) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise BadRequestError(f"parameter {key} must be true or false")
    return value


@dataclass(frozen=True)
class Requested:
    """The outputs asked for, each with its binary flag (None: every output); those to write into
    shared memory, and those to classify."""

    binary: dict[str, bool] | None = None
    shared: dict[str, SharedSlice] = field(default_factory=dict)
    classifications: dict[str, int] = field(default_factory=dict)


def _requested(docs: object, binary_output: bool, shared: SharedAccess) -> Requested:
    if docs is None or docs == []:  # none named: every output, as Triton (and gRPC here) answers
        return Requested()
    if not isinstance(docs, list):
        raise BadRequestError("`outputs` must be a list of {name, parameters}")
    wanted: dict[str, bool] = {}
    to_shared: dict[str, SharedSlice] = {}
    counts: dict[str, int] = {}
    for doc in docs:
        name = doc.get("name") if isinstance(doc, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequestError(f"each requested output needs a string `name`; got {_short(doc)}")
        what = f"output {name!r}"
        params = _parameters(doc, what)
        wanted[name] = _flag(params, "binary_data", binary_output)
        where = shared_slice(params, what)
        if where is not None:
            to_shared[name] = shared.bind(where, what)
        count = class_count(params.get("classification", 0), what)
        if count:
            counts[name] = count
    return Requested(wanted, to_shared, counts)


def _split(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    length = byte_count(header_length)
    if length is None:
        raise BadRequestError(
            f"Inference-Header-Content-Length must be a byte count in digits, not {header_length[:20]!r}"
        )
    if length > len(body):
        raise BadRequestError(
            f"Inference-Header-Content-Length is {length}, but the body has {len(body)} bytes"
        )
    return body[:length], memoryview(body)[length:]


def decode_request(body: bytes, header_length: str | None, shared: SharedAccess = UNSHARED) -> InferRequest:
    """An inference request body; `header_length` is its Inference-Header-Content-Length header,
    and `shared` reads the inputs that lie in shared memory."""
    header, binary = _split(body, header_length)
    try:
        doc = json.loads(header)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadRequestError(f"the request header is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequestError("the request must be a JSON object with `inputs`")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequestError("`id` must be a string")
    params = _parameters(doc, "the request")
    binary_output = _flag(params, "binary_data_output", False)
    requested = _requested(doc.get("outputs"), binary_output, shared)
    return InferRequest(
        id=request_id,
        inputs=decode_tensors(doc.get("inputs"), binary, shared),
        outputs=requested.binary,
        binary_output=binary_output,
        timeout_us=timeout_parameter(params.get("timeout")),
        shared_outputs=requested.shared,
        classifications=requested.classifications,
        priority=priority_parameter(params.get("priority", 0)),
    )


def class_count(value: object, what: str) -> int:
    """The `classification` parameter of a requested output: how many classes to return; 0, as
    in Triton, asks for the values themselves."""
    return _count(value, f"{what}: classification")


def priority_parameter(value: object) -> int:
    """The `priority` request parameter: Triton's uint64, 0 for none."""
    priority = _count(value, "parameter priority")
    if priority >= 2**64:
        raise BadRequestError(f"parameter priority must be below 2**64; got {priority}")
    return priority


MAX_TIMEOUT_US = 3_600_000_000  # an hour


def timeout_parameter(value: object) -> int | None:
    """The `timeout` request parameter: microseconds, as Triton takes it; 0 sets none."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TIMEOUT_US:
        raise BadRequestError(
            f"parameter timeout must be an integer of microseconds from 0 to {MAX_TIMEOUT_US}; "
            f"got {_short(value)}"
        )
    return value


def write_shared(name: str, array: np.ndarray, where: SharedSlice, shared: SharedAccess) -> dict[str, Any]:
    """An output written into its shared-memory region; its tensor object, which says where."""
    doc, raw = encode_tensor(name, array, binary=True)
    if len(raw) > where.byte_size:
        raise BadRequestError(
            f"output {name!r} is {len(raw)} bytes, but its shared_memory_byte_size is {where.byte_size}; "
            f"give it at least {len(raw)}"
        )
    shared.write(where, raw, f"output {name!r}")
    doc["parameters"] = {"shared_memory_region": where.region, "shared_memory_byte_size": len(raw)}
    if where.offset:
        doc["parameters"]["shared_memory_offset"] = where.offset
    return doc


def encode_response(
    header: Mapping[str, Any],
    outputs: list[Output],
    to_shared: Mapping[str, SharedSlice] | None = None,
    shared: SharedAccess = UNSHARED,
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary outputs follow it. Outputs
    in `to_shared` are written to their regions, and only described in the body."""
    to_shared = to_shared or {}
    docs, chunks, binary_sent = [], [], False
    for name, array, binary in outputs:
        if name in to_shared:
            docs.append(write_shared(name, array, to_shared[name], shared))
            continue
        doc, raw = encode_tensor(name, array, binary)
        docs.append(doc)
        chunks.append(raw)
        binary_sent |= binary
    payload = json.dumps({**header, "outputs": docs}, separators=(",", ":")).encode()
    if not binary_sent:
        return payload, None
    return b"".join([payload, *chunks]), len(payload)
