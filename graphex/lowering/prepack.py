"""Fused mode with frozen_parameter: a 2-d convolution reads its weight in oneDNN's own layout, reordered once.

Note [A frozen convolution weight is prepacked once]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
ATen's CPU convolution (oneDNN) reorders its weight from PyTorch's [O, I, kH, kW] into oneDNN's blocked layout on
every call. On the bench's conv net that reorder is up to half of a 3x3 convolution's time: one thread, channels_last
input, each layer alone, 128 -> 128 channels on 8x8 took 300 us through `aten.convolution` and 169 us on a weight
reordered beforehand, the 3 -> 32 stem on 64x64 239 against 97 us, 32 -> 32 on 32x32 about even (211 against 225;
2026-12-07, `python -m bench.convnet --layers`). So when the program is
lowered with frozen parameters (the first call), a convolution whose weight is a frozen parameter runs as
`mkldnn::_convolution_pointwise` (the op inductor's freezing runs) on the weight reordered once, here, by
`mkldnn::_reorder_convolution_weight` (with the input's size, as inductor's freezing calls it). The reordered
weight is a constant of the program.

It stays exact to the weight: the engine watches the weight by contents (WATCH_CONTENTS, Note [A frozen parameter
is checked by identity]): any write into its bytes, however made (through the parameter, `.data`, a view,
`load_state_dict`), is seen on the next call and the program is re-lowered, which reorders again. That check is a
memcmp of the weight per call, well under the reorder it replaces; it also keeps a copy of each such weight's bytes
(the reordered weight is a third). So FOLD_CONTENTS_LIMIT, which bounds what other computed folds may cost to
check, does not apply here.

Within fused mode's tolerance, not bit for bit: oneDNN may pick another kernel for a blocked weight, which sums in
another order (in fused mode the convolutions already run in channels_last order, Note [A conv net runs
channels_last between its convolutions]). There is no post-op: NaN, inf and the ReLU after it stay eager's.

The packed call reads its bias as dense floats, whatever its strides: a bias whose traced value is not contiguous
keeps ATen's convolution (a strided slice `b[::2]` or an `expand` was misread, past its storage for the expand:
found by a helper on 2026-12-07), and a bias that is a frozen parameter is watched by data pointer, shape and
strides (WATCH_DATA), so `bias.data = <another layout>` re-lowers, which checks it again.

Only where measured to pay and where nothing else could see the difference: a float32 CPU convolution, not
transposed, of a channels_last input of static shape (what fused mode's channels_last rule gives), with a frozen,
dense, contiguous weight no op of the graph writes and a kernel larger than 1x1 (a 1x1 weight is small, and on
64 -> 128 channels with stride 2 oneDNN took 34 us on the reordered weight against ATen's 20 us).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx

aten = torch.ops.aten
CONVOLUTION_ON_PACKED = torch.ops.mkldnn._convolution_pointwise.default


@dataclasses.dataclass(frozen=True)
class Prepacked:
    weight: int  # the frozen input the weight is; watched by contents
    reordered: torch.Tensor  # the weight in oneDNN's layout for this convolution
    bias: int | None  # the frozen input the bias is, if it is one; watched by data pointer, shape and strides


def prepack_convolution_weights(gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor],
                                written: set[torch.fx.Node]) -> dict[torch.fx.Node, Prepacked]:
    """Note [A frozen convolution weight is prepacked once]: convolution node -> its weight reordered, and what the
    engine must watch. `written`: the values an op of the graph may write."""
    if not frozen or not torch.backends.mkldnn.is_available():
        return {}
    index_of = {node: i for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))}
    packed: dict[torch.fx.Node, Prepacked] = {}
    for node in gm.graph.find_nodes(op="call_function", target=aten.convolution.default):
        weight_node, bias_node = node.args[1], node.args[2]
        index = index_of.get(weight_node)  # type: ignore[arg-type]
        if index is None or index not in frozen or weight_node in written or not _prepackable(node, frozen[index]):
            continue
        bias_index = index_of.get(bias_node) if isinstance(bias_node, torch.fx.Node) else None  # type: ignore[arg-type]
        bias = frozen.get(bias_index) if bias_index is not None else None
        if bias_index is not None and bias_index not in frozen:
            bias_index = None  # a graph input: the engine's signature checks its strides on every call
        if bias is not None and not _dense_bias(bias, frozen[index].shape[0]):
            continue
        x = node.args[0].meta["val"]  # type: ignore[union-attr]
        _, _, stride, padding, dilation, _, _, groups = node.args[1:9]
        with torch.no_grad():
            reordered = torch.ops.mkldnn._reorder_convolution_weight(
                frozen[index], list(padding), list(stride), list(dilation), groups, list(x.shape))
        packed[node] = Prepacked(index, reordered, bias_index)
    return packed


def packed_call(node: torch.fx.Node, reordered: torch.Tensor) -> tuple[Any, ...]:
    """The arguments of CONVOLUTION_ON_PACKED for convolution `node` on its reordered weight: no post-op."""
    x, _, bias, stride, padding, dilation, _, _, groups = node.args[:9]
    return (x, reordered, bias, list(padding), list(stride), list(dilation), groups, "none", [], None)


def _prepackable(node: torch.fx.Node, weight: Any) -> bool:
    if node.kwargs or len(node.args) < 9:
        return False
    x, w, bias = node.args[0], node.args[1], node.args[2]
    transposed, output_padding = node.args[6], node.args[7]
    xv, wv = _val(x), _val(w)
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or transposed is not False:
        return False
    if any(output_padding) or xv.dim() != 4 or xv.dtype != torch.float32 or xv.device.type != "cpu":
        return False
    if not all(isinstance(s, int) for s in xv.shape) or xv.numel() == 0:
        return False
    if not xv.is_contiguous(memory_format=torch.channels_last) or xv.is_contiguous():
        return False  # channels_last only (a 1x1 image is both: its layout says nothing)
    out = _val(node)
    if not isinstance(out, torch.Tensor) or out.is_contiguous() or not out.is_contiguous(
            memory_format=torch.channels_last):
        return False  # the result's strides, which the ops after it were traced with, are the packed call's
    if bias is not None and not _dense_bias(_val(bias), wv.shape[0]):
        return False  # the packed call reads its bias as dense (a helper found `b[::2]` and `b.expand(C)` misread)
    return (type(weight) in (torch.Tensor, torch.nn.Parameter) and weight.dtype == torch.float32
            and weight.device.type == "cpu" and weight.layout == torch.strided and not weight.is_quantized
            and weight.dim() == 4 and weight.is_contiguous() and weight.numel() > 0
            and tuple(weight.shape) == tuple(wv.shape) and tuple(weight.shape[2:]) != (1, 1))


def _dense_bias(bias: Any, channels: int) -> bool:
    """`mkldnn::_convolution_pointwise` reads its bias as `channels` contiguous floats, whatever its strides."""
    return (isinstance(bias, torch.Tensor) and bias.dtype == torch.float32 and bias.device.type == "cpu"
            and bias.layout == torch.strided and bias.dim() == 1 and bias.shape[0] == channels
            and bias.is_contiguous())


def _val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None
