"""Frontend: TorchScript bytes -> ScriptModule -> ExportedProgram with a symbolic batch dimension."""

from __future__ import annotations

import contextlib
import io
import itertools
import pickletools
import re
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from compiler.dims import Dims, dynamic_sizes
from compiler.errors import ConversionError, InvalidModelError
from compiler.guards import ARGUMENT_DIM
from compiler.spec import DTYPES, TRACE_FILL, InputSpec
from compiler.verify import verification_batches

# The usual mistake is a file that torch wrote some other way: it says how to write the right one.
_TO_TORCHSCRIPT = (
    "save the model as TorchScript: torch.jit.save(torch.jit.script(model), path), or "
    "torch.jit.trace(model, example_inputs) where it does not script"
)

# How torch.save's legacy (non-zip) format begins: pickle protocol 2, then torch's magic number.
_LEGACY_TORCH_SAVE = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"


def load_torchscript(data: bytes) -> torch.jit.ScriptModule:
    """Load a TorchScript archive from bytes, on CPU, in eval mode; reject anything else clearly,
    and models whose code reaches outside their tensor math (_OUTSIDE_OPS)."""
    try:
        names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    except Exception as exc:  # BadZipFile, and for damaged ones OSError, NotImplementedError, ...
        if data.startswith(_LEGACY_TORCH_SAVE):
            raise InvalidModelError(
                f"the file is a pickle (torch.save), not TorchScript: {_TO_TORCHSCRIPT}"
            ) from exc
        raise InvalidModelError(
            "the file is not a TorchScript archive (expected the zip file written by torch.jit.save)"
        ) from exc
    other = _other_torch_archive(names)
    if other:
        raise InvalidModelError(f"the file is {other}, not TorchScript: {_TO_TORCHSCRIPT}")
    try:
        # torch's reader, not zipfile: it reads the archive as torch.jit.load will.
        reader = torch._C.PyTorchFileReader(io.BytesIO(data))
        outside = _outside_call(_compiled_unbuilt(reader)) if _defines_setstate(reader) else None
        if outside is None:
            # torch.jit.load, keeping the CompilationUnit: it holds every function the archive
            # defines, the methods of its modules and classes and its hooks among them.
            unit = torch._C.CompilationUnit()
            module = torch.jit._recursive.wrap_cpp_module(_import(unit, data))
            outside = _outside_call(unit)
    except InvalidModelError:
        raise
    except Exception as exc:  # torch raises RuntimeError and friends with long C++ traces
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidModelError(f"the file is not a TorchScript archive: {first_line}") from exc
    if outside:
        op, function, reason = outside
        raise InvalidModelError(
            f"the model calls {op} (in {function}), which {reason}; Kiln refuses models that reach "
            "outside their tensors"
        )
    module.eval()
    return module


def _import(unit: Any, data: bytes) -> Any:
    # As torch.jit.load calls it: torch's stubs give another signature.
    return torch._C.import_ir_module_from_buffer(unit, data, torch.device("cpu"), {}, False)  # type: ignore[call-arg, arg-type]


# Ops TorchScript compiles that reach outside a model's tensor math, and why each is refused.
# aten::from_file, aten::save and debugprims::load_tensor are the registered ops that take a file
# name (from_file reads a file, and with shared=True writes into it); prim::rpc_* call other
# hosts; the _unsafe ops skip the checks of their indices or sparse indices, and inductor's
# reinterpret a tensor's memory unchecked (a view 4096 times its size read the heap: other
# requests' inputs, the settings); prims are the unchecked primitives torch's own decompose to.
_RPC = "calls other hosts (torch.distributed.rpc)"
_UNCHECKED = "reads and writes memory outside its tensors, unchecked"
_OUTSIDE_OPS = {
    "aten::from_file": "reads and writes files on the server",
    "aten::save": "writes files on the server",
    "prim::rpc_async": _RPC,
    "prim::rpc_sync": _RPC,
    "prim::rpc_remote": _RPC,
    **dict.fromkeys(
        [
            "aten::_unsafe_index",
            "aten::_unsafe_index_put",
            "aten::_unsafe_masked_index",
            "aten::_unsafe_masked_index_put_accumulate",
            *(
                f"aten::_sparse_{kind}_tensor_unsafe"
                for kind in ("bsc", "bsr", "compressed", "coo", "csc", "csr")
            ),
        ],
        _UNCHECKED,
    ),
}
_OUTSIDE_NAMESPACES = {
    **dict.fromkeys(
        ["c10d", "_c10d_functional", "_c10d_functional_autograd", "symm_mem"],
        "talks to other processes and hosts (torch.distributed)",
    ),
    **dict.fromkeys(["inductor", "inductor_prims", "prims"], _UNCHECKED),
    "debugprims": "reads files on the server",
}
# A graph prints each node as `kind(inputs)`, those in if/loop bodies and in fork's subgraphs too.
_OUTSIDE_CALL = re.compile(rf"\b({'|'.join(_OUTSIDE_OPS)}|(?:{'|'.join(_OUTSIDE_NAMESPACES)})::\w+)\(")


