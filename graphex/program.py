"""The typed program: what lowering (graphex/lower.py) produces and the one encoder (graphex/_spec.py) writes.

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
from typing import Literal, Mapping, Union

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
