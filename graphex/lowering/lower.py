"""Lowering: an ATen-level FX graph becomes a typed Program for the C++ core (Note [One typed program]).

Each value in the graph gets a slot; each call becomes a node of the program that
names its operator and refers to slots and constants (graphex/program/typed.py; written by
graphex/program/encode.py). Nothing here runs anything: C++ resolves the operators and checks
every argument against its schema when it builds the Program.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

from ..base import log as _log
from ..base.source import display_name, source_line
from ..program import Const, GetItemNode, Input, Node, OpNode, Program, Slot, SymNode, TensorMeta, Value
from ..fb import SymFn as _fb_sym
from ..custom_ops.registration import is_custom
from ..errors import CaptureError, Finding
from .fold import WATCH_CONTENTS, WATCH_DATA, WATCH_IDENTITY, fold_constants, written_values
from .prepack import CONVOLUTION_ON_PACKED, packed_call, prepack_convolution_weights
from ..compat import traces_side_streams
from .streams import ENTRY_STREAM, NOT_MADE_HERE, is_control_deps, slots_in, stream_of


@dataclasses.dataclass
class LoweredGraph:
    program: Program
    constants: list[torch.Tensor]
    num_ops: int
    # Indices of graph inputs that are not bound at run time (frozen parameters).
    frozen_inputs: list[int]
    dynamic: bool
    # The operator behind each program node (None for builtins), for error messages.
    node_ops: list[Any] = dataclasses.field(default_factory=list)
    # Note [Folding frozen parameters]: frozen input index -> what the engine watches on it (graphex/lowering/fold.py),
    # and how many operator calls folding removed.
    frozen_watch: dict[int, int] = dataclasses.field(default_factory=dict)
    folded_ops: int = 0

    @property
    def validates_fakes(self) -> bool:
        return self.program.validates_fakes


# Python callables that appear in graphs with symbolic shapes, by the schema's name of the function
# (csrc/schema/program.fbs, enum SymFn: the one list; `graphex.fb.SymFn` is flatc's copy of it).
_S = {name: name for name in vars(_fb_sym.SymFn) if not name.startswith("_")}  # a name it lacks: KeyError at import
_SYM_FNS: dict[Callable[..., Any], str] = {
    operator.add: _S["Add"], operator.sub: _S["Sub"], operator.mul: _S["Mul"],
    operator.floordiv: _S["FloorDiv"], operator.truediv: _S["TrueDiv"], operator.mod: _S["Mod"],
    operator.pow: _S["Pow"], operator.neg: _S["Neg"], operator.abs: _S["Abs"],
    operator.eq: _S["Eq"], operator.ne: _S["Ne"], operator.lt: _S["Lt"], operator.le: _S["Le"],
    operator.gt: _S["Gt"], operator.ge: _S["Ge"], operator.and_: _S["And"], operator.or_: _S["Or"],
    operator.not_: _S["Not"], torch.sym_not: _S["Not"], torch.sym_max: _S["Max"], torch.sym_min: _S["Min"],
    torch.sym_float: _S["ToFloat"], torch.sym_int: _S["ToInt"], math.ceil: _S["Ceil"], math.floor: _S["Floor"],
    math.trunc: _S["ToInt"], torch.sym_ite: _S["IfThenElse"],
}
for _name, _spec_name in (("_sym_ceil", "Ceil"), ("_sym_floor", "Floor")):
    if hasattr(torch, _name):
        _SYM_FNS[getattr(torch, _name)] = _S[_spec_name]
try:  # the FX-level sym helpers torch uses in shape expressions
    from torch.fx.experimental import sym_node as _sym_node

    for _name, _spec_name in (("sym_max", "Max"), ("sym_min", "Min")):
        if hasattr(_sym_node, _name):
            _SYM_FNS[getattr(_sym_node, _name)] = _S[_spec_name]
except ImportError:  # pragma: no cover
    pass


def lower(gm: torch.fx.GraphModule, *, name: str, frozen: dict[int, torch.Tensor] | None = None,
          prepack: bool = False) -> LoweredGraph:
    """Lower `gm` (functional or reinplaced ATen graph) to a typed Program.

    `frozen` maps graph-input indices to the real tensors to bake in as constants
    (option frozen_parameter). `prepack` (fused mode): convolutions on frozen weights read them reordered once
    (Note [A frozen convolution weight is prepacked once]). Raises CaptureError naming the node, its source line
    and the fix when something cannot run on the engine.
    """
    return _Lowering(gm, name, frozen or {}, prepack).run()


class _Lowering:
    def __init__(self, gm: torch.fx.GraphModule, name: str, frozen: dict[int, torch.Tensor],
                 prepack: bool = False) -> None:
        self.gm = gm
        self.name = name
        self.frozen = frozen
        self.value_of: dict[torch.fx.Node, Any] = {}  # node -> Slot / Const / python constant
        self.num_slots = 0
        self.constants: list[torch.Tensor] = []
        self.constant_index: dict[int, int] = {}
        self.nodes: list[Node] = []
        self.inputs: list[Input] = []
        self.num_ops = 0
        self.dynamic = False
        self.node_ops: dict[int, torch._ops.OpOverload] = {}
        written = written_values(gm.graph)  # one alias analysis for folding and prepacking
        # Note [Folding frozen parameters], Note [Folding what reads no input]
        self.folded = fold_constants(gm, frozen, written)
        # Note [A frozen convolution weight is prepacked once]: convolution node -> its reordered weight
        self.prepacked = prepack_convolution_weights(gm, frozen, written) if prepack else {}
        self.stream: int | None = None  # Note [Side streams in a program]: the stream the next op runs on
        self.lower_streams = traces_side_streams()  # torch < 2.13: annotations not lowered (compat)
        self.produced_on: dict[int, int | None] = {}  # slot -> the stream its op ran on

    # -- slots and constants --------------------------------------------------
    def new_slot(self) -> Slot:
        self.num_slots += 1
        return Slot(self.num_slots - 1)

    def const(self, t: torch.Tensor) -> Const:
        key = id(t)
        if key not in self.constant_index:
            self.constant_index[key] = len(self.constants)
            self.constants.append(t)
        return Const(self.constant_index[key])

    # -- driver ---------------------------------------------------------------
    def run(self) -> LoweredGraph:
        outputs: list[Value] = []
        input_index = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node, input_index)
                input_index += 1
            elif node.op == "get_attr":
                self.get_attr(node)
            elif node.op == "call_function":
                self.call_function(node)
            elif node.op == "output":
                outputs = [self.arg(a, node) for a in _flatten_outputs(node.args[0])]
            else:
                raise self.error(node, f"{node.op} nodes cannot be captured",
                                 "call_module/call_method nodes should not survive AOTAutograd; "
                                 "please report this graph (GRAPHEX_DUMP=dir writes it out).")
        if self.stream is not None:  # the program ends on the stream it was entered on
            self.switch_stream(None, self.gm.graph.output_node())
        program = Program(name=self.name, num_slots=self.num_slots, inputs=tuple(self.inputs),
                          nodes=tuple(self.nodes), outputs=tuple(outputs), num_constants=len(self.constants))
        node_ops = [self.node_ops.get(i) for i in range(len(self.nodes))]
        watch = {i: 0 for i in self.frozen}
        folded_ops = 0
        if self.folded is not None:
            watch.update(self.folded.watch)
            folded_ops = self.folded.count
            if folded_ops:
                _log.info("%s: folded %d operator calls that read only frozen parameters or no input at all",
                          self.name, folded_ops)
        for packed in self.prepacked.values():  # Note [A frozen convolution weight is prepacked once]
            watch[packed.weight] = WATCH_CONTENTS
            if packed.bias is not None:
                watch[packed.bias] = max(watch.get(packed.bias, WATCH_IDENTITY), WATCH_DATA)
        if self.prepacked:
            _log.info("%s: %d convolution(s) read their frozen weights reordered once for oneDNN", self.name,
                      len(self.prepacked))
        return LoweredGraph(program, self.constants, self.num_ops, sorted(self.frozen), self.dynamic, node_ops,
                            frozen_watch=watch, folded_ops=folded_ops)

    def placeholder(self, node: torch.fx.Node, index: int) -> None:
        val = node.meta.get("val")
        if index in self.frozen:
            self.value_of[node] = self.const(self.frozen[index])
            self.inputs.append(Input(display_name(node), "other", self.new_slot().index))
            return
        slot = self.new_slot()
        self.value_of[node] = slot
        name = display_name(node)
        if _is_effect_token(node):
            entry = Input(name, "other", slot.index)  # AOTAutograd passes None for a token at run time
        elif isinstance(val, torch.Tensor):
            sizes = tuple(_static_int(s) for s in val.shape)
            strides = tuple(_static_int(s) for s in val.stride())
            self.dynamic |= None in sizes
            if _is_synthetic_base(node):
                sizes = (None,) * len(sizes)  # Note [A synthetic base is as large as its storage]
            entry = Input(name, "tensor", slot.index, TensorMeta(val.dtype, val.device, sizes, strides))
        elif isinstance(val, (torch.SymBool, bool)):
            entry = Input(name, "bool", slot.index)
        elif isinstance(val, (torch.SymInt, int)):
            self.dynamic |= isinstance(val, torch.SymInt)
            entry = Input(name, "int", slot.index)
        elif isinstance(val, (torch.SymFloat, float)):
            entry = Input(name, "float", slot.index)
        else:
            entry = Input(name, "other", slot.index)
        self.inputs.append(entry)

    def get_attr(self, node: torch.fx.Node) -> None:
        value = operator.attrgetter(str(node.target))(self.gm)
        if isinstance(value, torch.Tensor):
            self.value_of[node] = self.const(value)
        elif isinstance(value, torch.fx.GraphModule) and node.users and all(
                is_control_deps(u.target) and u.args[1] is node for u in node.users):
            self.value_of[node] = value  # a control_deps body: inlined where it is called
        else:
            raise self.error(node, f"attribute {node.target!r} of type {type(value).__name__} cannot be captured",
                             "only tensor constants can be baked into a graph; control flow (torch.cond, "
                             "while_loop) and other subgraphs are not supported by graphex yet. Run this part "
                             "outside the compiled region, or use options={'force_eager': True}.")

    def call_function(self, node: torch.fx.Node) -> None:
        if self.folded is not None and node in self.folded.nodes:  # Note [Folding frozen parameters]
            if node in self.folded.values:
                self.value_of[node] = self.const(self.folded.values[node])
            return
        target = node.target
        if node in self.prepacked:  # Note [A frozen convolution weight is prepacked once]
            self.op(node, CONVOLUTION_ON_PACKED, args=packed_call(node, self.prepacked[node].reordered), kwargs={})
        elif isinstance(target, torch._ops.OpOverload):
            self.op(node, target)
        elif target is operator.getitem:
            self.getitem(node)
        elif target in _SYM_FNS:
            self.sym(node, _SYM_FNS[target])
        elif target is torch.ops.higher_order.with_effects:
            self.with_effects(node)
        elif is_control_deps(target):
            self.control_deps(node)
        elif isinstance(target, torch._ops.HigherOrderOperator):
            raise self.error(node, f"higher-order op {target.__name__} cannot be replayed by the engine",
                             "control flow (torch.cond, while_loop) and other higher-order ops are not replayed by "
                             "the engine yet. Use options={'force_eager': True} (this graph then runs with torch.fx, "
                             "after graphex's passes), or move that part out of the compiled region.")
        else:
            raise self.error(node, f"Python function {_qualname(target)} cannot be replayed by the engine",
                             "the graph calls a Python function that is not an operator. Wrap it as a custom "
                             "operator (torch.library.custom_op) so it has a schema, or keep it outside the "
                             "compiled region.")

    def with_effects(self, node: torch.fx.Node) -> None:
        """`with_effects(token, op, *args)`: AOTAutograd threads an effect token through ops with side effects
        (e.g. linalg's error checks). The engine runs ops in program order, which is the order the token
        enforces, so the op is called as is and the token passes through: result = (token, *op's outputs)."""
        token, target = node.args[0], node.args[1]
        if not isinstance(target, torch._ops.OpOverload):
            raise self.error(node, f"with_effects around {target!r}, which is not an operator",
                             "use options={'force_eager': True}, or move that call out of the compiled region.")
        self.op(node, target, args=node.args[2:], kwargs=node.kwargs)
        produced = self.value_of[node]
        outputs = produced if isinstance(produced, tuple) else (() if produced is None else (produced,))
        self.value_of[node] = (self.arg(token, node), *outputs)

    def control_deps(self, node: torch.fx.Node) -> None:
        """`control_deps(deps, body, *args)` = `body(*args)`: Dynamo wraps each stream sync (wait_stream,
        record_event, wait_event) in one, with the tensors it must follow as `deps`. The engine runs the program
        in order, so the body is inlined where the node stands and its outputs are its results."""
        _, body_node, *args = node.args
        body = self.value_of[body_node]
        placeholders = list(body.graph.find_nodes(op="placeholder"))
        if len(placeholders) != len(args) or node.kwargs:
            raise self.error(node, "a control_deps body whose inputs do not match its call", "please report this graph.")
        for p, a in zip(placeholders, args):
            self.value_of[p] = self.arg(a, node)
        for inner in body.graph.nodes:
            if inner.op == "call_function" and isinstance(inner.target, torch._ops.OpOverload):
                self.op(inner, inner.target)
            elif inner.op == "output":
                results = _flatten_outputs(inner.args[0])
                self.value_of[node] = tuple(self.value_of.get(r) if isinstance(r, torch.fx.Node) else r
                                            for r in results)
            elif inner.op != "placeholder":
                raise self.error(node, f"a control_deps body with a {inner.op} node ({inner.target})",
                                 "please report this graph.")

    def switch_stream(self, to: int | None, node: torch.fx.Node) -> None:
        """Note [Side streams in a program]: make stream `to` (None: the one the program was entered on) current."""
        switch = torch.ops.streams.fork.default if to is not None else torch.ops.streams.join.default
        self.stream_op(switch, f"{node.name}_stream_switch", node,
                       (self.stream_index(), ENTRY_STREAM if to is None else to))
        self.stream = to

    def keep_for_stream(self, node: torch.fx.Node, args: tuple[Value, ...], kwargs: dict[str, Value]) -> None:
        """A tensor made on one stream and read on another is recorded as used by the reader's stream, so the
        caching allocator does not hand its memory out again before that stream is done with it."""
        for value in slots_in((*args, *kwargs.values())):
            made = self.produced_on.get(value.index, NOT_MADE_HERE)
            if made is not NOT_MADE_HERE and made != self.stream:
                self.stream_op(torch.ops.streams.record_stream.default, f"{node.name}_record_stream", node,
                               (value, self.stream_index()))

    def stream_index(self) -> int:
        return ENTRY_STREAM if self.stream is None else self.stream

    def stream_op(self, op: torch._ops.OpOverload, name: str, node: torch.fx.Node, args: tuple[Value, ...]) -> None:
        """A `streams::*` call the program makes itself (no result), attributed to `node`'s source line."""
        self.node_ops[len(self.nodes)] = op
        self.nodes.append(OpNode(name, source_line(node), op._schema.name, op._overloadname, args, {}, ()))
        self.num_ops += 1

    def op(self, node: torch.fx.Node, target: torch._ops.OpOverload, args: Any = None, kwargs: Any = None) -> None:
        self.check_kernel(node, target)
        if self.lower_streams and target.namespace != "streams":  # syncs name their streams; other ops: their node's
            stream = stream_of(node)
            if stream != self.stream:
                self.switch_stream(stream, node)
        node_args = node.args if args is None else args
        node_kwargs = node.kwargs if kwargs is None else kwargs
        schema = target._schema
        returns = schema.returns
        outs: list[int] = []
        if len(returns) == 1:
            slot = self.new_slot()
            self.value_of[node] = slot
            outs = [slot.index]
        elif len(returns) > 1:
            # Tuple-returning op: each getitem user reads its element's slot directly.
            slots = [self.new_slot() for _ in returns]
            self.value_of[node] = tuple(slots)
            outs = [s.index for s in slots]
        else:
            self.value_of[node] = None
        args = tuple(self.tensor_arg(a, node) if _wants_tensor(schema, i) else self.arg(a, node)
                     for i, a in enumerate(node_args))
        kwargs = {k: self.tensor_arg(v, node) if _wants_tensor(schema, k) else self.arg(v, node)
                  for k, v in node_kwargs.items()}
        # What a custom op's fake/Meta function promised, for validate_fake's check on the first run.
        expect = _expected_outputs(node, len(outs)) if is_custom(target) and outs else None
        self.node_ops[len(self.nodes)] = target
        self.nodes.append(OpNode(node.name, source_line(node), schema.name, target._overloadname, args, kwargs,
                                 tuple(outs), expect))
        self.num_ops += 1
        for slot in outs:
            self.produced_on[slot] = self.stream
        if self.lower_streams and (self.stream is not None or any(self.produced_on.get(v.index) is not None
                                                                  for v in slots_in((*args, *kwargs.values())))):
            self.keep_for_stream(node, args, kwargs)
        if _log.detail_enabled():
            _log.detail("  %s: %s(%s)%s", node.name, _op_text(target),
                        ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())]),
                        f"  # {source_line(node)}" if source_line(node) else "")

    def check_kernel(self, node: torch.fx.Node, target: torch._ops.OpOverload) -> None:
        """An operator the engine will call must have a kernel for the device its inputs live on."""
        devices = {v.device.type for v in _tensor_vals(node)}
        for device in devices:
            key = _DISPATCH_KEYS.get(device)
            if key and not torch._C._dispatch_has_computed_kernel_for_dispatch_key(target.name(), key):
                ns, _, name = target.name().partition("::")
                raise self.error(
                    node, f"operator {target.name()} has no kernel for {key}, where its inputs live",
                    f"register a {device} implementation, e.g. `@torch.library.impl(\"{ns}::{name}\", \"{key}\")` "
                    f"or, for a custom_op, `@{name}.register_kernel(\"{device}\")`. A Meta/fake function only "
                    "describes shapes; the graph still needs a real kernel to run.")

    def getitem(self, node: torch.fx.Node) -> None:
        source, index = node.args
        produced = self.value_of.get(source)  # type: ignore[arg-type]
        if isinstance(produced, tuple):
            self.value_of[node] = produced[index]  # type: ignore[index]
            return
        slot = self.new_slot()
        self.value_of[node] = slot
        whole = self.arg(source, node)
        self.nodes.append(GetItemNode(node.name, source_line(node), (whole, index), (slot.index,)))
        if isinstance(whole, Slot) and whole.index in self.produced_on:  # an item of a list an op made
            self.produced_on[slot.index] = self.produced_on[whole.index]

    def sym(self, node: torch.fx.Node, fn: str) -> None:
        slot = self.new_slot()
        self.value_of[node] = slot
        self.dynamic = True
        if node.kwargs:
            raise self.error(node, f"keyword arguments to sym.{fn}", "please report this graph.")
        self.nodes.append(SymNode(node.name, source_line(node), fn, tuple(self.arg(a, node) for a in node.args),
                              (slot.index,)))

    # -- arguments --------------------------------------------------------------
    def tensor_arg(self, a: Any, user: torch.fx.Node) -> Value:
        """An argument the schema types as Tensor: a symbolic number there becomes a wrapped-number tensor."""
        if isinstance(a, torch.fx.Node) and not isinstance(a.meta.get("val"), torch.Tensor) and a in self.value_of:
            slot = self.new_slot()
            self.nodes.append(SymNode(f"{a.name}_as_tensor", source_line(user), _S["ScalarTensor"],
                                  (self.arg(a, user),), (slot.index,)))
            return slot
        return self.arg(a, user)

    def arg(self, a: Any, user: torch.fx.Node) -> Value:
        if isinstance(a, torch.fx.Node):
            if a not in self.value_of:
                raise self.error(user, f"uses {a.name} before it is defined", "please report this graph.")
            v = self.value_of[a]
            if isinstance(v, tuple):
                raise self.error(user, f"uses the whole tuple output of {a.name}", "please report this graph.")
            return v
        if isinstance(a, (list, tuple)):
            return tuple(self.arg(x, user) for x in a)
        if a is None or isinstance(a, (bool, int, float, str)):
            if isinstance(a, float) and not math.isfinite(a):
                return a  # inf / nan are valid float constants
            return a
        if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return a  # written as graphex's own enums by program.encode
        if isinstance(a, torch.Tensor) and not isinstance(a, FakeTensor):
            return self.const(a)
        raise self.error(user, f"has an argument of type {type(a).__name__} ({a!r}) that cannot be captured",
                         "pass it as a tensor or a Python number instead.")

    def error(self, node: torch.fx.Node, what: str, fix: str) -> CaptureError:
        op = _op_text(node.target) if isinstance(node.target, torch._ops.OpOverload) else ""
        return CaptureError(finding=Finding(
            what=f"cannot capture node '{node.name}' ({_target_text(node)}): {what}", where=source_line(node),
            fix=fix, op=op, node=node.name))


