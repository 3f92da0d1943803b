"""Parse and check the op `graphex new op` generates: one OpSpec that every generator reads.

The schema is parsed by torch itself (torch._C.parse_schema); this module only normalizes
the types to their schema spelling and refuses what a graph-mode op must not do: return an
alias of an input, or claim to be in-place without declaring which input it writes.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from typing import Any

import torch

from graphex.errors import GraphexError

from ...custom_ops.typemap import TYPES

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Parameters of torch's auto_functionalized (the HOP in-place custom ops are compiled through).
_AUTO_FUNCTIONALIZED_NAMES = {"mode", "_mutable_op", "_all_bases", "_only_clone_these_bases",
                              "_only_clone_these_tensors", "_op_schema"}
_NO_DEFAULT = object()
_MODULE_NAMES = {"torch", "Optional", "Sequence", "Number"}  # globals of the generated modules


class SkeletonError(GraphexError, ValueError):
    """A request `graphex new` cannot turn into files: bad name or schema, files in the way."""


@dataclass(frozen=True)
class Arg:
    name: str
    type: str          # schema spelling: "Tensor", "Tensor?", "Tensor[]", "int[]", "ScalarType?", ...
    mutable: bool      # Tensor(a!): the op writes to it
    kwarg_only: bool   # after `*` in the schema
    default: Any = _NO_DEFAULT

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT

    @property
    def is_tensor(self) -> bool:
        """Tensor, Tensor?, Tensor[] or Tensor?[]: an input the reproducer passes to forward()."""
        return self.type.startswith("Tensor")


@dataclass(frozen=True)
class OpSpec:
    namespace: str
    name: str
    schema: str                  # as given, without the namespace: what define()/m.def() receive
    args: tuple[Arg, ...]
    returns: tuple[str, ...]     # () for "-> ()", ("Tensor",), ("Tensor", "Tensor"), ("Tensor[]",)

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.name}"

    @property
    def op(self) -> str:
        """How Python calls it: torch.ops.NS.NAME."""
        return f"torch.ops.{self.namespace}.{self.name}"

    @property
    def module(self) -> str:
        """Name of the generated registration module (and C++ extension): NS_NAME."""
        return f"{self.namespace}_{self.name}"

    @property
    def mutated(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.mutable)

    @property
    def inplace(self) -> bool:
        return bool(self.mutated)


def default_signature(name: str, inplace: bool) -> str:
    return f"{name}(Tensor(a!) x) -> ()" if inplace else f"{name}(Tensor x) -> Tensor"


def parse_op(qualname: str, signature: str | None = None, *, inplace: bool = False) -> OpSpec:
    """NS::NAME plus an optional schema -> OpSpec; raises SkeletonError saying what to change."""
    match = re.fullmatch(rf"({_IDENT})::({_IDENT})", qualname.strip())
    if match is None:
        raise SkeletonError(f"graphex new: expected the op as NAMESPACE::NAME (e.g. mylib::my_op), got {qualname!r}.")
    namespace, name = match.groups()
    for word in (namespace, name):
        if keyword.iskeyword(word):
            raise SkeletonError(f"graphex new: {word!r} is a Python keyword; it cannot name an op "
                                f"that Python calls as torch.ops.{namespace}.{name}. Pick another name.")
    if name in _MODULE_NAMES:
        raise SkeletonError(f"graphex new: an op named {name!r} would hide {name} in the generated "
                            "registration module; pick another name.")

    text = (signature or default_signature(name, inplace)).strip()
    try:
        schema = torch._C.parse_schema(text)
    except RuntimeError as e:
        raise SkeletonError(f"graphex new: cannot parse the signature {text!r}:\n{e}") from None
    _check_name(schema, namespace, name, text)
    schema_text = text.split("::", 1)[1] if text.startswith(f"{namespace}::") else text

    args = tuple(_arg(a, name) for a in schema.arguments)
    returns = tuple(_return(r, i, name) for i, r in enumerate(schema.returns))
    if any(r == "Tensor[]" for r in returns) and len(returns) > 1:
        raise SkeletonError(f"graphex new: {name} returns a Tensor[] inside a tuple; the skeleton supports "
                            "-> Tensor, -> (Tensor, Tensor, ...) and -> Tensor[]. Return the tensors separately.")
    spec = OpSpec(namespace, name, schema_text, args, returns)

    if inplace and not spec.inplace:
        raise SkeletonError(
            f"graphex new: the op is in-place (--inplace), but the signature {text!r} declares no mutable "
            "argument.\n"
            f"An in-place op must mark every input it writes as Tensor(a!) (e.g. "
            f"{default_signature(name, True)!r}); otherwise torch.compile assumes the input is unchanged "
            "and may reorder or drop the write. Mark it, or make the op out-of-place.")
    if spec.inplace and "Tensor[]" in returns:
        raise SkeletonError(
            f"graphex new: {name} writes its inputs and returns Tensor[]; torch.compile's auto_functionalized, "
            "which such ops go through, does not support list returns. Return a fixed number of tensors "
            "(-> (Tensor, Tensor)), or split the op.")
    clash = [a.name for a in args if a.name in _AUTO_FUNCTIONALIZED_NAMES]
    if spec.inplace and clash:
        raise SkeletonError(
            f"graphex new: {name} writes its inputs and has an argument named {clash[0]!r}. torch.compile "
            "runs such ops through auto_functionalized, which takes every argument by keyword next to "
            f"its own {clash[0]!r} parameter, and fails (\"got multiple values for argument\"). "
            f"Rename it (e.g. {clash[0].strip('_')}_).")
    if not any(a.type in ("Tensor", "Tensor[]") for a in args):
        raise SkeletonError(
            f"graphex new: {name} has no Tensor or Tensor[] argument. The skeleton derives its outputs "
            "and its fake function from the first tensor input, and dispatches on it; add one "
            f"(e.g. {name}(Tensor x, ...)).")
    if not returns and not spec.inplace:
        raise SkeletonError(f"graphex new: {name} returns nothing and writes no input (no Tensor(a!)): "
                            "in a graph it would do nothing. Return a Tensor or mark the input it updates.")
    return spec


def _check_name(schema: torch._C.FunctionSchema, namespace: str, name: str, text: str) -> None:
    given_ns, _, given_name = schema.name.rpartition("::")
    if given_name != name or (given_ns and given_ns != namespace):
        raise SkeletonError(
            f"graphex new: the op is {namespace}::{name} but the signature names {schema.name!r} ({text!r}).\n"
            f"Make them agree: --signature \"{name}({text.partition('(')[2]}\"")
    if schema.overload_name:
        raise SkeletonError(
            f"graphex new: overload names ({schema.name}.{schema.overload_name}) are not generated; "
            f"write the default overload first ({name}(...)) and add overloads by hand.")


def _arg(arg: Any, op_name: str) -> Arg:
    type_name = schema_type(arg.real_type)
    if keyword.iskeyword(arg.name) or arg.name in ("torch", "self"):
        raise SkeletonError(f"graphex new: argument {arg.name!r} of {op_name} would shadow a Python name "
                            "in the generated code; rename it.")
    if type_name not in TYPES:
        raise SkeletonError(f"graphex new: argument {arg.name!r} of {op_name} has type {type_name}, which the "
                            f"skeleton does not generate. Supported: {', '.join(TYPES)}.")
    alias = arg.alias_info
    mutable = alias is not None and alias.is_write
    if alias is not None and not mutable:
        raise SkeletonError(f"graphex new: argument {arg.name!r} of {op_name} has a read-only alias annotation "
                            "(Tensor(a)): that is for view ops, whose outputs alias inputs, which graph "
                            "capture does not allow for custom ops. Drop the annotation.")
    if mutable and type_name not in ("Tensor", "Tensor?", "Tensor[]"):
        raise SkeletonError(f"graphex new: argument {arg.name!r} of {op_name} is marked mutable but has type "
                            f"{type_name}; only Tensor, Tensor? and Tensor[] inputs can be written in place.")
    default = arg.default_value if arg.has_default_value() else _NO_DEFAULT
    return Arg(arg.name, type_name, mutable, arg.kwarg_only, default)


def _return(ret: Any, index: int, op_name: str) -> str:
    type_name = schema_type(ret.real_type)
    if ret.alias_info is not None:
        raise SkeletonError(
            f"graphex new: return {index} of {op_name} aliases an input (it carries an alias annotation, "
            "like Tensor(a)).\n"
            "A custom op must never return its inputs or views of them: after functionalization the "
            "graph would hand out a stale copy. If the op updates an input, mark that input Tensor(a!) "
            "and return nothing (-> ()); otherwise return a new tensor.")
    if type_name not in ("Tensor", "Tensor[]"):
        raise SkeletonError(f"graphex new: return {index} of {op_name} has type {type_name}; the skeleton "
                            "generates Tensor, Tensor[] and tuples of Tensor returns.")
    return type_name


def schema_type(jit_type: Any) -> str:
    """A parsed argument type back in schema spelling: Optional[List[int]] -> "int[]?"."""
    kind = jit_type.kind()
    if kind == "OptionalType":
        return schema_type(jit_type.getElementType()) + "?"
    if kind == "ListType":
        return schema_type(jit_type.getElementType()) + "[]"
    return _BASE_KINDS.get(kind, str(jit_type))


_BASE_KINDS = {
    "TensorType": "Tensor", "IntType": "int", "SymIntType": "SymInt", "FloatType": "float", "BoolType": "bool",
    "StringType": "str", "NumberType": "Scalar", "ScalarTypeType": "ScalarType", "DeviceObjType": "Device",
    "LayoutType": "Layout", "MemoryFormatType": "MemoryFormat",
}
