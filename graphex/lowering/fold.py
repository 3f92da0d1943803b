"""Folding what depends only on frozen parameters or on nothing at all: computed once, when the program is lowered.

Note [Folding what reads no input]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A chain of operators that starts at factory calls or the graph's own tensor constants and
reads no input, parameter or buffer gives the same value on every call: Bloom's ALiBi slopes
(`full`, `arange`, `pow`), the `arange`s and `unsqueeze`s a causal mask is built from. It is run once, here, with eager's
kernels, in every mode, and read as a constant (6-22 operator calls a decode step on the
transformers families). The same rules as below keep it exact (never an output or a value an
output views, never written), and a few more: never a factory whose contents are unspecified
(`empty` and its kin) or seeded by the generator, only CPU values of static shape, and at most
FOLD_FACTORY_LIMIT bytes each, so that a model's large masks are not kept alive between calls.

Note [Folding frozen parameters]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
With frozen_parameter, parameters and buffers are known when a program is lowered (the
first call). An operator whose tensor inputs are all frozen parameters, tensor constants or
other folded values (e.g. the `t(weight)` that every `linear` becomes, a `.float()` of a
buffer, a table computed from a buffer) gives the same result on every call, so it is run
once, here, with eager's own kernel, and the program reads the result as a constant: the
same value the replay would have computed, so results stay bit for bit.

What is never folded: ops with mutable arguments or random results, ops that return
several values or none, graph outputs (an output must be a fresh tensor each call), values
an in-place op of the graph writes (through any view), and anything fed by a parameter the
graph itself mutates. Nor a value a custom operator reads (its schema is its author's), nor a
value an output shares memory with (`(w + 1).view(-1)` returned, also through `_unsafe_view`
and `unsafe_split`): the caller may write the output, which would write the folded value every
later call reads (found 2026-12-06: the second call returned what the caller wrote into the
first's result). A view of a frozen parameter itself may be returned through a view: eager's
output is a view of the parameter too.

A folded value goes stale if its parameter changes after lowering, so the engine watches
each parameter a fold reads (Note [A frozen parameter is checked by identity]):
- a view (`t`, `view`, `expand`, ...) shares the parameter's memory, so every write into it
  is seen for free; only new memory (`param.data = other`) invalidates it: its data pointer
  (with dtype, shape and strides) is watched (WATCH_DATA);
- a computed value (a copy, e.g. the `1.0 + weight` of a Gemma-style RMSNorm) is invalidated
  by any write into the parameter's bytes, however it is made: through the parameter, through
  `param.data` (a new tensor with its own version counter, so the parameter's counter misses
  it), through a view of it, by load_state_dict. No counter sees them all, so the engine keeps
  a copy of the bytes at bind time and compares them on every run (WATCH_CONTENTS).
The contents check costs a memcmp per run, so a computed value is folded only when the frozen
inputs it reads by contents span at most FOLD_CONTENTS_LIMIT bytes together (64 KiB: a few
microseconds; a norm weight or bias qualifies, a weight matrix does not) and are dense CPU
tensors. Past the limit the op stays in the program and reads the live parameter on every
call, which is always exact. Views are folded at any size (their check is a pointer compare).
A change re-lowers the program, which folds again from the current values.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from .. import _C
from ..passes.aliasing import allocation, mark_memory, written_args, written_nodes

# What the engine watches on a frozen input (Note [Folding frozen parameters]); ordered by strength. Defined once,
# by the engine (csrc/runtime/executor.h, Executor::Watch).
WATCH_IDENTITY, WATCH_DATA, WATCH_CONTENTS = _C.WATCH_IDENTITY, _C.WATCH_DATA, _C.WATCH_CONTENTS

# Note [Folding frozen parameters]: the most bytes of frozen inputs one computed fold may read by contents
# (each run compares them with a copy).
FOLD_CONTENTS_LIMIT = 64 * 1024

# torch's ops and our fused kernels (csrc/fused/: deterministic, no state, schemas that say what they write).
_TRUSTED = ("aten", "prims", "graphex_fused")

# Note [Folding what reads no input]: the most bytes one value computed from factory calls alone may hold.
FOLD_FACTORY_LIMIT = 64 * 1024

# Factories whose result has unspecified contents: what reads it must not be computed once and kept.
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})


@dataclasses.dataclass
class Folded:
    values: dict[torch.fx.Node, torch.Tensor]  # folded nodes that the program reads, with their values
    nodes: set[torch.fx.Node]  # every folded node (the program runs none of them)
    watch: dict[int, int]  # frozen input index -> WATCH_* level its folds need
    count: int  # operator calls removed from every run


def fold_constants(gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor],
                   written: set[torch.fx.Node] | None = None) -> Folded:
    """Evaluate every foldable node of `gm` given the frozen inputs (index -> real tensor; none without
    frozen_parameter, where only chains from factories fold). `written`: written_values(gm.graph), if the caller
    has it already."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    written = written_values(gm.graph) if written is None else written
    value: dict[torch.fx.Node, Any] = {}
    sources: dict[torch.fx.Node, dict[int, int]] = {}  # foldable node -> frozen inputs it reads, with watch level
    for index, node in enumerate(placeholders):
        if index in frozen and node not in written:
            value[node] = frozen[index]
            sources[node] = {index: WATCH_IDENTITY}
    # Note [Folding what reads no input]: a tensor constant of the graph (`torch.tensor(...)` in the traced code) is
    # the graph's own, as fixed as a factory call's result.
    factory: set[torch.fx.Node] = set()
    for node in gm.graph.find_nodes(op="get_attr"):
        attr = operator.attrgetter(str(node.target))(gm)
        if isinstance(attr, torch.Tensor) and node not in written:
            value[node] = attr
            sources[node] = {}
            factory.add(node)

    outputs = set(_output_nodes(gm))
    returned = _returned_memory(outputs)
    handed_out = _given_to_untrusted(gm.graph)
    folded: list[torch.fx.Node] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not _foldable_op(node) or node in outputs or node in written:
            continue
        if (node in returned or node in handed_out) and allocation(node).op != "placeholder":
            continue  # an output or a custom op could write it (Note [Folding frozen parameters])
        inputs = node.all_input_nodes
        from_factories = all(i in factory for i in inputs)
        if from_factories and not _factory_foldable(node):
            continue
        if any(i not in value for i in inputs):
            continue
        is_view = _is_view(node.target)
        reads: dict[int, int] = {}
        for i in inputs:
            for index, level in sources[i].items():
                need = max(level, WATCH_DATA if is_view else WATCH_CONTENTS)
                reads[index] = max(reads.get(index, WATCH_IDENTITY), need)
        by_contents = [frozen[index] for index, level in reads.items() if level == WATCH_CONTENTS]
        if by_contents and not _contents_watchable(by_contents):
            continue  # computed on every run from the live parameters instead
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: value[n])
        with _disable_current_modes(), torch.no_grad():
            result = node.target(*args, **kwargs)
        if not isinstance(result, torch.Tensor):
            continue
        value[node] = result
        sources[node] = reads
        folded.append(node)
        if from_factories:
            factory.add(node)

    folded_set = set(folded)
    used = {n: value[n] for n in folded if any(u not in folded_set for u in n.users)}
    watch: dict[int, int] = {}
    for n in used:
        for index, level in sources[n].items():
            watch[index] = max(watch.get(index, WATCH_IDENTITY), level)
    return Folded(values=used, nodes=folded_set, watch=watch, count=len(folded))


