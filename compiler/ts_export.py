"""TorchScript -> ExportedProgram through torch's TS2EPConverter, with the repairs torch 2.13 needs.

The converter translates TorchScript IR node by node, then re-exports the result with every
dimension symbolic. Three things break that for real models:

- Fused fast paths. nn.TransformerEncoderLayer and nn.MultiheadAttention choose at run time
  between a fused kernel and plain ops. The checks that choose (list comprehensions, device and
  requires_grad tests) are IR the converter cannot translate, and no compiler has a converter for
  the fused kernels. `simplify` rewrites the graph to always take the plain path, which computes
  the same function, and deletes the checks.
- A weight read in one block and used in a nested one is not lifted into the nested block;
  `simplify` re-reads it where it is used.
- Integer arithmetic and comparisons on sizes become calls like `aten.mul.int` whose schemas take
  plain ints, so re-exporting bakes the trace-time batch size into reshapes. `_patched_converter`
  emits Python operators instead, which keep sizes symbolic.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

FUSED_FAST_PATHS = ("aten::_transformer_encoder_layer_fwd", "aten::_native_multi_head_attention")

# Nodes with effects a dead If must not drop.
_EFFECTS = frozenset({"prim::RaiseException", "aten::warn", "prim::Print", "prim::SetAttr"})

_LOCK = threading.Lock()

# The converter narrates normal work: constant torch.cond predicates, unused LSTM weights.
_EXPECTED_WARNINGS = ("Pred is a Python constant", "Manually populate", "Converting aten::append")

# torch._C.Graph, Node, Value and Block: their stubs lack most of the IR API used here.
IR = Any


def convert(module: torch.jit.ScriptModule, sample: tuple[torch.Tensor, ...]) -> Any:
    """TS2EPConverter(module, sample).convert() with the repairs above."""
    from torch._export import converter

    with _LOCK, _patched_converter(converter), warnings.catch_warnings():
        for message in _EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        ts2ep = converter.TS2EPConverter(module, sample)
        simplify(ts2ep.ts_graph)
        return ts2ep.convert()


def simplify(graph: IR) -> None:
    """Take the plain path at every fused fast path, then fold away the checks that chose it."""
    for kind in FUSED_FAST_PATHS:
        for node in graph.findAllNodes(kind):
            _force_plain_path(graph, node)
    # MultiheadAttention's self-attention test `query is key`, with one tensor on both sides.
    for kind, value in (("aten::__is__", True), ("aten::__isnot__", False)):
        for node in graph.findAllNodes(kind):
            if node.inputsAt(0).unique() == node.inputsAt(1).unique():
                _replace_with_constant(graph, node, value)
    # Kiln feeds dense numpy arrays, never nested tensors.
    for node in graph.findAllNodes("prim::is_nested"):
        _replace_with_constant(graph, node, False)
    torch._C._jit_pass_constant_propagation(graph)
    _drop_dead_ifs(graph)
    _sink_attribute_reads(graph)


def _sink_attribute_reads(graph: IR) -> None:
    """Re-read a tensor attribute inside each nested block that uses it.

    The converter lifts into an If branch only the attributes read (prim::GetAttr) inside that
    branch; a weight read outside and used inside is reported as "Attribute ... not found".
    """
    for node in graph.findAllNodes("prim::GetAttr"):
        if not node.output().type().isSubtypeOf(torch._C.TensorType.get()):
            continue
        for use in node.output().uses():
            if use.user.owningBlock() != node.owningBlock():
                copy = graph.createClone(node, lambda value: value)
                copy.insertBefore(use.user)
                use.user.replaceInput(use.offset, copy.output())


def _force_plain_path(graph: IR, fused: IR) -> None:
    """Set the condition of the If that picks the fused result over the plain one.

    TorchScript lowers `if ok: return fused(...)` to Ifs that pass the result outwards, with
    prim::Uninitialized on the not-returned side, until an If whose other side computes the
    plain path. That If's condition is the one to pin.
    """
    value = fused.outputsAt(0)
    while len(value.uses()) == 1:
        use = value.uses()[0]
        if use.user.kind() == "prim::TupleConstruct":
            value = use.user.output()
            continue
        if use.user.kind() != "prim::Return":
            return
        if_node = use.user.owningBlock().owningNode()
        if if_node is None or if_node.kind() != "prim::If":
            return
        blocks = list(if_node.blocks())
        branch = 0 if blocks[0] == use.user.owningBlock() else 1
        other = list(blocks[1 - branch].outputs())[use.offset]
        if other.node().kind() != "prim::Uninitialized":
            condition = graph.insertConstant(branch == 1)
            condition.node().moveBefore(if_node)
            if_node.replaceInput(0, condition)
            return
        value = list(if_node.outputs())[use.offset]


def _replace_with_constant(graph: IR, node: IR, value: bool) -> None:
    constant = graph.insertConstant(value)
    constant.node().moveBefore(node)
    node.output().replaceAllUsesWith(constant)
    node.destroy()


def _drop_dead_ifs(graph: IR) -> None:
    """Dead-code elimination that also drops unused Ifs whose only writes go to their own lists.

    TorchScript's DCE keeps any If that appends to a list, even one built inside it.
    """
    while True:
        torch._C._jit_pass_dce(graph)
        dead = [
            node
            for node in graph.findAllNodes("prim::If")
            if not any(out.uses() for out in node.outputs()) and _is_pure(node)
        ]
        if not dead:
            return
        dead[0].destroy()


def _is_pure(if_node: IR) -> bool:
    """No effects outside the If: no raise/print/SetAttr, and writes ("!" in the schema) only to
    lists built inside it."""
    for block in if_node.blocks():
        for node in block.nodes():
            if node.kind() in _EFFECTS:
                return False
            if "!" in node.schema() and not (
                node.kind() == "aten::append" and _defined_inside(node.inputsAt(0), if_node)
            ):
                return False
            if list(node.blocks()) and (node.kind() != "prim::If" or not _is_pure(node)):
                return False
    return True


def _defined_inside(value: IR, if_node: IR) -> bool:
    block = value.node().owningBlock()
    while block is not None:
        owner = block.owningNode()
        if owner is None:
            return False
        if owner == if_node:
            return True
        block = owner.owningBlock()
    return False


def _concrete(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], bool]:
    """A comparison that yields a Python bool, so torch.cond sees a constant predicate.

    bool() only adds a shape guard when the answer really depends on a symbolic size.
    """

    def compare(a: Any, b: Any) -> bool:
        return bool(op(a, b))

    compare.__name__ = f"concrete_{op.__name__}"
    return compare


_SCALAR_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "mul.int": operator.mul,
    "add.int": operator.add,
    "sub.int": operator.sub,
    "floordiv.int": operator.floordiv,
    "remainder.int": operator.mod,
    **{
        f"{name}.{overload}": _concrete(op)
        for name, op in (
            ("eq", operator.eq),
            ("ne", operator.ne),
            ("lt", operator.lt),
            ("gt", operator.gt),
            ("le", operator.le),
            ("ge", operator.ge),
        )
        for overload in ("int", "int_list")
    },
}


@contextlib.contextmanager
def _patched_converter(converter: Any) -> Iterator[None]:
    """Route int-scalar aten ops to Python operators for the duration of one conversion."""
    cls = converter.TS2FXGraphConverter
    original = cls.convert_call_function_op

    def convert_call_function_op(self: Any, node: IR) -> None:
        target = converter.get_op_overload(node)
        schema = target._schema
        op = _SCALAR_OPS.get(f"{schema.name.split('::')[-1]}.{schema.overload_name}")
        if op is None:
            original(self, node)
            return
        args, _ = self.get_args_kwargs(node, schema)
        self.name_to_node[node.output().debugName()] = self.fx_graph.call_function(op, args)

    cls.convert_call_function_op = convert_call_function_op
    try:
        yield
    finally:
        cls.convert_call_function_op = original
