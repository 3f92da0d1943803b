"""One spelling of each argument the built-in patterns read (dims, _to_copy's keywords), before matching.

Note [Arguments are matched in one spelling]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
torch's matcher compares a pattern's constant arguments literally, so `k.transpose(-1, -2)` (an ATen
`transpose.int(k, -1, -2)`) does not match a pattern traced from `k.transpose(2, 3)`, and
`softmax(s, dim=3)` does not match `softmax(s, -1)`, though each pair means the same on a 4-d tensor.
Before matching, fused mode rewrites these arguments to the spelling the built-in patterns are
written in:
- `transpose.int(x, a, b)`: the two dims non-negative, the smaller first (transpose is symmetric);
- `_softmax(x, dim, half_to_float)`, `_log_softmax(...)`, `_safe_softmax(x, dim)`: the dim negative (`-1` for the last);
- `_to_copy(x, dtype=..., layout=torch.strided, device=<x's device>)` (what `softmax(s, dtype=...)`
  writes): the layout and device keywords dropped where they are x's own, as `x.to(dtype)` writes it;
- `split.Tensor(x, size, dim)` (what `chunk` and `split(int)` write): the dim negative, as `chunk(2, dim=-1)` traces
  (a dim left out, as a 1-d x's `chunk(2, 0)` traces, is 0, written negative too);
  `split_with_sizes(x, [s, s, ...], dim)` whose sizes are equal and fill the dim (`split([I, I])`) becomes
  `split.Tensor(x, s, dim)`, which returns the same views;
- `slice.Tensor(x, dim, start, end[, 1])` (what `x[..., a:b]`, `narrow` and `tensor_split` write): the dim
  non-negative and a start or end counted from the end made non-negative, as `x[..., a:b]` traces; an end at or
  past the dim's size written `sys.maxsize` (as `x[..., a:]` traces), a step of 1 left out, a start of None 0;
- `cat(tensors, dim)`: the dim negative, as `cat(..., dim=-1)` traces (a dim left out is 0).
After the patterns have run once, a view written twice (`torch.cat((-x.chunk(2, -1)[1], x.chunk(2, -1)[0]), -1)`:
two `split.Tensor` of x, each with one `getitem`) is made one node and the patterns run again, as they are traced from
`x1, x2 = x.chunk(2, -1)` (found by a helper: such a rotary ran as an element-wise chain; merge_repeated_views, called
by run_fusion). Only `split.Tensor`, `slice.Tensor` and their `getitem`s, in the spelling above, are merged, where both
are the same call on the same node, by the CSE pass's own rules (no in-place op between them, nothing that shares an
output's memory: two returned views are two tensors). Not before the first round: a merged view read elsewhere too (the
slice `x[..., :h]` of a rotary, taken again for another use) would stop a match that its own copy allowed. Common
subexpressions in general are merged later (cse.py), for the same reason.
The rewrite keeps each op and what it computes; where no pattern fires the graph runs exact as
before (the same kernels on the same arguments). The patterns in patterns.py and attention_patterns.py are written in this
spelling (Note [Attention forms are generated from one table]).
"""

from __future__ import annotations

import operator
import sys
from typing import Any

import torch

aten = torch.ops.aten


def _rank(node: torch.fx.Node) -> int | None:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else None


def _dim(d: Any, rank: int) -> int | None:
    return d % rank if isinstance(d, int) and rank > 0 and -rank <= d < rank else None