def _outside_call(unit: Any) -> tuple[str, str, str] | None:  # torch's stubs lack get_functions
    """The first call that code in `unit` makes to an op of _OUTSIDE_OPS or _OUTSIDE_NAMESPACES:
    the op, the function that calls it, and why it is refused; None where there is none. Each
    function is read whole, and on its own: one calls another only by a call node."""
    done: set[str] = set()
    while fresh := [f for f in unit.get_functions() if f.qualified_name not in done]:
        for function in fresh:  # a function compiled lazily may define more
            done.add(function.qualified_name)
            called = _OUTSIDE_CALL.search(function.graph.str(False))  # False: without source lines
            if called:
                op = called[1]
                reason = _OUTSIDE_OPS.get(op) or _OUTSIDE_NAMESPACES[op.partition("::")[0]]
                return op, function.qualified_name, reason
    return None


# torch.jit.load builds the objects in data.pkl and constants.pkl, and runs the __setstate__ of
# those that have one (torch's quantized modules do), before anything can read their code. Where
# an archive defines one, its code is compiled first with no object built (_compiled_unbuilt).
_SETSTATE = b"__setstate__"
# The globals a TorchScript pickle names that the unpickler builds itself (torch/csrc/jit/
# serialization/unpickler.cpp, readGlobal: any name in the first three modules); it compiles any
# other from the archive's code, except C++ classes that torch and its extensions register.
_BUILT_BY_TORCH = {"torch", "torch.jit._pickle", "__main__"} | {
    "torch._utils _rebuild_tensor_v2",
    "torch._utils _rebuild_parameter",
    "torch._utils _rebuild_qtensor",
    "torch._utils _rebuild_sparse_tensor",
    "torch._tensor _rebuild_from_type_v2",
    "builtins complex",
    "collections OrderedDict",
}


def _defines_setstate(reader: Any) -> bool:
    """Whether the archive's code names __setstate__: an identifier, so it is there as written.
    torch compiles the code in code/ only, and finds records whatever their case."""
    code = (name for name in reader.get_all_records() if name.lower().startswith("code/"))
    return any(_SETSTATE in reader.get_record(name) for name in code)


def _compiled_unbuilt(reader: Any) -> Any:
    """The archive's code compiled as torch.jit.load compiles it, but with no object built: its
    data.pkl only names the types it names (GLOBAL), in its order, which compiles them; the
    import then fails, as that names no module. torch.jit.load reads constants.pkl first, and
    the code its constants, so it stays: it may hold only objects the unpickler builds itself.
    Wherever the import stops, it has compiled each type that torch.jit.load builds before it
    would stop there too."""
    probe = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(probe)
    for name in reader.get_all_records():
        content = reader.get_record(name)
        if name.lower() == "data.pkl":
            content = b"\x80\x02(" + b"".join(op for _, op in _globals(content)) + b"t."  # a tuple
        elif name.lower() == "constants.pkl":
            for named, _ in _globals(content):
                if not _built_by_torch(named):
                    raise InvalidModelError(
                        f"the model holds an object of its own ({named.replace(' ', '.')}) among its "
                        "constants, which torch.jit.load builds, running its __setstate__, before "
                        "Kiln can check its code; Kiln refuses such models"
                    )
        writer.write_record(name, content, len(content))
    writer.write_end_of_file()
    unit = torch._C.CompilationUnit()
    with contextlib.suppress(Exception):
        _import(unit, probe.getvalue())
    return unit


