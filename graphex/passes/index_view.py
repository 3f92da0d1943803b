"""A gather of constant consecutive positions reads through a slice instead of copying.

Note [A constant index reads through a view]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Falcon splits its fused QKV projection with `qkv[..., [-2], :]` and `qkv[..., [-1], :]` (multi-query attention: one
key and one value head). A Python list index reaches the ATen graph as `aten.index.Tensor` with a constant index
tensor, which copies the rows into new memory: 5-7 us per call on a one-token step, two per layer. When the index is a
constant of consecutive positions `i, i+1, ..., i+k-1` on one dimension, the copy holds exactly the values of
`slice(x, dim, i, i+k)`, so its readers can read through that view instead: every value they read is the same, bit for
bit, and the copy is gone. The pass rewrites only when
  * one dimension is indexed (the others None) by an integer constant of the graph (a get_attr, or AOTAutograd's
    `lift_fresh_copy` of one that nothing writes) of one dimension, whose positions are consecutive and in range;
  * the view walks memory in the copy's order: every dimension of more than one element has the copy's stride, so a
    kernel reading the view sees the layout it saw when the graph was traced;
  * nothing may write `x`'s memory in the graph (an input an in-place op updates later would change under the view,
    where the copy kept the old values), and nothing writes the copy or a view of it;
  * neither the copy nor a view of it is an output of the graph (the caller would get a view of another tensor where
    eager gives new memory).
Option index_as_view=False keeps the copies.
"""

from __future__ import annotations

import torch
import torch.fx

from .aliasing import is_view_op, root, written_nodes

aten = torch.ops.aten


def _constant(graph_module: torch.nn.Module, node: object, written: set[torch.fx.Node]) -> torch.Tensor | None:
    """The value of a get_attr tensor constant, or of the fresh copy AOTAutograd makes of one
    (`lift_fresh_copy`) that nothing writes; else None."""
    if isinstance(node, torch.fx.Node) and node.op == "call_function" and node in written:
        return None
    if isinstance(node, torch.fx.Node) and node.target is aten.lift_fresh_copy.default and len(node.args) == 1:
        node = node.args[0]
    if not (isinstance(node, torch.fx.Node) and node.op == "get_attr"):
        return None
    value = graph_module
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def _positions(index: torch.Tensor, size: int) -> tuple[int, int] | None:
    """(start, count) when `index` is a one-dimensional integer tensor of consecutive positions into `size`."""
    if index.dim() != 1 or index.numel() == 0 or index.dtype not in (torch.int64, torch.int32) or index.is_meta:
        return None
    values = [int(v) for v in index.tolist()]
    if any(v < -size or v >= size for v in values):
        return None
    values = [v + size if v < 0 else v for v in values]
    start = values[0]
    if values != list(range(start, start + len(values))):
        return None
    return start, len(values)


def _not_returned(node: torch.fx.Node) -> bool:
    """Neither `node` nor a view of it is an output of the graph (Note above)."""
    for user in node.users:
        if user.op == "output":
            return False
        if user.op != "call_function":
            return False
        if is_view_op(user.target) and not _not_returned(user):
            return False
    return True


def _same_order(copy: torch.Tensor, view: torch.Tensor) -> bool:
    return tuple(copy.shape) == tuple(view.shape) and all(
        size <= 1 or a == b for size, a, b in zip(copy.shape, copy.stride(), view.stride()))


def read_constant_indices_through_views(gm: torch.fx.GraphModule, fake_mode: object) -> int:
    """Note [A constant index reads through a view]; returns how many copies were replaced by views."""
    graph = gm.graph
    written = written_nodes(graph)  # every node whose memory an op of the graph writes, views included
    done = 0
    for node in list(graph.find_nodes(op="call_function", target=aten.index.Tensor)):
        x, indices = node.args[0], node.args[1] if len(node.args) > 1 else None
        xv, out = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None), node.meta.get("val")
        if node.kwargs or not isinstance(indices, (list, tuple)) or not isinstance(xv, torch.Tensor) \
                or not isinstance(out, torch.Tensor):
            continue
        given = [(d, i) for d, i in enumerate(indices) if i is not None]
        if len(given) != 1 or len(indices) > xv.dim():
            continue
        dim, index_node = given[0]
        index = _constant(gm, index_node, written)
        if index is None or not all(type(s) is int for s in xv.shape):
            continue
        span = _positions(index, xv.shape[dim])
        if span is None or root(x) in written or node in written or not _not_returned(node):
            continue
        start, count = span
        with fake_mode:
            view_val = aten.slice.Tensor(xv, dim, start, start + count)
        if not _same_order(out, view_val) or view_val.dtype != out.dtype:
            continue
        with graph.inserting_before(node):
            view = graph.call_function(aten.slice.Tensor, (x, dim, start, start + count))
        view.meta.update(node.meta)
        view.meta["val"] = view_val
        node.replace_all_uses_with(view)
        graph.erase_node(node)
        done += 1
    if done:
        graph.eliminate_dead_code()
        gm.recompile()
    return done