def normalize_arguments(graph: torch.fx.Graph) -> int:
    """Rewrite the dim arguments of Note [Arguments are matched in one spelling]; returns how many changed."""
    changed = 0
    for node in graph.nodes:
        if node.op == "call_function" and node.target is aten.cat.default and len(node.args) in (1, 2) \
                and not node.kwargs:
            changed += _cat(node)
        if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        rank = _rank(node.args[0])
        if rank is None:
            continue
        if node.target is aten.transpose.int and len(node.args) == 3 and not node.kwargs:
            a, b = _dim(node.args[1], rank), _dim(node.args[2], rank)
            if a is not None and b is not None and (min(a, b), max(a, b)) != tuple(node.args[1:]):
                node.args = (node.args[0], min(a, b), max(a, b))
                changed += 1
        elif node.target is aten._to_copy.default and ("layout" in node.kwargs or "device" in node.kwargs):
            x = node.args[0].meta.get("val")
            kwargs = dict(node.kwargs)
            if kwargs.get("layout", x.layout) == x.layout == torch.strided:
                kwargs.pop("layout", None)
            if "device" in kwargs and kwargs["device"] == x.device:
                kwargs.pop("device")
            if kwargs != node.kwargs:
                node.kwargs = kwargs
                changed += 1
        elif (node.target in (aten._softmax.default, aten._log_softmax.default) and len(node.args) == 3
              or node.target is aten._safe_softmax.default and len(node.args) >= 2):
            d = _dim(node.args[1], rank)
            if d is not None and d - rank != node.args[1]:
                node.args = (node.args[0], d - rank, *node.args[2:])
                changed += 1
        elif node.target is aten.split.Tensor and len(node.args) in (2, 3) and not node.kwargs:
            d = _dim(node.args[2] if len(node.args) == 3 else 0, rank)  # a left-out dim is 0 (a 1-d x's chunk)
            if d is not None and (node.args[0], node.args[1], d - rank) != tuple(node.args):
                node.args = (node.args[0], node.args[1], d - rank)
                changed += 1
        elif node.target is aten.split_with_sizes.default and len(node.args) in (2, 3) and not node.kwargs:
            changed += _equal_split(node, rank)
        elif node.target is aten.slice.Tensor and not node.kwargs:
            changed += _slice(node, rank)
    return changed


def _is_cut(node: torch.fx.Node) -> bool:
    """A split or slice in the spelling above, or a part of a split."""
    if node.target is operator.getitem:
        return isinstance(node.args[0], torch.fx.Node) and node.args[0].target is aten.split.Tensor
    return node.target in (aten.split.Tensor, aten.slice.Tensor)


def merge_repeated_views(graph: torch.fx.Graph) -> int:
    """Note [Arguments are matched in one spelling]: a split or slice written twice, and its getitems, as one node, by
    the CSE pass's own rules restricted to them (Note [CSE keeps eager's values]); returns how many nodes were merged
    away."""
    from ..passes.cse import eliminate_common_subexpressions

    return eliminate_common_subexpressions(graph, only=_is_cut)


def _equal_split(node: torch.fx.Node, rank: int) -> int:
    """split_with_sizes(x, [s, ..., s], dim) with the sizes filling the dim -> split.Tensor(x, s, negative dim)."""
    x, sizes, d = node.args[0].meta["val"], node.args[1], _dim(node.args[2] if len(node.args) == 3 else 0, rank)
    if d is None or not isinstance(sizes, (list, tuple)) or not sizes or any(type(s) is not int for s in sizes):
        return 0
    if len(set(sizes)) != 1 or sizes[0] < 1 or sizes[0] * len(sizes) != x.shape[d]:
        return 0
    node.target = aten.split.Tensor
    node.args = (node.args[0], sizes[0], d - rank)
    return 1


def _slice(node: torch.fx.Node, rank: int) -> int:
    """slice.Tensor's arguments in the spelling `x[..., a:b]` traces to (the Note)."""
    args = list(node.args) + [0, None, sys.maxsize, 1][len(node.args) - 1:]
    x, d, start, end, step = args[:5]
    d = _dim(d, rank)
    size = node.args[0].meta["val"].shape[d] if d is not None else None
    if d is None or step != 1 or type(size) is not int:
        return 0
    start = 0 if start is None else start
    end = sys.maxsize if end is None else end
    if type(start) is not int or type(end) is not int:
        return 0
    start = max(start + size, 0) if start < 0 else start
    end = max(end + size, 0) if end < 0 else end
    spelled = (x, d, start, sys.maxsize if end >= size else end)
    if spelled == tuple(node.args):
        return 0
    node.args = spelled
    return 1


def _cat(node: torch.fx.Node) -> int:
    """cat(tensors, dim) -> the dim negative, where the tensors' rank is known and one."""
    tensors, d = node.args[0], node.args[1] if len(node.args) == 2 else 0  # a left-out dim is 0
    if not isinstance(tensors, (list, tuple)):
        return 0
    vals = [t.meta.get("val") for t in tensors if isinstance(t, torch.fx.Node)]
    # one rank for all: cat skips a legacy empty 1-d tensor among tensors of another rank, whose rank is not the dim's
    if not vals or not all(isinstance(v, torch.Tensor) for v in vals) or len({v.dim() for v in vals}) != 1:
        return 0
    rank = vals[0].dim()
    n = _dim(d, rank)
    if n is None or (tensors, n - rank) == tuple(node.args):
        return 0
    node.args = (tensors, n - rank)
    return 1
