"""A partial rotary and the cat after it as one graphex_fused::partial_rotary (fused mode).

Note [A partial rotary writes its tail in the same pass] (csrc/fused/rotary.cpp) says what the kernel computes. After
the patterns have fired, GPT-NeoX's `cat([rotate(q[..., :r]), q[..., r:]], -1)` is

    a = slice(x, -1, 0, r)     b = slice(x, -1, r, end)     rot = graphex_fused.rotary(a, cos, sin)
    out = cat([rot, b], -1)

and becomes `out = graphex_fused.partial_rotary(x, cos, sin)` only when every part means exactly that: both slices of
the same x along its last dimension, step 1, the first from 0 to r and the second from r to x's end; the rotary the
halves form (not interleaved) with cos and sin of width r; its result read by the cat alone; all of one float dtype
on the CPU; and the cat's result of x's shape and contiguous (the kernel writes row-major memory, as cat did here).
Anything else (the tail first, a gap, another dimension, an interleaved rotary, a broadcast that grows the rows) keeps
the graph as it was.
"""

from __future__ import annotations

import sys

import torch
import torch.fx

from .checks import FUSED_DTYPES, contiguous_strides, fake_value

aten = torch.ops.aten


def _val(node: object) -> torch.Tensor | None:
    v = fake_value(node)
    return v if isinstance(v, torch.Tensor) else None


def _last_dim_slice(node: object) -> tuple[torch.fx.Node, int, int] | None:
    """(x, start, end) for `slice(x, last dim, start, end)` with step 1 and end clamped to x's width; else None."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.slice.Tensor):
        return None
    x = node.args[0]
    xv = _val(x)
    if xv is None or xv.dim() == 0 or node.kwargs:
        return None
    dim, start, end, step = (list(node.args[1:]) + [0, None, None, 1][len(node.args) - 1:])[:4]
    start = 0 if start is None else start
    if dim not in (-1, xv.dim() - 1) or step != 1 or type(start) is not int or start < 0:
        return None
    width = xv.shape[-1]
    end = width if end is None or end >= sys.maxsize or end > width else end
    if type(end) is not int or end < start:
        return None
    return x, start, end


def _rewrite(cat: torch.fx.Node) -> torch.fx.Node | None:
    """The partial_rotary node that replaces `cat`, inserted before it; None where the cat is not exactly a partial
    rotary (Note above)."""
    if len(cat.args) < 1 or cat.kwargs or not isinstance(cat.args[0], (list, tuple)) or len(cat.args[0]) != 2:
        return None
    rot, tail = cat.args[0]
    out, x_tail = _val(cat), _val(tail)
    if out is None or x_tail is None:
        return None
    dim = cat.args[1] if len(cat.args) > 1 else 0
    if dim not in (-1, out.dim() - 1):
        return None
    if not (isinstance(rot, torch.fx.Node) and rot.op == "call_function"
            and rot.target is torch.ops.graphex_fused.rotary.default and len(rot.users) == 1):
        return None
    interleaved = rot.args[3] if len(rot.args) > 3 else rot.kwargs.get("interleaved", False)
    if interleaved is not False or set(rot.kwargs) - {"interleaved"}:
        return None
    head, cos, sin = rot.args[:3]
    first, second = _last_dim_slice(head), _last_dim_slice(tail)
    if first is None or second is None or first[0] is not second[0]:
        return None
    x, (start0, r), (start1, end1) = first[0], first[1:], second[1:]
    xv, cv, sv, rv = _val(x), _val(cos), _val(sin), _val(rot)
    if xv is None or cv is None or sv is None or rv is None:
        return None
    width = xv.shape[-1]
    if start0 != 0 or start1 != r or end1 != width or r % 2 or r == 0 or r >= width:
        return None
    if not all(type(d) is int for d in xv.shape) or cv.shape[-1] != r or sv.shape[-1] != r:
        return None
    if {xv.dtype, cv.dtype, sv.dtype, rv.dtype, out.dtype} != {xv.dtype} or xv.dtype not in FUSED_DTYPES:
        return None
    if any(t.device.type != "cpu" for t in (xv, cv, sv)):
        return None
    if tuple(rv.shape) != tuple(xv.shape[:-1]) + (r,) or tuple(out.shape) != tuple(xv.shape):
        return None  # cos or sin grew the rows: the kernel takes x's
    if tuple(out.stride()) != contiguous_strides(tuple(out.shape)):
        return None
    graph = cat.graph
    with graph.inserting_before(cat):
        fused = graph.call_function(torch.ops.graphex_fused.partial_rotary.default, (x, cos, sin))
    fused.meta.update(cat.meta)
    return fused


def fuse_partial_rotary(graph: torch.fx.Graph) -> int:
    """Note [A partial rotary writes its tail in the same pass]; returns how many cats were replaced."""
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.cat.default:
            continue
        fused = _rewrite(node)
        if fused is None:
            continue
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        done += 1
    if done:
        graph.eliminate_dead_code()
    return done
