"""The one encoder of graphex programs: a typed Program (graphex/program/typed.py) becomes a FlatBuffers `Program`.

The schema is csrc/schema/program.fbs; graphex/fb/ is flatc's Python code for it
(`make schema` regenerates it) and C++ reads the same bytes through flatc's header
(csrc/program/format.h, Note [One typed format]). Nothing here lays out bytes by hand:
every table is written with the generated builders.

Argument values are graphex.program.typed.Value (Note [One typed program]). Dtypes, devices,
layouts and memory formats are written as graphex's own enums, never as c10 integers
(Note [graphex owns its enums on disk] in format.h).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from graphex._vendor import flatbuffers
import torch

from . import typed
from ..fb import (Arg, ArgKind, Binding, BindingKind, Device, DeviceType, DType, Expect, Guard, GuardOp, Input,
                 InputKind, Kwarg, Layout, Leaf, LeafKind, MemoryFormat, Node, NodeKind, Program, SymFn, Tensor,
                 TensorMeta)
from .typed import Const, Slot

FILE_IDENTIFIER = b"GXPG"
# Bump with kFormatVersion in csrc/program/format.h when the meaning of any field changes.
FORMAT_VERSION = 4  # 3: a float argument of -0.0 is written (Note [A float's sign survives the format]). 4: a result
# leaf may be another view of a program output (Leaf "view")


class EncodeError(ValueError):
    """A value the format has no place for (the message names it)."""


_DTYPES: dict[torch.dtype, int] = {}
for _name, _code in vars(DType.DType).items():
    if not _name.startswith("_") and isinstance(_code, int):
        _torch_name = {"Bool": "bool", "BFloat16": "bfloat16", "Complex32": "complex32"}.get(_name, _name.lower())
        if isinstance(getattr(torch, _torch_name, None), torch.dtype):
            _DTYPES[getattr(torch, _torch_name)] = _code
DTYPE_NAMES = {code: str(dt).removeprefix("torch.") for dt, code in _DTYPES.items()}

_LAYOUTS = {torch.strided: Layout.Layout.Strided, torch.sparse_coo: Layout.Layout.Sparse,
            torch.sparse_csr: Layout.Layout.SparseCsr, torch._mkldnn: Layout.Layout.Mkldnn,  # type: ignore[attr-defined]
            torch.sparse_csc: Layout.Layout.SparseCsc, torch.sparse_bsr: Layout.Layout.SparseBsr,
            torch.sparse_bsc: Layout.Layout.SparseBsc, torch.jagged: Layout.Layout.Jagged}
_MEMORY_FORMATS = {torch.contiguous_format: MemoryFormat.MemoryFormat.Contiguous,
                   torch.preserve_format: MemoryFormat.MemoryFormat.Preserve,
                   torch.channels_last: MemoryFormat.MemoryFormat.ChannelsLast,
                   torch.channels_last_3d: MemoryFormat.MemoryFormat.ChannelsLast3d}
_DEVICE_TYPES = {"cpu": DeviceType.DeviceType.CPU, "cuda": DeviceType.DeviceType.CUDA,
                 "meta": DeviceType.DeviceType.Meta, "xpu": DeviceType.DeviceType.XPU,
                 "mps": DeviceType.DeviceType.MPS, "hpu": DeviceType.DeviceType.HPU}
_INPUT_KINDS = {"tensor": InputKind.InputKind.Tensor, "int": InputKind.InputKind.Int,
                "float": InputKind.InputKind.Float, "bool": InputKind.InputKind.Bool,
                "other": InputKind.InputKind.Other}
_NODE_KINDS = {typed.OpNode: NodeKind.NodeKind.Op, typed.GetItemNode: NodeKind.NodeKind.GetItem,
               typed.SymNode: NodeKind.NodeKind.Sym}
_BINDINGS = {"arg": BindingKind.BindingKind.Argument, "param": BindingKind.BindingKind.Parameter,
             "buffer": BindingKind.BindingKind.Buffer, "size": BindingKind.BindingKind.Size,
             "stride": BindingKind.BindingKind.Stride, "storage_offset": BindingKind.BindingKind.StorageOffset,
             "token": BindingKind.BindingKind.Token, "attr": BindingKind.BindingKind.ArgumentPath}
_LEAVES = {"graph": LeafKind.LeafKind.Output, "arg": LeafKind.LeafKind.Argument,
           "const": LeafKind.LeafKind.Constant, "view": LeafKind.LeafKind.OutputView}


def dtype_code(dtype: torch.dtype) -> int:
    if dtype not in _DTYPES:
        raise EncodeError(f"graphex programs cannot hold dtype {dtype}")
    return _DTYPES[dtype]


def _device_type(device: torch.device) -> int:
    if device.type in _DEVICE_TYPES:
        return _DEVICE_TYPES[device.type]
    if device.type == torch._C._get_privateuse1_backend_name():
        return DeviceType.DeviceType.PrivateUse1
    raise EncodeError(f"graphex programs cannot hold device type {device.type!r}")


def encode(program: typed.Program, constants: Sequence[torch.Tensor] = (), *,
           bindings: Sequence[typed.Binding] | None = None, leaves: Sequence[typed.Leaf] | None = None,
           tree: str | None = None, weights_file: str | None = None, info: dict[str, Any] | None = None,
           guards: Sequence[Any] | None = None) -> bytes:
    """Bytes of one Program: `program` is LoweredGraph.program; `constants` are stored inline when given
    (else the caller passes them to the executor). The keyword parts make a deployable artifact; `guards`: the
    shape guards of a dynamic=True trace (graphex.inference.shape_guards.ShapeGuard), written even when empty."""
    return _Encoder().program(program, constants, bindings, leaves, tree, weights_file, info, guards)


class _Encoder:
    def __init__(self) -> None:
        self.b = flatbuffers.Builder(4096)

    def string(self, s: str | None) -> int | None:
        return None if s is None else self.b.CreateString(s)

    def vector(self, start: Any, offsets: Sequence[int]) -> int:
        start(self.b, len(offsets))
        for off in reversed(offsets):
            self.b.PrependUOffsetTRelative(off)
        return self.b.EndVector()

    def scalars(self, start: Any, prepend: str, values: Sequence[Any]) -> int:
        start(self.b, len(values))
        for v in reversed(values):
            getattr(self.b, prepend)(v)
        return self.b.EndVector()

    def device(self, device: Any) -> tuple[int, int]:
        d = torch.device(device)
        return _device_type(d), -1 if d.index is None else d.index

    # -- values -----------------------------------------------------------------------------
    def arg(self, v: Any) -> int:
        b, K = self.b, ArgKind.ArgKind
        s = items = None
        if isinstance(v, str):
            s = b.CreateString(v)
        elif isinstance(v, (list, tuple)):
            items = self.vector(Arg.StartItemsVector, [self.arg(x) for x in v])
        Arg.Start(b)
        if v is None:
            Arg.AddKind(b, K.None_)
        elif isinstance(v, bool):
            Arg.AddKind(b, K.Bool)
            Arg.AddI(b, int(v))
        elif isinstance(v, Slot):
            Arg.AddKind(b, K.Slot)
            Arg.AddI(b, v.index)
        elif isinstance(v, Const):
            Arg.AddKind(b, K.Const)
            Arg.AddI(b, v.index)
        elif isinstance(v, int):
            if not -(1 << 63) <= v < (1 << 63):
                raise EncodeError(f"integer {v} does not fit in int64")
            Arg.AddKind(b, K.Int)
            Arg.AddI(b, v)
        elif isinstance(v, float):
            Arg.AddKind(b, K.Float)
            # Note [A float's sign survives the format]: FlatBuffers leaves out a field equal to its default, and
            # -0.0 == 0.0, so -0.0 was written as nothing and read back as 0.0 (`x * -0.0` replayed as `x * 0.0`,
            # every sign of zero wrong). Every float is written.
            b.ForceDefaults(True)
            Arg.AddF(b, v)
            b.ForceDefaults(False)
        elif s is not None:
            Arg.AddKind(b, K.Str)
            Arg.AddS(b, s)
        elif items is not None:
            Arg.AddKind(b, K.List)
            Arg.AddItems(b, items)
        elif isinstance(v, torch.dtype):
            Arg.AddKind(b, K.DType)
            Arg.AddDtype(b, dtype_code(v))
        elif isinstance(v, torch.layout):
            Arg.AddKind(b, K.Layout)
            Arg.AddLayout(b, _LAYOUTS[v])
        elif isinstance(v, torch.memory_format):
            Arg.AddKind(b, K.MemoryFormat)
            Arg.AddMemoryFormat(b, _MEMORY_FORMATS[v])
        elif isinstance(v, torch.device):
            Arg.AddKind(b, K.Device)
            Arg.AddDevice(b, Device.CreateDevice(b, *self.device(v)))
        else:
            raise EncodeError(f"graphex program: cannot encode a {type(v).__name__}: {v!r}")
        return Arg.End(b)

    def tensor_meta(self, m: typed.TensorMeta) -> int:
        sizes = self.scalars(TensorMeta.StartSizesVector, "PrependInt64", [-1 if s is None else s for s in m.sizes])
        strides = None
        if m.strides is not None:
            strides = self.scalars(TensorMeta.StartStridesVector, "PrependInt64",
                                   [-1 if s is None else s for s in m.strides])
        TensorMeta.Start(self.b)
        TensorMeta.AddDtype(self.b, dtype_code(m.dtype))
        TensorMeta.AddDevice(self.b, Device.CreateDevice(self.b, *self.device(m.device)))
        TensorMeta.AddSizes(self.b, sizes)
        if strides is not None:
            TensorMeta.AddStrides(self.b, strides)
        return TensorMeta.End(self.b)

    def input(self, e: typed.Input) -> int:
        name = self.b.CreateString(e.name)
        meta = self.tensor_meta(e.tensor) if e.tensor is not None else None
        Input.Start(self.b)
        Input.AddName(self.b, name)
        Input.AddKind(self.b, _INPUT_KINDS[e.kind])
        Input.AddSlot(self.b, e.slot)
        if meta is not None:
            Input.AddTensor(self.b, meta)
        return Input.End(self.b)

    def node(self, n: typed.Node) -> int:
        b = self.b
        strings = {k: self.string(getattr(n, k, None)) for k in ("name", "target", "source", "op", "overload")}
        args = self.vector(Node.StartArgsVector, [self.arg(a) for a in n.args])
        kwargs = None
        if isinstance(n, typed.OpNode) and n.kwargs:
            entries = []
            for key in sorted(n.kwargs):  # deterministic bytes: same program, same file
                key_off, value = b.CreateString(key), self.arg(n.kwargs[key])
                Kwarg.Start(b)
                Kwarg.AddName(b, key_off)
                Kwarg.AddValue(b, value)
                entries.append(Kwarg.End(b))
            kwargs = self.vector(Node.StartKwargsVector, entries)
        outs = self.scalars(Node.StartOutsVector, "PrependInt32", n.outs)
        expect = None
        if isinstance(n, typed.OpNode) and n.expect is not None:
            entries = []
            for e in n.expect:
                meta = None if e is None else self.tensor_meta(e)
                Expect.Start(b)
                if meta is not None:
                    Expect.AddTensor(b, meta)
                entries.append(Expect.End(b))
            expect = self.vector(Node.StartExpectVector, entries)
        Node.Start(b)
        Node.AddKind(b, _NODE_KINDS[type(n)])
        for key, off in strings.items():
            if off is not None:
                getattr(Node, "Add" + key.capitalize())(b, off)
        if isinstance(n, typed.SymNode):
            Node.AddSym(b, getattr(SymFn.SymFn, n.fn))  # the schema's name (graphex/lowering/lower.py)
        Node.AddArgs(b, args)
        if kwargs is not None:
            Node.AddKwargs(b, kwargs)
        Node.AddOuts(b, outs)
        if expect is not None:
            Node.AddExpect(b, expect)
        return Node.End(b)

    def constant(self, t: torch.Tensor) -> int:
        b = self.b
        t = t.detach().to("cpu").contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        b.StartVector(1, len(data), 16)  # force_align: 16 (flatc's Python code leaves it out)
        b.head = b.head - len(data)
        b.Bytes[b.head:b.head + len(data)] = data
        data_off = b.EndVector()
        sizes = self.scalars(Tensor.StartSizesVector, "PrependInt64", list(t.shape))
        Tensor.Start(b)
        Tensor.AddDtype(b, dtype_code(t.dtype))
        Tensor.AddSizes(b, sizes)
        Tensor.AddData(b, data_off)
        return Tensor.End(b)

    def binding(self, e: typed.Binding) -> int:
        # Note [A program input is bound by one typed Binding]; attr: Dynamo's access path, from L['flat_args'][index]
        name = e.fqn if e.kind in ("param", "buffer") else e.source if e.kind == "attr" else None
        name_off = self.string(name)
        Binding.Start(self.b)
        Binding.AddKind(self.b, _BINDINGS[e.kind])
        Binding.AddIndex(self.b, e.index)
        Binding.AddDim(self.b, e.dim)
        if name_off is not None:
            Binding.AddName(self.b, name_off)
        return Binding.End(self.b)

    def leaf(self, e: typed.Leaf) -> int:
        value = self.arg(e.value) if e.kind == "const" else None
        Leaf.Start(self.b)
        Leaf.AddKind(self.b, _LEAVES[e.kind])
        Leaf.AddIndex(self.b, e.index)
        if value is not None:
            Leaf.AddValue(self.b, value)
        return Leaf.End(self.b)

    def guard(self, g: Any) -> int:
        """Note [An exported program checks its shape guards]: the ops in order (postfix), and the text."""
        b = self.b
        text = b.CreateString(g.text)
        Guard.StartOpsVector(b, len(g.ops))
        for op in reversed(g.ops):
            GuardOp.CreateGuardOp(b, op.kind, getattr(SymFn.SymFn, op.fn), op.operands, op.input, op.dim, op.value)
        ops = b.EndVector()
        Guard.Start(b)
        Guard.AddOps(b, ops)
        Guard.AddText(b, text)
        return Guard.End(b)

    def program(self, p: typed.Program, constants: Sequence[torch.Tensor], bindings: Any, leaves: Any,
                tree: str | None, weights_file: str | None, info: dict[str, Any] | None,
                guards: Sequence[Any] | None = None) -> bytes:
        b = self.b
        guards_off = self.vector(Program.StartGuardsVector, [self.guard(g) for g in guards]) \
            if guards is not None else None
        consts = self.vector(Program.StartConstantsVector, [self.constant(t) for t in constants]) if constants else None
        name = b.CreateString(p.name)
        inputs = self.vector(Program.StartInputsVector, [self.input(e) for e in p.inputs])
        nodes = self.vector(Program.StartNodesVector, [self.node(n) for n in p.nodes])
        outputs = self.vector(Program.StartOutputsVector, [self.arg(a) for a in p.outputs])
        binds = self.vector(Program.StartBindingsVector, [self.binding(e) for e in bindings]) if bindings else None
        leafs = self.vector(Program.StartLeavesVector, [self.leaf(e) for e in leaves]) if leaves is not None else None
        tree_off, weights_off = self.string(tree), self.string(weights_file)
        info_off = self.string(json.dumps(info, sort_keys=True)) if info is not None else None
        Program.Start(b)
        Program.AddFormatVersion(b, FORMAT_VERSION)
        Program.AddName(b, name)
        Program.AddNumSlots(b, p.num_slots)
        Program.AddInputs(b, inputs)
        Program.AddNodes(b, nodes)
        Program.AddOutputs(b, outputs)
        Program.AddNumConstants(b, p.num_constants)
        if consts is not None:
            Program.AddConstants(b, consts)
        Program.AddCheckSignature(b, p.check_signature)
        for add, off in ((Program.AddBindings, binds), (Program.AddLeaves, leafs), (Program.AddTree, tree_off),
                         (Program.AddWeightsFile, weights_off), (Program.AddInfo, info_off),
                         (Program.AddGuards, guards_off)):
            if off is not None:
                add(b, off)
        b.FinishSizePrefixed(Program.End(b), file_identifier=FILE_IDENTIFIER)  # the size tells truncation
        return bytes(b.Output())
