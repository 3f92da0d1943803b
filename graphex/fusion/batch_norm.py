"""Inference batch norm as a multiply and an add, for the element-wise chains (fused mode, option pointwise_fusion).

Note [An inference batch norm is a multiply and an add]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
nn.BatchNorm in eval mode reaches the ATen graph as _native_batch_norm_legit_no_training, one pass over
its input that eager's kernel makes as x * scale[c] + shift[c], with scale = weight / sqrt(var + eps) and
shift = bias - mean * scale per channel. A conv net's step follows it with a ReLU, and in a residual
block with an add and a ReLU: three passes over memory where one would do. So, where nothing reads the
op's other two results and its input is a contiguous float32, bfloat16 or float16 tensor of static shape
on the CPU whose result eager makes contiguous, the node becomes

    scale = graphex_fused::batch_norm_scale_shift(weight, bias, mean, var, eps, x.dim(), 0)   # [C, 1, ...]
    shift = graphex_fused::batch_norm_scale_shift(weight, bias, mean, var, eps, x.dim(), 1)
    y = x * scale + shift            (in float32: a bfloat16/float16 x is cast up first and the sum cast
                                      back, one rounding as eager's kernel makes)

and the chain pass (chains.py) runs the multiply and the add with whatever element-wise ops surround
them, in one kernel. The two per-channel ops read only parameters and buffers, so with frozen_parameter
they are computed once (Note [Folding frozen parameters]). Eager contracts x * scale + shift into an FMA
where its build does (AVX2) and the chain rounds the product first, so the result is within fused mode's
tolerance, not bit for bit (csrc/fused/batch_norm.cpp). Training mode (a different op), a read of the
saved statistics, other layouts (channels_last) and float64 keep eager's kernel.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import torch
import torch.fx
from torch._guards import detect_fake_mode

from .checks import FUSED_DTYPES as _FLOATS
from .checks import fake_value
from .checks import contiguous_strides

aten = torch.ops.aten



def _arguments(node: torch.fx.Node) -> list[Any]:
    """input, weight, bias, running_mean, running_var, momentum, eps as the node passes them."""
    names = [a.name for a in node.target._schema.arguments]
    values = list(node.args) + [None] * (len(names) - len(node.args))
    return [node.kwargs.get(name, value) for name, value in zip(names, values)]


def _channel_param(a: Any, channels: int, optional: bool) -> bool:
    if a is None:
        return optional
    v = fake_value(a)
    return (isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dtype in _FLOATS
            and tuple(v.shape) == (channels,))


def _declines(node: torch.fx.Node) -> str:
    """'' when Note [An inference batch norm is a multiply and an add] applies to `node`, else why not."""
    if not all(u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0 for u in node.users):
        return "its saved statistics are read"
    x, weight, bias, mean, var, _momentum, eps = _arguments(node)
    xv = fake_value(x)
    if not isinstance(xv, torch.Tensor) or xv.dtype not in _FLOATS or xv.device.type != "cpu" or xv.dim() < 2 \
            or not all(type(d) is int for d in xv.shape) or not xv.is_contiguous():
        return "its input is not a contiguous float tensor of static shape on the CPU"
    out = fake_value(next(iter(node.users))) if node.users else None
    if not isinstance(out, torch.Tensor) or tuple(out.stride()) != contiguous_strides(tuple(out.shape)):
        return "eager's result is not row-major"  # the chain writes row-major memory
    channels = xv.shape[1]
    if not (_channel_param(weight, channels, True) and _channel_param(bias, channels, True)
            and _channel_param(mean, channels, False) and _channel_param(var, channels, False)):
        return "its parameters are not float tensors of one value per channel"
    # ATen's CPU kernel takes parameters of the input's dtype, or float32 ones for a bfloat16/float16 input (its
    # "mixed dtype"), all of one dtype; any other mix raises there, so it is left to raise as eager's does
    param_dtypes = {fake_value(p).dtype for p in (weight, bias, mean, var) if p is not None}
    if not (param_dtypes == {xv.dtype} or param_dtypes == {torch.float32} and xv.dtype in (torch.bfloat16,
                                                                                               torch.float16)):
        return "its parameters' dtypes are neither the input's nor float32 for a bfloat16/float16 input"
    if type(eps) not in (int, float):
        return "eps is not a number"
    return ""


def split_batch_norm(graph: torch.fx.Graph) -> int:
    """Note [An inference batch norm is a multiply and an add]; returns how many nodes were rewritten."""
    from ..base import log

    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten._native_batch_norm_legit_no_training.default:
            continue
        why = _declines(node)
        if why:
            log.detail("batch norm %s stays eager's: %s", node.name, why)
            continue
        x, weight, bias, mean, var, _momentum, eps = _arguments(node)
        xv = fake_value(x)
        fake_mode = detect_fake_mode([xv])
        with graph.inserting_before(node), (fake_mode if fake_mode is not None else contextlib.nullcontext()):
            def add(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> torch.fx.Node:
                n = graph.call_function(target, args, kwargs or {})
                n.meta["val"] = target(*[fake_value(a) if isinstance(a, torch.fx.Node) else a for a in args],
                                       **(kwargs or {}))
                return n

            scale = add(torch.ops.graphex_fused.batch_norm_scale_shift.default,
                        (weight, bias, mean, var, float(eps), xv.dim(), 0))
            shift = add(torch.ops.graphex_fused.batch_norm_scale_shift.default,
                        (weight, bias, mean, var, float(eps), xv.dim(), 1))
            y = x if xv.dtype == torch.float32 else add(aten._to_copy.default, (x,), {"dtype": torch.float32})
            y = add(aten.add.Tensor, (add(aten.mul.Tensor, (y, scale)), shift))
            if xv.dtype != torch.float32:
                y = add(aten._to_copy.default, (y,), {"dtype": xv.dtype})
        for user in list(node.users):
            user.replace_all_uses_with(y)
            graph.erase_node(user)
        graph.erase_node(node)
        done += 1
    return done

