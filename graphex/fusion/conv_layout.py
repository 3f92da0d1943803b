"""2-d convolutions and the ops between them in channels_last order (fused mode, option channels_last_conv).

Note [A conv net runs channels_last between its convolutions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
ATen's CPU convolution (oneDNN) computes in channels_last (NHWC) order: handed a contiguous NCHW input, it
reorders the input and its own output on every call. On the bench's conv net (one thread, [1, 3, 64, 64]) eager
took 0.84x its time with only the input made channels_last (the convolutions then stay in that order, and so do the
batch norms, ReLUs, residual adds and pooling after them), and inductor reorders the same way (its
layout_optimization). So in fused mode:
- an activation entering a 2-d convolution is copied into channels_last order once, unless it is already there;
- the ops after it keep that order while they are ops whose values do not depend on it (_KEEPS_ORDER: the
  convolution's input, inference batch norm, element-wise activations and arithmetic, pooling; the fake tensors
  say which order each result then has);
- every other reader (a view, a graph output, an op not in the list) gets the value back in its original,
  contiguous order: one copy where the region ends.
The weights keep their layout: oneDNN reorders them per call either way, a per-call copy into channels_last cost
518 us on that net (more than it saves), and a copy kept across calls could go stale when a weight is written.
What it costs in exactness: oneDNN's channels_last kernels add in another order, so a convolution's result is
within the float32 tolerance of eager's, not bit for bit (fused mode's promise: Note [Fused kernels are close, not
bitwise]). Declined, as a whole graph: a convolution whose input is not contiguous NCHW (a model already in
channels_last), a graph whose outputs would need more than one copy back (a training graph saves its activations
as outputs), and anything the fake tensors cannot run in the new order.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_arg

from .checks import FUSED_DTYPES, fake_value

aten = torch.ops.aten

# The ops whose values do not depend on their inputs' memory order (with the same values in, the same values out,
# up to the order of a sum), and which return their result in the order of their input: a region in channels_last
# order grows through them.
_KEEPS_ORDER = {
    aten.convolution.default,
    aten._native_batch_norm_legit_no_training.default,
    aten.relu.default, aten.hardtanh.default, aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default,
    aten.silu.default, aten.sigmoid.default, aten.gelu.default, aten.leaky_relu.default, aten.hardswish.default,
    aten.elu.default, aten.mish.default, aten.neg.default,
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
    aten.max_pool2d_with_indices.default, aten.avg_pool2d.default, aten._adaptive_avg_pool2d.default, aten.mean.dim,
    operator.getitem,
}



def _converts(node: torch.fx.Node) -> bool:
    """A 2-d convolution (not transposed) of a contiguous float CPU input of static shape, as fused mode runs them."""
    if node.op != "call_function" or node.target is not aten.convolution.default or node.kwargs or len(node.args) < 9:
        return False
    x, w, transposed = fake_value(node.args[0]), fake_value(node.args[1]), node.args[6]
    return (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == 4 and w.dim() == 4
            and transposed is False and x.device.type == "cpu" and x.dtype in FUSED_DTYPES and w.dtype == x.dtype
            and all(isinstance(s, int) for s in x.shape) and x.is_contiguous() and x.numel() > 0)


def _same_structure(new: Any, old: Any) -> bool:
    if isinstance(old, torch.Tensor):
        return isinstance(new, torch.Tensor) and new.shape == old.shape and new.dtype == old.dtype
    if isinstance(old, (tuple, list)):
        return isinstance(new, (tuple, list)) and len(new) == len(old) and all(map(_same_structure, new, old))
    return type(new) is type(old)


def _reordered(new: Any, old: Any) -> bool:
    return isinstance(old, torch.Tensor) and new.stride() != old.stride()


def run_convolutions_channels_last(graph: torch.fx.Graph, fake_mode: Any) -> int:
    """Note [A conv net runs channels_last between its convolutions]; returns how many convolutions now run in
    channels_last order (0: the graph is unchanged)."""
    convs = {n: None for n in graph.nodes if _converts(n)}  # in graph order, and a set
    if not convs or fake_mode is None:
        return 0
    entries: dict[torch.fx.Node, torch.Tensor] = {}  # a convolution's input -> its channels_last copy (fake)
    first_reader: dict[torch.fx.Node, torch.fx.Node] = {}  # ... and the first convolution that reads it
    region: dict[torch.fx.Node, Any] = {}            # a node in the region -> its new fake value
    with fake_mode:
        for node in graph.nodes:
            if node.op != "call_function" or node.target not in _KEEPS_ORDER:
                continue
            if node in convs and node.args[0] not in region:
                x = node.args[0]
                if x not in entries:
                    entries[x] = fake_value(x).clone(memory_format=torch.channels_last)
                    first_reader[x] = node
            elif not any(a in region for a in node.all_input_nodes):
                continue
            if node.target is aten.convolution.default and any(a in region for a in node.args[1:]):
                return 0  # a weight or bias computed in the region: not this pass's case

            def value(a: torch.fx.Node, node: torch.fx.Node = node) -> Any:
                if a in region:
                    return region[a]
                if node in convs and a is node.args[0]:
                    return entries[a]
                return fake_value(a)

            args = map_arg(node.args, value)
            kwargs = map_arg(node.kwargs, value)
            try:
                new = node.target(*args, **kwargs)
            except Exception:  # the fake kernel refuses the new order: not this pass's case
                return 0
            if not _same_structure(new, fake_value(node)):
                return 0
            region[node] = new
    # the readers outside the region of a value whose order changed get it back in its original order
    exits: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node, new in region.items():
        outside = [u for u in node.users if u not in region]
        if outside and _reordered(new, fake_value(node)):
            if not fake_value(node).is_contiguous():
                return 0
            exits[node] = outside
    if sum(u.op == "output" for users in exits.values() for u in users) > 1:
        return 0  # a training graph's saved activations: as many copies back as outputs
    for x, copy in entries.items():
        with graph.inserting_before(first_reader[x]):
            cl = graph.call_function(aten.clone.default, (x,), {"memory_format": torch.channels_last})
        cl.meta.update(x.meta)
        cl.meta["val"] = copy
        for conv in convs:
            if conv.args[0] is x and conv in region:
                conv.update_arg(0, cl)
    for node, users in exits.items():
        with graph.inserting_after(node):
            back = graph.call_function(aten.clone.default, (node,), {"memory_format": torch.contiguous_format})
        back.meta.update(node.meta)  # its original value: contiguous, as the readers saw it
        for u in users:
            u.replace_input_with(node, back)
    for node, new in region.items():
        node.meta["val"] = new
    return sum(1 for n in convs if n in region)
