"""Max pooling without indices (fused mode): graphex_fused::max_pool2d for eager's max_pool2d_with_indices.

Note [Max pooling without its indices]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
nn.MaxPool2d in inference reaches the ATen graph as max_pool2d_with_indices, whose second output (an
int64 index per value) nothing reads; eager's kernel computes and stores it all the same, one element at
a time (a small ResNet's stem pool: a fifth of its step). When nothing reads the indices and the input is
a contiguous float32, bfloat16 or float16 tensor of static shape on the CPU, the node becomes
graphex_fused::max_pool2d, which picks the same element of each window as eager (Note [Max pooling picks
eager's element], csrc/fused/max_pool.cpp): bit for bit eager's values. Other layouts (channels_last),
dtypes and a read of the indices keep eager's kernel.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .checks import FUSED_DTYPES as _FLOATS, contiguous_strides

aten = torch.ops.aten


def _arguments(node: torch.fx.Node) -> list[Any] | None:
    """kernel, stride, padding, dilation, ceil_mode as the node passes them, schema defaults filled in."""
    schema = node.target._schema
    values = list(node.args[1:]) + [None] * (len(schema.arguments) - len(node.args))
    out = []
    for arg, value in zip(schema.arguments[1:], values):
        if arg.name in node.kwargs:
            value = node.kwargs[arg.name]
        elif value is None:
            value = arg.default_value
        out.append(value)
    kernel, stride, padding, dilation, ceil_mode = out
    as_list = (lambda v: [v] if isinstance(v, int) else list(v))
    lists = [as_list(kernel), as_list(stride), as_list(padding), as_list(dilation)]
    if not all(all(type(i) is int for i in v) for v in lists) or type(ceil_mode) is not bool:
        return None
    return [*lists, ceil_mode]


def replace_max_pool(graph: torch.fx.Graph) -> int:
    """Note [Max pooling without its indices]; returns how many nodes were replaced."""
    from ..base import log

    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.max_pool2d_with_indices.default:
            continue
        if not all(u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0 for u in node.users):
            log.detail("max pooling %s keeps eager's kernel: its indices are read", node.name)
            continue
        x = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(x, torch.Tensor) or x.dtype not in _FLOATS or x.device.type != "cpu" or \
                x.dim() not in (3, 4) or not all(type(d) is int for d in x.shape) or not x.is_contiguous():
            log.detail("max pooling %s keeps eager's kernel: its input is not a contiguous float32, bfloat16 or "
                       "float16 CPU tensor of static shape (channels_last inputs keep it too)", node.name)
            continue
        out = next(iter(node.users)).meta.get("val") if node.users else None
        if not isinstance(out, torch.Tensor) or tuple(out.stride()) != contiguous_strides(tuple(out.shape)):
            # the kernel writes row-major memory; eager's result of a channels_last input with one channel (which is
            # also contiguous) is channels_last, its size-1 dimension strided otherwise (found by a helper)
            log.detail("max pooling %s keeps eager's kernel: eager's result is not row-major", node.name)
            continue
        args = _arguments(node)
        if args is None:
            log.detail("max pooling %s keeps eager's kernel: its window arguments are not plain ints", node.name)
            continue
        for user in list(node.users):
            with graph.inserting_before(user):
                pooled = graph.call_function(torch.ops.graphex_fused.max_pool2d.default, (node.args[0], *args))
            pooled.meta["val"] = user.meta.get("val")
            user.replace_all_uses_with(pooled)
            graph.erase_node(user)
        graph.erase_node(node)
        done += 1
    return done