def _globals(pickled: bytes) -> Iterator[tuple[str, bytes]]:
    """Each GLOBAL in a pickle: its "module name", and its opcode's bytes."""
    ops = list(pickletools.genops(pickled))  # ends with STOP, or raises
    for (op, named, start), (_, _, end) in itertools.pairwise(ops):
        if op.name == "GLOBAL":
            yield str(named), pickled[start:end]


def _built_by_torch(named: str) -> bool:
    module, _, name = named.partition(" ")
    if module in _BUILT_BY_TORCH or named in _BUILT_BY_TORCH:
        return True
    namespace = module.removeprefix("__torch__.torch.classes.")
    if namespace == module:
        return False
    try:  # a C++ class: its __setstate__ is C++ too
        torch._C._get_custom_class_python_wrapper(namespace, name)
    except RuntimeError:
        return False
    return True


def _other_torch_archive(names: list[str]) -> str | None:
    """What a zip that torch wrote, but not torch.jit.save, holds; None for anything else. Names
    are compared without their folders: each format puts its files in one of its own."""
    files = {name.rpartition("/")[2] for name in names}
    if files & {"archive_format", "serialized_exported_program.json"}:  # torch.export, 2.6+ and older
        return "a torch.export archive (.pt2)"
    if "data.pkl" in files and "constants.pkl" not in files:
        return "a torch.save checkpoint (a state_dict or a pickled module)"
    return None


def export_program(module: torch.jit.ScriptModule, spec: InputSpec) -> Any:
    """TorchScript -> ExportedProgram where only the dynamic (-1) dims stay symbolic.

    TS2EPConverter marks every dimension symbolic and specialises the ones the model compares,
    recording guards for them; re-exporting its module (without those guards) with explicit
    dynamic_shapes pins the static dims and fails loudly if the model fixes a dynamic one.
    Each dynamic dim is first its own size from 1 up; where the model ties them (token ids and
    their mask share a length, a table of positions bounds it), export infers the ties instead
    and the variant serves the sizes they allow (compiler.dims).

    The converter gives dims of one size one symbol, so that `x[:, :y.shape[1]]` would read x's
    length for y's: the dynamic dims are traced at sizes of their own first, and at one size
    (TRACE_FILL) only where the model cannot run so (ids and their mask); dims the converter
    then took for one are exported as one, and the variant serves them equal.
    """
    axes = sum(size == -1 for t in spec.inputs for size in t.shape[1:])
    if axes > 1:
        with contextlib.suppress(ConversionError):
            apart = _convert_and_export(module, _sample(spec, distinct=True), spec)
            if _takes_verifications_inputs(apart, spec):
                return apart
    return _convert_and_export(module, _sample(spec, distinct=False), spec)


def _takes_verifications_inputs(program: Any, spec: InputSpec) -> bool:
    """Whether a program traced at sizes apart serves the inputs it will be verified and timed
    on, all at TRACE_FILL: a branch taken at 16 (`if x.shape[1] > 12`) is not that of 8."""
    dims = Dims.of(program, spec)
    for batch in verification_batches(spec):
        # Shapes without the memory: dims read shapes only.
        inputs = {
            t.name: np.broadcast_to(np.zeros((), DTYPES[t.dtype]), t.concrete_shape(batch))
            for t in spec.inputs
        }
        if dims is not None and dims.refusal(inputs) is not None:
            return False
    return True


def _sample(spec: InputSpec, distinct: bool) -> tuple[torch.Tensor, ...]:
    """Inputs to trace: the batch at 2, as export specialises a dimension traced at size 1; the
    other dynamic dims at TRACE_FILL, or, `distinct`, at TRACE_FILL, twice it, ... each."""
    batch = 2 if spec.max_batch_size > 1 else 1
    sizes = itertools.count(1)
    tensors = []
    for t in spec.inputs:
        shape = list(t.concrete_shape(batch))
        for axis in range(1, len(shape)):
            if t.shape[axis] == -1 and distinct:
                shape[axis] = TRACE_FILL * next(sizes)
        tensors.append(torch.from_numpy(np.ones(shape, DTYPES[t.dtype])))
    return tuple(tensors)


