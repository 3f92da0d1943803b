"""Chains of element-wise ops fused into one kernel (fused mode; option pointwise_fusion).

Note [Element-wise chains are fused by rule, not by pattern]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Much of a small model's step is chains of element-wise ops between matrix products: GPT-2's tanh GELU
is eight ATen calls over one vector, a residual add feeds a ReLU, a bias add feeds a GELU. No pattern
list catches every chain a model writes, so after the patterns have fired this pass groups any
connected set of element-wise nodes of one shape and replaces it with one call of
graphex_fused::pointwise, whose program (Note [A chain of element-wise ops is one program],
csrc/fused/pointwise.h) runs the group's ops on each tile of the inputs while it is in cache.

What a node must be to join (ELEMENTWISE is the one table of the ops, _admits the one rule):
- an op of ELEMENTWISE, with only the arguments the table reads (add's alpha = 1, div without a
  rounding mode, _to_copy with only a dtype; gelu either way);
- its result and every tensor argument float32, bfloat16 or float16 on the CPU (a bool condition for
  where), of static shape; a bfloat16/float16 result only from arguments of that same dtype (eager's
  type promotion is then the identity; a float32 result reads any of them exactly);
- numbers (int or float, not bool) as its other arguments.
A node joins the group of one of its arguments (or the union of several) when they have its shape and:
- no node outside the group uses a member before this node (the fused call goes where the last member
  was, so every user of every member must come after it; this also rules out a cycle through a node
  outside the group);
- no node between the group's first member and this node may write memory (a mutable op, an opaque
  call): the members run later than they did, and must read what they read in eager.
Each group's results that something outside uses are the fused call's outputs, contiguous (a member
whose value is not contiguous does not join: the kernel writes contiguous memory). Groups of one node
stay as they are (eager's kernel).

What each element sees is eager's computation: each op in float32, a bfloat16/float16 result rounded
after the op that makes it (round_bf16/round_f16), numbers as eager's kernels use them (add and sub
round a number to a reduced dtype first, mul and div keep it in float32: measured, and pinned by
tests/python/test_pointwise_chains.py). Fused mode's tolerance covers the rest (exp, tanh, erf). A NaN's payload, and
which zero maximum/minimum pick between -0.0 and 0.0, are those of eager's vectorized loop (eager's scalar tail
differs there itself).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import torch
import torch.fx

from ..base import log as _log
from .checks import FUSED_DTYPES as _FLOATS
from .checks import fake_value

aten = torch.ops.aten
_ROUND = {torch.bfloat16: "round_bf16", torch.float16: "round_f16"}
_MAX_MEMBERS = 128
_MAX_INPUTS = 64


@functools.lru_cache(maxsize=None)
def kernel_tables() -> tuple[dict[str, int], dict[torch.dtype, int]]:
    """The kernel's opcode and output-dtype numbers, read from its own tables (GRAPHEX_POINTWISE_OPS,
    GRAPHEX_POINTWISE_DTYPES in csrc/fused/pointwise.h)."""
    from .. import _C  # noqa: F401  (registers graphex_fused::*)

    ops, dtypes = torch.ops.graphex_fused.pointwise_table().split(";")
    return ({entry.split(":")[0]: i for i, entry in enumerate(ops.split(","))},
            {getattr(torch, name): i for i, name in enumerate(dtypes.split(","))})


@dataclasses.dataclass(frozen=True)
class Elementwise:
    """How an ATen op becomes instructions: `opcode` over `operands` (argument positions), with `kwargs` the only
    keyword arguments admitted, each with the one value the kernel computes (None: any value `lower` reads).
    `exact`: the op's result is one of its inputs' values (no rounding needed in a reduced dtype);
    `rounds_number`: a number argument is rounded to a reduced result dtype before the op, as eager does."""
    opcode: str
    operands: tuple[int, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()
    exact: bool = False
    rounds_number: bool = False
    swap: bool = False  # rsub: other - self


def _e(opcode: str, n: int = 1, **kw: Any) -> Elementwise:
    return Elementwise(opcode, tuple(range(n)), **kw)


_ALPHA = (("alpha", 1),)
# The one table of the element-wise ops this pass fuses (Note [Element-wise chains are fused by rule, not by pattern]).
ELEMENTWISE: dict[Any, Elementwise] = {
    aten.add.Tensor: _e("add", 2, kwargs=_ALPHA, rounds_number=True),
    aten.add.Scalar: _e("add", 2, kwargs=_ALPHA, rounds_number=True),
    aten.sub.Tensor: _e("sub", 2, kwargs=_ALPHA, rounds_number=True),
    aten.sub.Scalar: _e("sub", 2, kwargs=_ALPHA, rounds_number=True),
    aten.rsub.Tensor: _e("sub", 2, kwargs=_ALPHA, rounds_number=True, swap=True),
    aten.rsub.Scalar: _e("sub", 2, kwargs=_ALPHA, rounds_number=True, swap=True),
    aten.mul.Tensor: _e("mul", 2),
    aten.mul.Scalar: _e("mul", 2),
    aten.div.Tensor: _e("div", 2),
    aten.div.Scalar: _e("div", 2),
    aten.maximum.default: _e("maximum", 2, exact=True),
    aten.minimum.default: _e("minimum", 2, exact=True),
    aten.neg.default: _e("neg", exact=True),
    aten.abs.default: _e("abs", exact=True),
    aten.relu.default: _e("relu", exact=True),
    aten.exp.default: _e("exp"),
    aten.log.default: _e("log"),
    aten.tanh.default: _e("tanh"),
    aten.sigmoid.default: _e("sigmoid"),
    aten.silu.default: _e("silu"),
    aten.erf.default: _e("erf"),
    aten.sqrt.default: _e("sqrt"),
    aten.rsqrt.default: _e("rsqrt"),
    aten.reciprocal.default: _e("reciprocal"),
    aten.sin.default: _e("sin"),
    aten.cos.default: _e("cos"),
    # approximate='tanh': gelu_tanh; the erf GELU as gelu_erf or gelu_erf_aten, as eager picks its kernel
    # (build_program; Note [The erf GELU as eager's kernels give it], csrc/fused/pointwise_kernels.h)
    aten.gelu.default: _e("gelu_tanh", kwargs=(("approximate", None),)),
    aten.pow.Tensor_Scalar: _e("pow", 2, rounds_number=True),
    aten.where.self: _e("where", 3, exact=True),
    aten._to_copy.default: _e("cast", kwargs=(("dtype", None),)),
}

# pow(x, e) as eager's kernel computes it for these exponents (a product, or the op it dispatches to: float32 and
# bfloat16 only; float16 takes std::pow for 0.5, -0.5 and -1, which differs at -inf and -0.0); in bfloat16, x ** 3 is
# two rounded products (build_program; float16 rounds once: both measured, pinned by tests)
_POW = {2.0: "square", 3.0: "cube", 0.5: "sqrt", -0.5: "rsqrt", -1.0: "reciprocal"}



def _static_shape(t: torch.Tensor) -> tuple[int, ...] | None:
    return tuple(t.shape) if all(isinstance(d, int) for d in t.shape) else None


def _is_number(a: Any) -> bool:
    return type(a) in (int, float)


def _admits(node: torch.fx.Node) -> str:
    """'' when `node` may join a chain, else why not (Note [Element-wise chains are fused by rule, not by pattern])."""
    spec = ELEMENTWISE.get(node.target)
    if spec is None:
        return "not an element-wise op of the table"
    out = fake_value(node)
    if not isinstance(out, torch.Tensor) or out.dtype not in _FLOATS or out.device.type != "cpu" \
            or _static_shape(out) is None or not out.is_contiguous():
        return "its result is not a contiguous float tensor of static shape on the CPU"
    for key, value in node.kwargs.items():
        allowed = dict(spec.kwargs)
        if key not in allowed or (allowed[key] is not None and value != allowed[key]):
            return f"argument {key}={value!r} is not what the kernel computes"
    if node.target is aten.gelu.default and node.kwargs.get("approximate", "none") not in ("none", "tanh"):
        return f"gelu's approximate={node.kwargs['approximate']!r}"
    if node.target is aten._to_copy.default and node.kwargs.get("dtype") not in _FLOATS:
        return "a cast to another dtype than float32, bfloat16 or float16"
    args = list(node.args)
    if len(args) != len(spec.operands):
        return "another number of arguments than the table's"
    for i, a in enumerate(args):
        if isinstance(a, torch.fx.Node):
            v = fake_value(a)
            if not isinstance(v, torch.Tensor) or v.device.type != "cpu" or _static_shape(v) is None:
                return f"argument {i} is not a tensor of static shape on the CPU"
            if node.target is aten.where.self and i == 0:
                if v.dtype != torch.bool:
                    return "where's condition is not a bool tensor"
            elif v.dtype not in _FLOATS:
                return f"argument {i} is {v.dtype}"
            elif out.dtype != torch.float32 and v.dtype != out.dtype and node.target is not aten._to_copy.default:
                return f"argument {i} is {v.dtype}, the result {out.dtype} (eager would round it first)"
        elif not _is_number(a) or node.target in (aten.where.self, aten.maximum.default, aten.minimum.default):
            return f"argument {i} is {type(a).__name__}, not a tensor or a number"
        elif type(a) is int and not -(1 << 63) <= a < (1 << 63):
            return f"argument {i} is an integer outside int64"
    if node.target is aten._to_copy.default and not isinstance(args[0], torch.fx.Node):
        return "a cast of a number"
    return ""


def _writes_memory(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    schema = getattr(node.target, "_schema", None)
    return schema is None or schema.is_mutable


@dataclasses.dataclass
class _Group:
    members: list[torch.fx.Node]
    shape: tuple[int, ...]
    first: int  # position of the first member


def find_groups(graph: torch.fx.Graph) -> list[list[torch.fx.Node]]:
    """The groups of Note [Element-wise chains are fused by rule, not by pattern], each in graph order."""
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    writes = [0]
    for n in nodes:
        writes.append(writes[-1] + _writes_memory(n))  # writes[i]: nodes before position i that write memory
    group_of: dict[torch.fx.Node, _Group] = {}
    for node in nodes:
        if node.op != "call_function" or node.target not in ELEMENTWISE:
            continue
        why = _admits(node)
        if why:
            _log.detail("element-wise chains: %s stays on its own: %s", node.name, why)
            continue
        shape = _static_shape(fake_value(node))
        candidates: list[_Group] = []
        for a in node.all_input_nodes:
            g = group_of.get(a)
            if g is not None and g.shape == shape and all(g is not c for c in candidates):
                candidates.append(g)
        joined = None
        for option in ([candidates] if len(candidates) > 1 else []) + [[c] for c in candidates]:
            if _can_join(node, option, pos, writes):
                joined = option
                break
        if joined is None:
            group = _Group([node], shape, pos[node])
        else:
            group = joined[0]
            for other in joined[1:]:
                group.members.extend(other.members)
                for m in other.members:
                    group_of[m] = group
            group.members.sort(key=pos.__getitem__)
            group.members.append(node)
            group.first = pos[group.members[0]]
        group_of[node] = group
    unique = {id(g): g for g in group_of.values()}
    return [g.members for g in unique.values() if len(g.members) >= 2 or _worth_alone(g.members[0])]


_GELU_ALONE_MAX = 8192


def _gelu_erf_opcode(node: torch.fx.Node) -> str:
    """The erf GELU's opcode (Note [The erf GELU as eager's kernels give it], csrc/fused/pointwise_kernels.h): ATen's
    use_mkldnn never takes a non-contiguous input or one of a single element (gelu_erf_aten); otherwise the kernel
    asks per call whether oneDNN is on and takes the dtype on the CPU it runs on."""
    x = fake_value(node.args[0])
    if not isinstance(x, torch.Tensor) or not x.is_contiguous() or x.numel() <= 1:
        return "gelu_erf_aten"
    return {torch.bfloat16: "gelu_erf_bf16", torch.float16: "gelu_erf_f16"}.get(x.dtype, "gelu_erf")


def _onednn_runs(node: torch.fx.Node) -> bool:
    """Whether eager's erf GELU at `node` is oneDNN's in this process (the kernel's per-call choice)."""
    opcode = _gelu_erf_opcode(node)
    if opcode == "gelu_erf_aten" or not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return False
    if opcode == "gelu_erf_bf16":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if opcode == "gelu_erf_f16":
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return True


def _worth_alone(node: torch.fx.Node) -> bool:
    """A group of one runs eager's kernel, except a small erf GELU: eager's is oneDNN's, whose per-call cost dominates
    a decode step's vector. Measured 2026-12-03, one thread, float32 [1, 1, n] (median us, eager / pointwise): 1024:
    10.3 / 5.2, 8192: 14.4 / 11.0, 16384: 22.1 / 25.1, 131072: 77.7 / 131.4 (oneDNN's erf is faster per element)."""
    return (node.target is aten.gelu.default and node.kwargs.get("approximate", "none") == "none"
            and fake_value(node).numel() <= _GELU_ALONE_MAX and _onednn_runs(node))


def _can_join(node: torch.fx.Node, groups: list[_Group], pos: dict[torch.fx.Node, int], writes: list[int]) -> bool:
    members = {m for g in groups for m in g.members}
    if len(members) + 1 > _MAX_MEMBERS:
        return False
    first = min(g.first for g in groups)
    if writes[pos[node]] - writes[first + 1] > 0:
        return False  # something between may write what a member reads
    for m in members:
        for user in m.users:
            if user is not node and user not in members and pos[user] < pos[node]:
                return False  # used outside before the fused call would run
    inputs = {a for m in members | {node} for a in m.all_input_nodes if a not in members and a is not node}
    return len(inputs) <= _MAX_INPUTS


@dataclasses.dataclass
class Program:
    inputs: list[torch.fx.Node]
    code: list[int]
    constants: list[float]
    outputs: list[torch.fx.Node]
    output_slots: list[int]


def build_program(members: list[torch.fx.Node]) -> Program:
    """The kernel's program for one group: instructions on SSA values, then slots by liveness."""
    ops = kernel_tables()[0]
    in_group = set(members)
    inputs: list[torch.fx.Node] = []
    for m in members:
        for a in m.args:
            if isinstance(a, torch.fx.Node) and a not in in_group and a not in inputs:
                inputs.append(a)
    value: dict[torch.fx.Node, int] = {a: i for i, a in enumerate(inputs)}  # SSA ids; inputs first
    constants: list[float] = []
    instrs: list[tuple[int, list[int]]] = []  # (opcode, SSA operands); instruction k defines SSA id len(inputs) + k

    const_index: dict[str, int] = {}  # by float.hex(): -0.0 and 0.0 stay apart, a NaN finds itself

    def const(x: float) -> int:
        if x.hex() not in const_index:
            const_index[x.hex()] = len(constants)
            constants.append(x)
        return -1 - const_index[x.hex()]

    def emit(opcode: str, *operands: int) -> int:
        instrs.append((ops[opcode], list(operands)))
        return len(inputs) + len(instrs) - 1

    for m in members:
        spec = ELEMENTWISE[m.target]
        dtype = fake_value(m).dtype
        reduced = dtype in _ROUND

        def operand(a: Any) -> int:
            if isinstance(a, torch.fx.Node):
                return value[a]
            # a number as eager's kernel uses it: converted once, to the op's dtype where eager rounds it there (add,
            # sub, pow in bfloat16/float16), else to float32 (an int over 2^24 as eager converts it, not via double)
            to = dtype if reduced and spec.rounds_number else torch.float32
            return const(float(torch.tensor(a, dtype=torch.int64 if type(a) is int else torch.float64).to(to)))

        if m.target is aten._to_copy.default:
            src, x = fake_value(m.args[0]).dtype, operand(m.args[0])
            value[m] = x if dtype == torch.float32 or dtype == src else emit(_ROUND[dtype], x)
            continue
        if m.target is aten.pow.Tensor_Scalar and float(m.args[1]) == 3.0 and dtype == torch.bfloat16:
            # eager multiplies in bfloat16 (float16: in float32): (x * x) rounded, then * x
            x = operand(m.args[0])
            result = emit("mul", emit(_ROUND[dtype], emit("square", x)), x)
        elif m.target is aten.pow.Tensor_Scalar and float(m.args[1]) in _POW and \
                (float(m.args[1]) in (2.0, 3.0) or dtype != torch.float16):
            result = emit(_POW[float(m.args[1])], operand(m.args[0]))
        elif m.target is aten.gelu.default and m.kwargs.get("approximate", "none") == "none":
            result = emit(_gelu_erf_opcode(m), operand(m.args[0]))
        else:
            args = [operand(a) for a in m.args]
            result = emit(spec.opcode, *(args[::-1] if spec.swap else args))
        if reduced and not spec.exact:
            result = emit(_ROUND[dtype], result)
        value[m] = result

    outputs = [m for m in members if any(u not in in_group for u in m.users)]
    code, slot_of = _allocate(len(inputs), instrs, [value[m] for m in outputs])
    return Program(inputs, code, constants, outputs, [slot_of[value[m]] for m in outputs])


def _allocate(n_inputs: int, instrs: list[tuple[int, list[int]]], live_out: list[int]) -> tuple[list[int], dict[int, int]]:
    """Slots for SSA values: inputs keep slots 0..n-1 (never written: the kernel may read them in place); an
    instruction's result takes a freed slot, possibly one its own operand frees (each op reads and writes one
    element at a time)."""
    last_use: dict[int, int] = {}
    for k, (_, operands) in enumerate(instrs):
        for v in operands:
            if v >= 0:
                last_use[v] = k
    for v in live_out:
        last_use[v] = len(instrs)
    slot_of = {v: v for v in range(n_inputs)}
    free: list[int] = []
    next_slot = n_inputs
    code: list[int] = []
    for k, (opcode, operands) in enumerate(instrs):
        for v in set(operands):
            if v >= n_inputs and last_use.get(v) == k:
                free.append(slot_of[v])
        if free:
            dst = free.pop()
        else:
            dst, next_slot = next_slot, next_slot + 1
        slot_of[n_inputs + k] = dst
        refs = [slot_of[v] if v >= 0 else v for v in operands] + [0] * (3 - len(operands))
        code += [opcode, dst, *refs]
    return code, slot_of


def fuse_elementwise_chains(gm: torch.fx.GraphModule) -> tuple[int, int]:
    """Replace each group of element-wise nodes with one graphex_fused::pointwise; returns (groups, nodes replaced)."""
    graph = gm.graph
    groups = find_groups(graph)
    replaced = fused_groups = 0
    for members in groups:
        program = build_program(members)
        if not program.outputs:
            continue  # nothing uses the group (dead code elimination removes it)
        fused_groups += 1
        last = members[-1]
        with graph.inserting_before(last):
            fused = graph.call_function(torch.ops.graphex_fused.pointwise.default, (
                program.inputs, program.code, program.constants,
                [x for slot, m in zip(program.output_slots, program.outputs)
                 for x in (slot, kernel_tables()[1][fake_value(m).dtype])]))
            fused.meta["val"] = [fake_value(m) for m in program.outputs]
            results = []
            for i, m in enumerate(program.outputs):
                item = graph.call_function(operator.getitem, (fused, i))
                item.meta["val"] = fake_value(m)
                results.append(item)
        for m, item in zip(program.outputs, results):
            m.replace_all_uses_with(item)
        for m in reversed(members):
            graph.erase_node(m)
        replaced += len(members)
    if fused_groups:
        gm.recompile()
    return fused_groups, replaced
