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
  writes): the layout and device keywords dropped where they are x's own, as `x.to(dtype)` writes it.
The rewrite keeps each op and what it computes; where no pattern fires the graph runs exact as
before (the same kernels on the same arguments). The patterns in patterns.py and attention_patterns.py are written in this
spelling (Note [Attention forms are generated from one table]).
"""

from __future__ import annotations

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
    return changed
