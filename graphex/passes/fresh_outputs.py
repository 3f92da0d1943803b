"""Outputs that were new memory in the graph AOTAutograd handed us are new memory in the program we replay.

Note [A new output stays new]
AOTAutograd tells which outputs alias an input or an intermediate (it regenerates those per call) and which are
new memory (`non_alias`): those the caller gets as they are. graphex's passes rewrite the graph after that
decision: no-op removal drops a `clone` (`v = a.clone(); return v` returned the input `a` itself), CSE merges two
equal clones (two outputs became one tensor), reinplacing writes a result into a view. Values stay equal, but the
caller could then see one output change when writing another, or an input change when writing an output: a wrong
result once the caller writes. Each pass avoids the cases it knows; this is the one check at the end, over all of
them (found by the fuzzer once it took copies of values it writes: `snapshot` in sweeps/fuzz_gen.py). For each
output AOTAutograd calls new, what memory it names is compared before the passes and after, by the one alias
analysis (aliasing.root): where it is now a view, or shares an input's or another output's memory that it did not
share before, it gets a copy with the layout the graph gave it (its strides and dtype: what eager's kernel made).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx

from .aliasing import resolve_inplace, root, view_base

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Memory:
    """What one output names: a view of another value, the memory of these inputs, of these other outputs."""
    view: bool
    inputs: frozenset[int]
    outputs: frozenset[int]
    size: tuple[Any, ...] | None  # the output's layout as traced: what its copy must have
    stride: tuple[Any, ...] | None


def outputs_memory(graph: torch.fx.Graph) -> list[Memory | None]:
    """Per output of `graph` (None: not a tensor node), what memory it names."""
    placeholders = {p: i for i, p in enumerate(graph.find_nodes(op="placeholder"))}
    outputs = _outputs(graph)
    roots = [root(o) if isinstance(o, torch.fx.Node) else None for o in outputs]
    found: list[Memory | None] = []
    for i, (o, r) in enumerate(zip(outputs, roots)):
        if r is None:
            found.append(None)
            continue
        val = o.meta.get("val")
        found.append(Memory(
            view=view_base(resolve_inplace(o)) is not None,
            inputs=frozenset([placeholders[r]]) if r in placeholders else frozenset(),
            outputs=frozenset(j for j, other in enumerate(roots) if j != i and other is r),
            size=tuple(val.shape) if isinstance(val, torch.Tensor) else None,
            stride=tuple(val.stride()) if isinstance(val, torch.Tensor) else None))
    return found


def keep_new_outputs_new(graph: torch.fx.Graph, before: list[Memory | None], new_outputs: list[int] | None,
                         fake_mode: Any) -> int:
    """Copy each output in `new_outputs` (None: every output) that names memory it did not before the passes
    (Note [A new output stays new]); returns how many were copied."""
    after = outputs_memory(graph)
    outputs = _outputs(graph)
    if len(after) != len(before):
        return 0  # a pass (the user's) changed the outputs themselves: nothing to compare with
    candidates = range(len(outputs)) if new_outputs is None else [i for i in new_outputs if i < len(outputs)]
    copy = [i for i in candidates if before[i] is not None and after[i] is not None
            and ((after[i].view and not before[i].view) or after[i].inputs - before[i].inputs
                 or after[i].outputs - before[i].outputs)]
    # An output that was a view and only came to share memory with outputs that were new memory, each copied here,
    # stays the view eager returns: their copies part it from them (an empty slice of a value later written in place,
    # the fuzzer's seed 424).
    copy = [i for i in copy if not (before[i].view and not after[i].inputs - before[i].inputs
                                    and all(j in copy and not before[j].view
                                            for j in after[i].outputs - before[i].outputs))]
    copied = 0
    output_node = next(iter(graph.find_nodes(op="output")))
    for i in copy:
        was = before[i]
        with graph.inserting_before(output_node):
            outputs[i] = _copy(graph, outputs[i], was, fake_mode)
        copied += 1
    if copied:
        output_node.args = (_repack(output_node.args[0], outputs),)
    return copied


def _copy(graph: torch.fx.Graph, value: torch.fx.Node, was: Memory, fake_mode: Any) -> torch.fx.Node:
    """A copy of `value` in the layout the output had as traced: `clone` where that keeps it, else an
    `empty_strided` of that layout and a `copy_` into it."""
    val = value.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return graph.call_function(aten.clone.default, (value,))
    static = all(type(v) is int for v in (*(was.size or ()), *(was.stride or ())))
    with fake_mode:
        cloned = aten.clone.default(val)
        # symbolic sizes (dynamic=True): a clone, whose layout follows its source
        if not static or (tuple(cloned.shape) == was.size and tuple(cloned.stride()) == was.stride):
            node = graph.call_function(aten.clone.default, (value,))
            node.meta["val"] = cloned
            return node
        empty = graph.call_function(aten.empty_strided.default, (list(was.size), list(was.stride)),
                                    {"dtype": val.dtype, "device": val.device})
        empty.meta["val"] = aten.empty_strided.default(list(was.size), list(was.stride), dtype=val.dtype,
                                                       device=val.device)
        node = graph.call_function(aten.copy_.default, (empty, value))
        node.meta["val"] = empty.meta["val"]
        return node


def _outputs(graph: torch.fx.Graph) -> list[Any]:
    output = next(iter(graph.find_nodes(op="output")))
    args = output.args[0]
    return list(args) if isinstance(args, (list, tuple)) else [args]


def _repack(original: Any, outputs: list[Any]) -> Any:
    if isinstance(original, (list, tuple)):
        return type(original)(outputs)
    return outputs[0]
