"""A gather of constant consecutive positions reads through a slice instead of copying.

Note [A constant index reads through a view]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Falcon splits its fused QKV projection with `qkv[..., [-2], :]` and `qkv[..., [-1], :]` (multi-query attention: one
key and one value head). A Python list index reaches the ATen graph as `aten.index.Tensor` with a constant index
tensor, which copies the rows into new memory: 5-7 us per call on a one-token step, two per layer. When the index is a
constant of consecutive positions `i, i+1, ..., i+k-1` on one dimension, the copy holds exactly the values of
`slice(x, dim, i, i+k)`, so its readers can read through that view instead: every value they read is the same, bit for
bit, and the copy is gone. It runs after reinplacing, so every write the replay makes is an explicit in-place op
(found by a helper: run before, reinplacing turned a functional write of the copy into a write through the view,
and two outputs came back sharing h's storage). A reader must not be able to tell the view from the copy, so the
pass rewrites only when
  * one dimension is indexed (the others None) by an integer constant of the graph (a get_attr, or AOTAutograd's
    `lift_fresh_copy` of one that nothing writes) of one dimension, whose positions are consecutive and in range;
  * the view has the copy's sizes and strides, every one: where the slice's stride differs only on a dimension of
    one element (Falcon's case), `as_strided` gives it the copy's (the same elements), because ops that keep their
    input's layout carry those strides into what they return (found by a helper: `x[:, [1]] * 2` came back with
    other strides than eager's);
  * its data starts where a fresh tensor's would, on a 64-byte boundary of memory the graph itself allocated (a
    kernel may pick another path, and another summation order, for a misaligned pointer); so `x`, followed back
    through every op that may return its input's memory (views, `_unsafe_view`, `unsafe_split`, items of those,
    in-place results), comes from an op that allocates, never from an input or a constant (found by a helper: an
    input reached through `_unsafe_view` and written later), at an offset known when the graph is traced;
  * nothing writes that memory anywhere in the graph (the copy froze the values it read);
  * no value that may share the copy's memory (a view of it, an item of a split of it, an `unsafe_split`) is written,
    returned (the caller would get a view of another tensor where eager gives new memory; found by a helper: a
    split's piece), handed to an op that addresses memory by an explicit storage offset (`as_strided`, `set_`: the
    offset would count from x's storage, not the copy's; found by a helper), or to an op outside ATen and graphex's
    fused kernels (a custom op may read its input's storage offset; found by a helper).
Option index_as_view=True turns it on; it is off by default, because on Falcon's one-token step (the case it was
written for) its gain was within the measuring noise (bench.option_ab: 0.95-1.06x in three paired runs), and a
rewrite of exact mode has to earn its risk.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from .aliasing import allocation, memory_argument, op_name, written_args, written_nodes

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


def _stays_a_private_read(node: torch.fx.Node, written: set[torch.fx.Node]) -> bool:
    """No value that may share `node`'s memory is returned, written or handed to an op that addresses memory by an
    explicit storage offset (Note above)."""
    stack, seen = [node], {node}
    while stack:
        value = stack.pop()
        if value in written:
            return False
        for user in value.users:
            if user.op != "call_function":
                return False  # the output, or something the analysis does not know
            name = op_name(user.target)
            if "as_strided" in name or name.endswith("::set_"):
                return False
            if user.target is not operator.getitem and not (
                    isinstance(user.target, torch._ops.OpOverload) and user.target.namespace in ("aten", "graphex_fused")):
                return False
            shares = memory_argument(user)
            if (shares is True or shares is value) and user not in seen:
                seen.add(user)
                stack.append(user)
    return True


def _fresh_and_aligned(x: torch.fx.Node, xv: torch.Tensor, dim: int, start: int, written: set[torch.fx.Node]) -> bool:
    """The view's data starts on a 64-byte boundary of memory an op of the graph allocated, which nothing writes
    (Note above)."""
    base = allocation(x)
    if base.op != "call_function" or memory_argument(base) is not None or base in written \
            or not isinstance(xv.storage_offset(), int):
        return False
    offset = (xv.storage_offset() + start * xv.stride(dim)) * xv.element_size()
    return offset % 64 == 0


def read_constant_indices_through_views(gm: torch.fx.GraphModule, fake_mode: object) -> int:
    """Note [A constant index reads through a view]; returns how many copies were replaced by views."""
    graph = gm.graph
    written = written_nodes(graph)  # every node whose memory an op of the graph writes, views included
    written |= {allocation(n) for node in graph.nodes for n in written_args(node)}  # through _unsafe_view too
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
        if span is None or not _stays_a_private_read(node, written):
            continue
        start, count = span
        if not _fresh_and_aligned(x, xv, dim, start, written):
            continue
        with fake_mode:
            view_val = aten.slice.Tensor(xv, dim, start, start + count)
        if tuple(view_val.shape) != tuple(out.shape) or view_val.dtype != out.dtype or any(
                size > 1 and a != b for size, a, b in zip(out.shape, out.stride(), view_val.stride())):
            continue  # the slice walks memory in another order than the copy
        with graph.inserting_before(node):
            view = graph.call_function(aten.slice.Tensor, (x, dim, start, start + count))
            view.meta["val"] = view_val
            if tuple(view_val.stride()) != tuple(out.stride()):  # only on dimensions of one element: the copy's
                with fake_mode:
                    view_val = aten.as_strided.default(view_val, list(out.shape), list(out.stride()))
                view = graph.call_function(aten.as_strided.default, (view, list(out.shape), list(out.stride())))
                view.meta["val"] = view_val
        view.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        node.replace_all_uses_with(view)
        graph.erase_node(node)
        done += 1
    if done:
        graph.eliminate_dead_code()
        gm.recompile()
    return done
