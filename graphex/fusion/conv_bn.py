"""A channels_last 2-d convolution with the inference batch norm and ReLU after it, as one oneDNN call (fused mode,
option conv_batch_norm).

Note [A convolution takes its batch norm and ReLU]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
In a conv net's step each convolution is followed by an inference batch norm and, mostly, a ReLU: after
channels_last_conv (Note [A conv net runs channels_last between its convolutions]) eager's kernels make one pass
over the activation for each (240-300 us of the bench's conv net's 2,800-3,300 us, one thread). The batch norm is
per output channel, so it folds into the convolution's weight and bias:

    bn(conv(x, w) + b) = conv(x, w * scale[o]) + (b * scale + shift)
    scale = bn_weight / sqrt(running_var + eps),  shift = bn_bias - running_mean * scale   (eager's two terms)

and the ReLU is oneDNN's post-op, applied to each output as it is written. So, where the convolution's only reader
is the batch norm, nothing reads the batch norm's saved statistics, and the ReLU (when there is one) is the
result's only reader, the three nodes become

    scale = graphex_fused::batch_norm_scale_shift(...)          (as Note [An inference batch norm is a multiply and
    shift = graphex_fused::batch_norm_scale_shift(...)           an add]: with frozen_parameter, computed once)
    y = mkldnn::_convolution_pointwise(x, w * scale, b * scale + shift, padding, stride, dilation, groups,
                                       "relu" or "none", [], "")

torch's own op, the one inductor calls for the same fusion; its weight is computed on every call (a folded weight
would need its bytes compared every call to stay fresh, Note [Folding frozen parameters]), so a later write to any
of the five tensors is read by the next call. Within the float32 tolerance, not bit for bit: each product is
rounded once with the scale inside instead of outside. Note [A batch norm is folded where its pass costs more than the fold]
The fold reads and writes the weight on every call; eager's batch norm reads and writes the activation, and a ReLU
after it does so once more. So a convolution takes its batch norm only where its weight has at most as many values
as its output (twice as many with a ReLU): the early layers of a conv net, whose activations are large and weights
small. Past that the fold costs more than it saves (measured on the bench's conv net, one thread, the engine's
per-instruction clock: folding every layer took 181 us of folds to save 230 us of batch norms and ReLUs; the last
128-channel layers' folds alone were most of the 181).

Only where it applies exactly as measured: float32 (oneDNN's
reduced-precision paths accumulate differently), a channels_last input (the op's meta function says channels_last
for every input, and that is what the kernel returns for one), a build with oneDNN; anything else keeps eager's
kernels, logged with GRAPHEX_LOG=2.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .batch_norm import _arguments
from .checks import fake_value

aten = torch.ops.aten


def _available() -> bool:
    return bool(torch._C._has_mkldnn) and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _float32_channels(a: Any, channels: int, optional: bool) -> bool:
    if a is None:
        return optional
    v = fake_value(a)
    return isinstance(v, torch.Tensor) and v.dtype == torch.float32 and tuple(v.shape) == (channels,)


def _match(conv: torch.fx.Node) -> tuple[str, torch.fx.Node, torch.fx.Node, str] | str | None:
    """(attr, batch norm, last node replaced, "") for a convolution Note [A convolution takes its batch norm and
    ReLU] applies to; a str saying why not for a convolution followed by a batch norm; None for any other node."""
    if conv.op != "call_function" or conv.target is not aten.convolution.default:
        return None
    bn = _only_user(conv)
    if bn is None or bn.target is not aten._native_batch_norm_legit_no_training.default or bn.args[0] is not conv:
        return None
    if conv.kwargs or len(conv.args) != 9:
        return "the convolution's arguments are not in their positional spelling"
    x, w, b, _stride, _padding, _dilation, transposed, output_padding, _groups = conv.args
    xv, wv, out = fake_value(x), fake_value(w), fake_value(conv)
    if not all(isinstance(v, torch.Tensor) for v in (xv, wv, out)) or xv.dim() != 4 or wv.dim() != 4:
        return "not a 2-d convolution"
    if transposed is not False or any(p != 0 for p in output_padding):
        return "a transposed convolution"
    if xv.dtype != torch.float32 or wv.dtype != torch.float32 or xv.device.type != "cpu":
        return "not float32 on the CPU"
    if not all(type(d) is int for d in (*xv.shape, *wv.shape)):
        return "symbolic sizes"
    if not xv.is_contiguous(memory_format=torch.channels_last) or xv.is_contiguous():
        return "its input is not in channels_last order"
    channels = wv.shape[0]
    if not _float32_channels(b, channels, True):
        return "its bias is not float32 of one value per channel"
    if not all(u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0 for u in bn.users) \
            or len(bn.users) != 1:
        return "the batch norm's saved statistics are read"
    _x, weight, bias, mean, var, _momentum, eps = _arguments(bn)
    if not (_float32_channels(weight, channels, True) and _float32_channels(bias, channels, True)
            and _float32_channels(mean, channels, False) and _float32_channels(var, channels, False)):
        return "the batch norm's parameters are not float32 of one value per channel"
    if type(eps) not in (int, float):
        return "eps is not a number"
    y = next(iter(bn.users))
    relu = _only_user(y)
    has_relu = relu is not None and relu.op == "call_function" and relu.target is aten.relu.default and relu.args[0] is y
    # Note [A batch norm is folded where its pass costs more than the fold]
    if wv.numel() > out.numel() * (2 if has_relu else 1):
        passes = f"{'2 x ' if has_relu else ''}{out.numel()}"
        return (f"its weight ({wv.numel()} values) is larger than what folding saves, the passes over its output "
                f"({passes} values; Note [A batch norm is folded where its pass costs more than the fold])")
    return ("relu", bn, relu, "") if has_relu else ("none", bn, y, "")


def _defined_before(graph: torch.fx.Graph, node: torch.fx.Node, inputs: list[Any]) -> bool:
    order = {n: i for i, n in enumerate(graph.nodes)}
    return all(not isinstance(a, torch.fx.Node) or order[a] < order[node] for a in inputs)


def fold_batch_norms_into_convolutions(graph: torch.fx.Graph, fake_mode: Any) -> int:
    """Note [A convolution takes its batch norm and ReLU]; returns how many convolutions took theirs."""
    from ..base import log

    if fake_mode is None or not _available():
        return 0
    done = 0
    for conv in list(graph.nodes):
        matched = _match(conv)
        if matched is None:
            continue
        if isinstance(matched, str):
            log.detail("convolution %s keeps its batch norm apart: %s", conv.name, matched)
            continue
        attr, bn, last, _ = matched
        x, w, b, stride, padding, dilation, _transposed, _output_padding, groups = conv.args
        _x, weight, bias, mean, var, _momentum, eps = _arguments(bn)
        if not _defined_before(graph, conv, [weight, bias, mean, var]):
            log.detail("convolution %s keeps its batch norm apart: its parameters are computed after it", conv.name)
            continue
        expected = fake_value(last)
        args = (list(padding), list(stride), list(dilation), groups, attr, [], "")
        with fake_mode:
            got = torch.ops.mkldnn._convolution_pointwise.default(fake_value(x), fake_value(w), None, *args)
        if got.shape != expected.shape or got.stride() != expected.stride() or got.dtype != expected.dtype:
            log.detail("convolution %s keeps its batch norm apart: oneDNN's result would be laid out %s, eager's %s",
                       conv.name, tuple(got.stride()), tuple(expected.stride()))
            continue
        with graph.inserting_before(conv), fake_mode:
            def add(target: Any, args: tuple[Any, ...]) -> torch.fx.Node:
                n = graph.call_function(target, args, {})
                n.meta["val"] = target(*[fake_value(a) if isinstance(a, torch.fx.Node) else a for a in args])
                return n

            fold = torch.ops.graphex_fused.conv_batch_norm_fold.default
            new_w = add(fold, (w, b, weight, bias, mean, var, float(eps), 0))
            new_b = add(fold, (w, b, weight, bias, mean, var, float(eps), 1))
            fused = add(torch.ops.mkldnn._convolution_pointwise.default, (x, new_w, new_b, *args))
        fused.meta.update({k: v for k, v in last.meta.items() if k != "val"})
        last.replace_all_uses_with(fused)
        for n in ([last, next(iter(bn.users))] if last is not next(iter(bn.users)) else [last]) + [bn, conv]:
            graph.erase_node(n)
        done += 1
    return done