_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}

def _is_effect_token(node: torch.fx.Node) -> bool:
    """A graph input that only ever flows into with_effects as its token."""
    users = list(node.users)
    return bool(users) and all(u.target is torch.ops.higher_order.with_effects and u.args[0] is node
                               for u in users)


def _tensor_vals(node: torch.fx.Node) -> list[torch.Tensor]:
    vals = []
    for arg in node.all_input_nodes:
        v = arg.meta.get("val")
        if isinstance(v, torch.Tensor):
            vals.append(v)
    return vals


def _wants_tensor(schema: torch._C.FunctionSchema, position: int | str) -> bool:
    if isinstance(position, int):
        if position >= len(schema.arguments):
            return False
        formal = schema.arguments[position]
    else:
        formal = next((f for f in schema.arguments if f.name == position), None)
        if formal is None:
            return False
    return isinstance(formal.type, torch.TensorType)


def _expected_outputs(node: torch.fx.Node, count: int) -> tuple[TensorMeta | None, ...]:
    vals = node.meta.get("val")
    vals = list(vals) if isinstance(vals, (list, tuple)) and count > 1 else [vals]
    out = tuple(TensorMeta(v.dtype, v.device, tuple(_static_int(d) for d in v.shape))
                if isinstance(v, torch.Tensor) else None for v in vals)
    return out if len(out) == count else (None,) * count