def _convert_and_export(
    module: torch.jit.ScriptModule, sample: tuple[torch.Tensor, ...], spec: InputSpec
) -> Any:
    from compiler import ts_export

    names: dict[str, str] = {}
    try:
        converted = ts_export.convert(module, sample)
        names = dict(zip(converted.graph_signature.user_inputs, spec.names, strict=True))
        unguarded = converted.module(check_guards=False)
        merged: dict[Any, list[tuple[str, int]]] = {}
        for where, expr in dynamic_sizes(converted, spec).items():
            merged.setdefault(expr, []).append(where)
        groups = [axes for axes in merged.values() if len(axes) > 1]
        try:
            program = _export(unguarded, sample, spec, groups, tied=False)
        except Exception as exc:
            if "Constraints violated" not in str(exc):
                raise
            program = _export(unguarded, sample, spec, groups, tied=True)
    except Exception as exc:
        raise ConversionError(f"TorchScript export failed: {_export_reason(exc, names)}") from exc
    # The converter's guards too: the branches it took (`if x.shape[1] > 12`), and sizes it read
    # one for another, which re-exporting its graph no longer sees. Its inputs are the program's.
    renamed = dict(
        zip(converted.graph_signature.user_inputs, program.graph_signature.user_inputs, strict=True)
    )
    for code in converted._guards_code:
        code = re.sub(r"L\['(\w+)'\]", lambda m: f"L['{renamed.get(m[1], m[1])}']", code)
        if code not in program._guards_code:
            program._guards_code.append(code)
    sizes = dynamic_sizes(program, spec)
    for axes in groups:
        if len({sizes[where] for where in axes}) > 1:
            dims = " and ".join(f"input {name!r} dim {axis}" for name, axis in axes)
            raise ConversionError(
                f"TorchScript export failed: {dims} are one size wherever the model runs, and its "
                "export reads one for the other: they cannot be compiled apart"
            )
    return program


def _export(
    module: Any,
    sample: tuple[torch.Tensor, ...],
    spec: InputSpec,
    groups: list[list[tuple[str, int]]],
    tied: bool,
) -> Any:
    shapes = _dynamic_shapes(spec, groups, tied)
    return torch.export.export(module, sample, dynamic_shapes=shapes, strict=False)


_FIXED = re.compile(r"specialized it to be a constant \((\d+)\)")


def _export_reason(exc: BaseException, names: dict[str, str]) -> str:
    """What export said, in the spec's words: a dim the model fixes, named by input and axis."""
    if "Constraints violated" not in str(exc):
        return _first_line(exc)
    dim = ARGUMENT_DIM.search(str(exc))
    fixed = _FIXED.search(str(exc))
    where = f"input {names.get(dim[1], dim[1])!r} dim {dim[2]}" if dim else "a dim"  # export named none
    size = f" at {fixed[1]}" if fixed else ""
    # Not always the model's doing: TorchScript's LSTM and GRU run at any length, but their export
    # takes the length they were traced at as a constant.
    return (
        f"the export fixes {where}{size}, which the input spec marks dynamic (-1): the model, or "
        "an op it uses (an LSTM, a GRU), takes it as a constant; give its size in the spec to "
        "compile it, or leave it dynamic and TorchScript serves it"
    )


def _dynamic_shapes(
    spec: InputSpec, groups: list[list[tuple[str, int]]], tied: bool
) -> tuple[dict[int, Any] | None, ...]:
    """One shared batch Dim (spec.check makes inputs agree on it); for each other -1 dim, its
    own Dim from 1 up (one for each of `groups`, dims traced as one), or, `tied`, Dim.DYNAMIC: a
    size export relates to the others and bounds as the model does.

    With max_batch_size 1 the batch is traced static: a Dim cannot have min == max.
    """
    batch = torch.export.Dim("batch", min=1, max=spec.max_batch_size) if spec.max_batch_size > 1 else None
    # Dim names must be identifiers; spec names may contain dots.
    shared = {where: torch.export.Dim(f"group{i}", min=1) for i, axes in enumerate(groups) for where in axes}
    shapes: list[dict[int, Any] | None] = []
    for index, t in enumerate(spec.inputs):
        dims: dict[int, Any] = {}
        for axis, size in enumerate(t.shape):
            if size == -1 and axis == 0 and batch is not None:
                dims[axis] = batch
            elif size == -1 and axis > 0:
                own = shared.get((t.name, axis)) or torch.export.Dim(f"input{index}_d{axis}", min=1)
                dims[axis] = torch.export.Dim.DYNAMIC(min=1) if tied else own
        shapes.append(dims or None)
    return tuple(shapes)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
