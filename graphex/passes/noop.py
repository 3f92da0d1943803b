"""Removing no-op ops (inductor's pass) without reading an input after it was overwritten.

Note [A copy of an input is a snapshot]
The functional graph AOTAutograd hands us writes mutated inputs back at its end (`copy_(arg, new)`), in
input order. `y = x.clone()` (or `aten.copy(dst, x)`, a same-dtype `_to_copy`) of such an input is a
snapshot of its old value; inductor's remove_noop_ops replaces it with `x` itself, so a later write-back
read the new value (found by the fuzzer, seed 2196: `a4.copy_(a6); a6.zero_()` left a4 zero). Here a
no-op whose result is not a view of its source, and whose source is memory the graph writes (or a new value
of a mutated input, which reinplacing puts into that input's memory: seed 8832), stays.

Note [A returned view stays a view]
A no-op view the graph returns (`view` to the same shape at the end of `torch.inner`, `tensordot`) stays: eager's
result is that view (`_is_view()`, a `_base`), and without it the caller would get its source instead. Inductor
drops it, because inductor's outputs are new memory anyway; graphex hands its outputs over as they are.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Iterator

import torch
import torch.fx
from torch._inductor.fx_passes.post_grad import noop_registry, remove_noop_ops

from .. import compat
from .aliasing import reaches_output
from torch._inductor.fx_utils import get_node_storage


def _kept_noop(target: Any, *args: Any, **kwargs: Any) -> Any:
    """Stands in for a no-op the pass must not remove (it is not in inductor's registry)."""
    return target(*args, **kwargs)


def remove_noop_ops_keeping_snapshots(graph: torch.fx.Graph) -> None:
    with _hide_snapshots_of_written_memory(graph):
        remove_noop_ops(graph)


@contextlib.contextmanager
def _hide_snapshots_of_written_memory(graph: torch.fx.Graph) -> Iterator[None]:
    written = {get_node_storage(arg) for node in graph.nodes for arg in _written_args(node)}
    written.discard(None)
    mutated_inputs = {n.args[0] for n in graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)
                      if isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder"}
    returned = {n for out in graph.find_nodes(op="output") for n in out.all_input_nodes}
    written_in_place = set(compat.inplaceable_ops_table()) | set(compat.view_scatter_ops())  # once per graph
    hidden = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in noop_registry:
            continue
        _, src_index = noop_registry[node.target]
        src = compat.noop_source(node, src_index)
        if not isinstance(src, torch.fx.Node):
            continue
        is_view = get_node_storage(node) == get_node_storage(src)
        if is_view and node in returned:
            hidden.append((node, node.target))  # Note [A returned view stays a view]
            node.args, node.target = (node.target, *node.args), _kept_noop
            continue
        if not is_view and _copy_keeps_an_output_apart(node, src):
            hidden.append((node, node.target))  # Note [A copy that keeps an output apart stays]
            node.args, node.target = (node.target, *node.args), _kept_noop
            continue
        if get_node_storage(src) not in written and not _may_become(src, mutated_inputs, written_in_place):
            continue
        if is_view:
            continue  # a view sees later writes in eager too
        hidden.append((node, node.target))
        node.args, node.target = (node.target, *node.args), _kept_noop
    try:
        yield
    finally:
        for node, target in hidden:
            if node.graph is graph:
                node.target, node.args = target, node.args[1:]


def _copy_keeps_an_output_apart(node: torch.fx.Node, src: torch.fx.Node) -> bool:
    """Note [A copy that keeps an output apart stays]
    A no-op copy (`clone`, a same-dtype `_to_copy`) whose value the graph returns, through views or other no-ops
    (`p.detach().clone().reshape(-1)`), is kept when what it copies is, through views and no-ops, a graph input or
    a value returned by another route: removed, the output would be a view of the caller's input or share memory
    with another output, where eager's is new memory (found by the fuzzer's copies). inductor's own test reads the
    storages it computed before removing anything, so a chain of two copies of an input slipped past it."""
    if not reaches_output(node, _passes_memory_on):
        return False
    origin = _origin(src)
    return origin.op == "placeholder" or reaches_output(origin, _passes_memory_on, skip=node)


def _passes_memory_on(node: torch.fx.Node) -> torch.fx.Node | None:
    """The value whose memory `node`'s result may be after no-op removal: a view's base, a no-op's source (a kept
    one only if it is a view), an item of a view's list; else None (new memory)."""
    if node.op != "call_function" or not node.args:
        return None
    target, args = node.target, node.args
    if target is _kept_noop:
        target, args = args[0], args[1:]
        if not _is_view(target):
            return None  # a copy that stays: new memory
    if target is operator.getitem:
        first = args[0]
        return first if isinstance(first, torch.fx.Node) and first.op == "call_function" and _is_view(first.target) \
            else None
    if _is_view(target):
        return args[0] if isinstance(args[0], torch.fx.Node) else None
    if target in noop_registry:
        source = compat.noop_source(node, noop_registry[target][1]) if node.target is not _kept_noop else None
        return source if isinstance(source, torch.fx.Node) else None
    return None


def _is_view(target: Any) -> bool:
    from torch.fx.passes.reinplace import _is_view_op

    return _is_view_op(target)


def _origin(node: torch.fx.Node) -> torch.fx.Node:
    """`node` followed back through views and no-ops to the value that owns its memory."""
    while (source := _passes_memory_on(node)) is not None:
        node = source
    return node


def _may_become(src: torch.fx.Node, mutated_inputs: set[torch.fx.Node], written_in_place: set[Any]) -> bool:
    """Whether reinplacing may put `src` into the memory of an input the graph writes back.

    A new value of a mutated input (an auto_functionalized output for it, a functional op on it that has an
    in-place twin, one reinplacing's table writes in place, or a view scatter) becomes that input once
    reinplaced, and the input's own write-back may overwrite it before a snapshot taken of it is read (fuzzer
    seed 8832: `add_one_(a4); a3.copy_(a4); a4.copy_(a5)` left a3 = a5; `x[0].zero_(); return x.clone()`, a
    select_scatter, which has no in-place twin of its own name, returned x itself, found by a helper).
    """
    from torch.fx.passes.reinplace import _is_view_op, _maybe_get_inplace_op

    auto_functionalized = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)
    seen: set[torch.fx.Node] = set()
    stack = [src]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in mutated_inputs:
            return True
        if node.op != "call_function":
            continue
        target, args = node.target, node.args
        if target is _kept_noop:  # a no-op this walk already kept (a full-size slice_scatter): what it stands for
            target, args = args[0], args[1:]
        if target is operator.getitem and isinstance(args[0], torch.fx.Node):
            stack.append(args[0])
        elif target in auto_functionalized:
            torch.fx.node.map_arg(node.kwargs, stack.append)
        elif (_is_view_op(target) or _maybe_get_inplace_op(target) is not None
              or target in written_in_place) and args and isinstance(args[0], torch.fx.Node):
            stack.append(args[0])
    return False


def _written_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            out += [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, torch.fx.Node)]
    return out