def _is_synthetic_base(node: torch.fx.Node) -> bool:
    """Note [A synthetic base is as large as its storage]
    When aliasing inputs have no common `._base` (views made with `set_`, `from_file`, packed parameters),
    AOTAutograd passes the graph one "synthetic base" instead: a 1-D tensor over their whole storage
    (`torch.empty(0).set_(storage)`), and rebuilds the inputs with `as_strided`. At trace time the fake
    storage spans only what the inputs reach; at run time it is the real storage, which may be larger. The
    graph only reads it through `as_strided` (Dynamo guards the inputs themselves), so its size is not part
    of the signature: checking it refused every call (`expected int64[19], got int64[20]`)."""
    desc = node.meta.get("desc")
    return type(desc).__name__ == "SyntheticBaseAOTInput"


def _static_int(s: Any) -> int | None:
    if isinstance(s, int):
        return s
    if isinstance(s, torch.SymInt):
        expr = s.node.maybe_as_int()
        return int(expr) if expr is not None else None
    return None


def _flatten_outputs(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]



def _op_text(op: torch._ops.OpOverload) -> str:
    return f"{op._schema.name}.{op._overloadname}"


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}"


def _target_text(node: torch.fx.Node) -> str:
    if isinstance(node.target, torch._ops.OpOverload):
        return _op_text(node.target)
    if callable(node.target):
        return _qualname(node.target)
    return str(node.target)