def contents_bytes(t: torch.Tensor) -> int:
    """The bytes `t` spans from its data pointer: what the engine copies and compares (WATCH_CONTENTS)."""
    if t.numel() == 0:
        return 0
    return (sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1) * t.element_size()


def _contents_watchable(tensors: list[torch.Tensor]) -> bool:
    """Whether the engine can watch these frozen inputs by contents within FOLD_CONTENTS_LIMIT."""
    for t in tensors:
        if (type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type != "cpu" or t.layout != torch.strided
                or t.is_quantized):
            return False
    return sum(contents_bytes(t) for t in tensors) <= FOLD_CONTENTS_LIMIT


def _foldable_op(node: torch.fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    if schema.is_mutable or len(schema.returns) != 1 or str(schema.returns[0].type) != "Tensor":
        return False
    # torch's ops and our fused kernels (csrc/fused/: deterministic, no state); a user's op may read state it does not
    # declare, so it runs on every call
    if torch.Tag.nondeterministic_seeded in target.tags or target.namespace not in _TRUSTED:
        return False
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and not any(isinstance(s, torch.SymInt) for s in val.shape)


def _factory_foldable(node: torch.fx.Node) -> bool:
    """Note [Folding what reads no input]: a call in a chain from factories alone that may be run once and kept."""
    if node.target._schema.name.split("::")[-1] in _UNINITIALIZED:
        return False
    val = node.meta["val"]  # _foldable_op: a tensor of static shape
    return val.device.type == "cpu" and val.numel() * val.element_size() <= FOLD_FACTORY_LIMIT


def _is_view(target: Any) -> bool:
    returns = target._schema.returns
    return bool(returns) and returns[0].alias_info is not None


def _given_to_untrusted(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The values a call outside _TRUSTED reads, and every value they are views of: a custom op's schema is its
    author's, and one that writes an argument it declares read-only would write a folded value for every later
    call (Note [A constant only read is not copied] trusts custom ops no further)."""
    given: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function" or (isinstance(node.target, torch._ops.OpOverload)
                                          and node.target.namespace in _TRUSTED):
            continue
        for value in node.all_input_nodes:
            mark_memory(value, given)
    return given


def _returned_memory(outputs: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """The outputs and every value an output may share memory with (views, `_unsafe_view`, `unsafe_split`, items of
    those, in-place results)."""
    returned: set[torch.fx.Node] = set()
    for node in outputs:
        mark_memory(node, returned)
    return returned


def written_values(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Every value an op of the graph may write: written_nodes (Note [One alias analysis]), and the values sharing
    memory with a written one through what schemas do not declare (a write into `_unsafe_view(clone)` writes the
    clone)."""
    written = written_nodes(graph)
    allocations = {allocation(n) for node in graph.nodes for n in written_args(node)}
    return written | {n for n in graph.nodes if allocation(n) in allocations}


def _output_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    out = gm.graph.output_node().args[0]
    flat = out if isinstance(out, (tuple, list)) else [out]
    return [n for n in flat if isinstance(n, torch.fx.Node)]

