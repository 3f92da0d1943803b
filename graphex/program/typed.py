"""The typed program: what lowering (graphex/lowering/lower.py) produces and the one encoder (graphex/program/encode.py) writes.

Note [One typed program]
~~~~~~~~~~~~~~~~~~~~~~~~
A lowered graph is a `Program` of frozen dataclasses, never a `dict[str, Any]`: every field has one
name and one type here, mirrored field for field by the FlatBuffers tables of csrc/schema/program.fbs
(Program, Input, TensorMeta, Node, Expect), which C++ reads in place. Adding a field means: the
schema, this file, the encoder, and the C++ reader of that table; nothing parses it by key.

An argument `Value` is None, bool, int, float, str, a `Slot` (a value computed at run time), a
`Const` (a tensor of the constant table), a torch.dtype / layout / memory_format / device, or a
tuple of values (a list argument).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping, Union

import torch


@dataclasses.dataclass(frozen=True)
class Slot:
    """A runtime value: the output of a node or a graph input."""

    index: int

    def __repr__(self) -> str:
        return f"%{self.index}"


@dataclasses.dataclass(frozen=True)
class Const:
    """A tensor in the program's constant table."""

    index: int

    def __repr__(self) -> str:
        return f"const{self.index}"


Value = Union[None, bool, int, float, str, Slot, Const, torch.dtype, torch.layout, torch.memory_format,
              torch.device, tuple["Value", ...]]

InputKind = Literal["tensor", "int", "float", "bool", "other"]


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """A tensor's dtype, device and sizes (None: a symbolic size); strides where the program checks them."""

    dtype: torch.dtype
    device: torch.device
    sizes: tuple[int | None, ...]
    strides: tuple[int | None, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Input:
    """A graph input: its slot, and for a tensor what the signature check expects of it."""

    name: str
    kind: InputKind
    slot: int
    tensor: TensorMeta | None = None


@dataclasses.dataclass(frozen=True)
class OpNode:
    """A call of an operator, resolved by C++ through the dispatcher (`op`.`overload`) and checked against its
    schema when the Program is built. `expect`: what a custom op's fake promised per output (validate_fake)."""

    name: str
    source: str
    op: str
    overload: str
    args: tuple[Value, ...]
    kwargs: Mapping[str, Value]
    outs: tuple[int, ...]
    expect: tuple[TensorMeta | None, ...] | None = None

    @property
    def target(self) -> str:
        return f"{self.op}.{self.overload}"


@dataclasses.dataclass(frozen=True)
class GetItemNode:
    """`args[0][args[1]]` of a value that is not a multi-output op's (those outputs have slots of their own)."""

    name: str
    source: str
    args: tuple[Value, ...]
    outs: tuple[int, ...]
    target = "getitem"


@dataclasses.dataclass(frozen=True)
class SymNode:
    """Arithmetic on symbolic sizes; `fn` is the schema's name of the function (enum SymFn in program.fbs)."""

    name: str
    source: str
    fn: str
    args: tuple[Value, ...]
    outs: tuple[int, ...]

    @property
    def target(self) -> str:
        return f"sym.{self.fn}"


Node = Union[OpNode, GetItemNode, SymNode]


@dataclasses.dataclass(frozen=True)
class Program:
    """One graph for the engine: `num_slots` values, the inputs that fill some of them, the nodes in order, and
    the values returned. Constant tensors travel beside it (LoweredGraph.constants), `num_constants` of them."""

    name: str
    num_slots: int
    inputs: tuple[Input, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    num_constants: int
    check_signature: bool = True

    @property
    def validates_fakes(self) -> bool:
        return any(isinstance(n, OpNode) and n.expect is not None for n in self.nodes)


# Note [A program input is bound by one typed Binding]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Where program input i comes from on a call, decided once at capture (graphex/inference/capture.py):
# user argument `index`; a parameter or buffer `owner`.`name`; size, stride or storage offset `dim` of
# argument `index`; an effect token; a tensor that argument `index` holds at Dynamo's access path `source`.
# One dataclass for every reader: the encoder (table Binding of program.fbs, which C++'s graphex::Module
# and graphex-run read through the one binder), the cache entry's header (`to_json`, read back by `from_json`, which refuses anything it did not
# write), cache_compile's generated binder (graphex/inference/guards.py), export, and the names errors use.
BindingKind = Literal["arg", "param", "buffer", "size", "stride", "storage_offset", "token", "attr"]
_BINDING_KINDS = frozenset(BindingKind.__args__)  # type: ignore[attr-defined]
# The kinds the caller resolves and hands over as `held`, in binding order; the binder reads the rest from the
# arguments (Note [One binder], csrc/runtime/binder.h: Parameter, Buffer, ArgumentPath).
HELD_KINDS = frozenset({"param", "buffer", "attr"})


@dataclasses.dataclass(frozen=True)
class Binding:
    kind: BindingKind
    index: int = 0  # arg, attr, size, stride, storage_offset: the flat argument
    dim: int = 0  # size, stride: the dimension
    owner: str = ""  # param, buffer: the owning submodule's path ("" for the module itself)
    name: str = ""  # param, buffer: the attribute name
    source: str = ""  # Dynamo's source text: param / buffer (resolved per call by cache_compile), attr

    @property
    def fqn(self) -> str:
        """A parameter's or buffer's fully qualified name, as `module.get_parameter` takes it."""
        return f"{self.owner}.{self.name}" if self.owner else self.name

    def describe(self) -> str:
        """How the caller knows this input: `args[0]`, `args[0].size(1)`, `layers.0.weight`."""
        if self.kind == "arg":
            return f"args[{self.index}]"
        if self.kind in ("size", "stride"):
            return f"args[{self.index}].{self.kind}({self.dim})"
        if self.kind == "storage_offset":
            return f"args[{self.index}].storage_offset()"
        if self.kind in ("param", "buffer"):
            return self.fqn
        if self.kind == "attr":
            return self.source
        return "an effect token"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> "Binding":
        return _from_json(cls, d, kinds=_BINDING_KINDS)


LeafKind = Literal["graph", "arg", "const", "view"]
_LEAF_KINDS = frozenset(LeafKind.__args__)  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One leaf of the function's result: program output `index`, another view of it ("view": Note [Two views of
    one output are two tensors]), argument `index` returned as it came, or a Python constant `value` (table Leaf
    of program.fbs)."""

    kind: LeafKind
    index: int = 0
    value: None | bool | int | float | str = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> "Leaf":
        leaf = _from_json(cls, d, kinds=_LEAF_KINDS)
        if not isinstance(leaf.value, (type(None), bool, int, float, str)):
            raise ValueError(f"a result leaf's value is a {type(leaf.value).__name__}")
        return leaf


def _from_json(cls: Any, d: Any, *, kinds: frozenset[str]) -> Any:
    """A dataclass back from its to_json form; ValueError naming what is not as written."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if not isinstance(d, dict) or set(d) - set(fields) or d.get("kind") not in kinds:
        raise ValueError(f"not a {cls.__name__}: {d!r:.120}")
    for name, value in d.items():  # a field with an int or str default holds that type (kind: checked above)
        default = fields[name].default
        want = type(default) if isinstance(default, (int, str)) and not isinstance(default, bool) else None
        if want is not None and (not isinstance(value, want) or isinstance(value, bool)):
            raise ValueError(f"{cls.__name__} field {name!r} is {value!r:.60}")
    return cls(**d)
