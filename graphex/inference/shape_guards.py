"""A dynamic=True trace's shape guards as typed postfix programs over the program's inputs, for the C++ loader.

Note [An exported program checks its shape guards] (csrc/schema/program.fbs) says why. The ShapeEnv writes its
guards as one Python expression over the graph's inputs (`L['t2'].size()[0] == L['t0'] and 5 <= L['t0']`,
capture.py's `_shape_guards`); this module cuts it at its top-level `and`s and turns each part into a
`ShapeGuard`: integer constants, an int input, a tensor input's size / stride / storage offset, and SymFn
arithmetic (the functions the engine's sym instructions already evaluate, with Python's semantics). Anything
else is `Unsupported`, naming the part: such a program is not exported (a guard the runtime cannot check is a
result it cannot vouch for).
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from ..fb import GuardOpKind as _kind
from ..program import Binding

_K = _kind.GuardOpKind


class Unsupported(Exception):
    """A shape guard that the C++ loader could not check; the message quotes it."""


@dataclasses.dataclass(frozen=True)
class GuardOp:
    kind: int              # fb GuardOpKind
    fn: str = "Add"        # Apply: the schema's SymFn name
    operands: int = 0      # Apply: how many values it takes from the stack
    input: int = 0         # Input, Size, Stride, StorageOffset
    dim: int = 0           # Size, Stride
    value: int = 0         # Const


@dataclasses.dataclass(frozen=True)
class ShapeGuard:
    ops: tuple[GuardOp, ...]
    text: str              # the guard as Python writes it (for the error that names it)


_BINARY = {ast.Add: "Add", ast.Sub: "Sub", ast.Mult: "Mul", ast.FloorDiv: "FloorDiv", ast.Mod: "Mod",
           ast.Pow: "Pow"}
_COMPARE = {ast.Eq: "Eq", ast.NotEq: "Ne", ast.Lt: "Lt", ast.LtE: "Le", ast.Gt: "Gt", ast.GtE: "Ge"}
# sympy helpers ShapeEnv's printer may call (torch.fx.experimental.symbolic_shapes.SYMPY_INTERP): same meaning
_CALLS = {"Eq": ("Eq", 2), "Ne": ("Ne", 2), "Lt": ("Lt", 2), "Le": ("Le", 2), "Gt": ("Gt", 2), "Ge": ("Ge", 2),
          "Max": ("Max", 2), "Min": ("Min", 2), "FloorDiv": ("FloorDiv", 2), "PythonMod": ("Mod", 2),
          "Mod": ("Mod", 2), "Not": ("Not", 1), "Abs": ("Abs", 1)}


def from_expression(text: str, bindings: list[Binding] | None = None) -> list[ShapeGuard]:
    """The guards of ShapeEnv's expression, one per top-level conjunct; Unsupported for one the runtime cannot
    evaluate. `bindings` (the entry's input bindings) name the inputs in each guard's text as the caller knows
    them (`args[0].size(0)`, not `L['t0']`)."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise Unsupported(f"the shape guards do not parse ({e.msg})") from None
    parts = tree.values if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And) else [tree]
    guards = []
    for part in parts:
        ops: list[GuardOp] = []
        _emit(part, ops, ast.unparse(part))
        guards.append(ShapeGuard(tuple(ops), ast.unparse(_Named(bindings or []).visit(part))))
    return guards


class _Named(ast.NodeTransformer):
    """`L['tK']` -> the caller's name of program input K; `X.size()[d]` -> `X.size(d)`."""

    def __init__(self, bindings: list[Binding]) -> None:
        self.bindings = bindings

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if (isinstance(node.value, ast.Call) and not node.value.args and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr in ("size", "stride")):
            base = self.visit(node.value.func.value)
            return ast.Call(ast.Attribute(base, node.value.func.attr, ast.Load()), [node.slice], [])
        if isinstance(node.value, ast.Name) and node.value.id == "L":
            try:
                k = _input_index(node, "")
            except Unsupported:
                return node
            if k < len(self.bindings):
                return ast.Name(self.bindings[k].describe(), ast.Load())
        return self.generic_visit(node)


def _input_index(node: ast.AST, where: str) -> int:
    """`L['tN']` -> N."""
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "L"
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
            and node.slice.value[:1] == "t" and node.slice.value[1:].isdigit()):
        return int(node.slice.value[1:])
    raise Unsupported(f"shape guard {where!r}: {ast.unparse(node)} is not a program input")


def _apply(ops: list[GuardOp], fn: str, operands: int) -> None:
    ops.append(GuardOp(_K.Apply, fn=fn, operands=operands))


def _emit(node: ast.AST, ops: list[GuardOp], where: str) -> None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        ops.append(GuardOp(_K.Const, value=int(node.value)))
    elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        ops.append(GuardOp(_K.Input, input=_input_index(node, where)))
    elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) and not node.value.args
          and isinstance(node.value.func, ast.Attribute) and node.value.func.attr in ("size", "stride")
          and isinstance(node.slice, ast.Constant) and type(node.slice.value) is int):
        kind = _K.Size if node.value.func.attr == "size" else _K.Stride
        ops.append(GuardOp(kind, input=_input_index(node.value.func.value, where), dim=node.slice.value))
    elif (isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Attribute)
          and node.func.attr == "storage_offset"):
        ops.append(GuardOp(_K.StorageOffset, input=_input_index(node.func.value, where)))
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _emit(node.left, ops, where)
        _emit(node.right, ops, where)
        _apply(ops, _BINARY[type(node.op)], 2)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not, ast.UAdd)):
        _emit(node.operand, ops, where)
        if not isinstance(node.op, ast.UAdd):
            _apply(ops, "Neg" if isinstance(node.op, ast.USub) else "Not", 1)
    elif isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):  # a <= b < c: (a <= b) and (b < c)
            _emit(operands[i], ops, where)
            _emit(operands[i + 1], ops, where)
            _apply(ops, _COMPARE[type(op)], 2)
            if i:
                _apply(ops, "And", 2)
    elif isinstance(node, ast.BoolOp):
        for i, value in enumerate(node.values):
            _emit(value, ops, where)
            if i:
                _apply(ops, "And" if isinstance(node.op, ast.And) else "Or", 2)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS
          and not node.keywords and len(node.args) == _CALLS[node.func.id][1]):
        fn, n = _CALLS[node.func.id]
        for a in node.args:
            _emit(a, ops, where)
        _apply(ops, fn, n)
    else:
        raise Unsupported(f"shape guard {where!r}: graphex's C++ runtime cannot evaluate {ast.unparse(node)!r}")
