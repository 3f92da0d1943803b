"""Keep whole the functions eager runs as one kernel, where AOTAutograd would decompose them differently.

Note [Interpolation runs eager's kernel]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Eager `F.interpolate(x, mode="bilinear")` calls `aten::upsample_bilinear2d.vec`, whose C++
composite computes the output size and scales and calls the `upsample_bilinear2d` kernel.
Under AOTAutograd the Python dispatcher runs torch's *Python* decomposition of `.vec`
instead (torch/_decomp: index arithmetic, gathers and lerps), which rounds differently:
`aot_eager` and inductor differ from eager in the last bits for linear / bilinear / bicubic /
trilinear interpolation.

So before AOTAutograd, on Dynamo's graph (static shapes only), each `F.interpolate` node is
replaced by the one kernel call eager makes for it, with the arguments eager passes: found
by running the same call on a meta tensor of the input's shape, dtype and strides under a
dispatch mode that records the ops reaching it (the C++ composite runs, as in eager). The
rewrite is made only when exactly one recorded op is an interpolation kernel reading the
input; otherwise the node is left as it was. The kernel (`upsample_bilinear2d.default`, ...)
has no Python decomposition, so AOTAutograd keeps it and the engine calls eager's kernel:
bit for bit by construction. `nearest` modes are left alone: their decomposition is exact.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from .. import _C  # noqa: F401  (registers the graphex_whole:: stand-ins)
from torch.utils._python_dispatch import TorchDispatchMode

# Functions whose eager call is one kernel that AOTAutograd decomposes differently, and those kernels.
# Not torch.linalg.eigvalsh / svdvals: under a dispatch mode their C++ composite asks for the vectors
# (`_may_require_fw_or_bw_grad` sees a Python key), so the recorded call is not the one eager makes.
_INTERPOLATE_FUNCTIONS = (F.interpolate, F.upsample, F.upsample_bilinear)  # the latter two call interpolate
_KERNELS = {
    torch.ops.aten.upsample_linear1d.default,
    torch.ops.aten.upsample_bilinear2d.default,
    torch.ops.aten.upsample_bicubic2d.default,
    torch.ops.aten.upsample_trilinear3d.default,
    torch.ops.aten._upsample_bilinear2d_aa.default,
    torch.ops.aten._upsample_bicubic2d_aa.default,
}


# Kernels that torch also decomposes at the Autograd key under the Python dispatcher (torch/_decomp:
# `py_impl(DispatchKey.Autograd)`): AOTAutograd would still decompose them, so the trace sees a stand-in op of
# graphex's with the same schema (its kernels call the aten one) and `restore_kept_kernels` puts the aten kernel
# back once AOTAutograd is done. The stand-ins have no autograd formula: used only when no gradient is needed.
_STAND_INS: dict[Any, Any] = {}
_LIBRARY = torch.library.Library("graphex_whole", "DEF")


def _define_stand_in(kernel: Any) -> None:
    name = kernel._schema.name.split("::", 1)[1]
    _LIBRARY.define(str(kernel._schema).split("::", 1)[1])

    def run(*args: Any, **kwargs: Any) -> Any:
        return kernel(*args, **kwargs)

    _LIBRARY.impl(name, run, "CompositeExplicitAutograd")
    _LIBRARY.impl(name, run, "Meta")
    _STAND_INS[kernel] = getattr(torch.ops.graphex_whole, name).default


for _kernel in (torch.ops.aten.upsample_bilinear2d.default, torch.ops.aten.upsample_bicubic2d.default):
    _define_stand_in(_kernel)
_KERNEL_OF_STAND_IN = {v: k for k, v in _STAND_INS.items()}


def keep_interpolation_whole(gm: torch.fx.GraphModule, *, needs_autograd: bool) -> int:
    """Note [Interpolation runs eager's kernel]. Returns how many calls were rewritten."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _INTERPOLATE_FUNCTIONS:
            continue
        call = _eager_kernel_call(node)
        if call is None:
            continue
        kernel, args, output = call
        if kernel in _STAND_INS:
            if needs_autograd:
                continue  # the stand-in has no derivative; AOTAutograd's decomposition has one
            kernel = _STAND_INS[kernel]
        if output is None:
            node.target, node.args, node.kwargs = kernel, (node.args[0], *args), {}
        else:  # eager returns one output of a multi-output kernel (eigvalsh: the eigenvalues of eigh)
            with gm.graph.inserting_before(node):
                whole = gm.graph.call_function(kernel, (node.args[0], *args))
            node.target, node.args, node.kwargs = operator.getitem, (whole, output), {}
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        self.calls.append((func, args, kwargs or {}, result))
        return result


def _eager_kernel_call(node: torch.fx.Node) -> tuple[Any, tuple[Any, ...], int | None] | None:
    """(kernel, arguments after the input, which output eager returns or None for the only one) for the call
    eager makes for this node, or None to leave the node alone."""
    source = node.args[0] if node.args else None
    if not isinstance(source, torch.fx.Node):
        return None
    example = source.meta.get("example_value")
    if not isinstance(example, torch.Tensor) or example.is_sparse:
        return None
    if not all(isinstance(s, int) for s in (*example.shape, *example.stride())):
        return None  # symbolic shapes: the sizes eager computes are not constants
    if _has_node((*node.args[1:], *node.kwargs.values())):
        return None  # a size or scale computed in the graph: not a constant
    meta = torch.empty_strided(example.shape, example.stride(), dtype=example.dtype, device="meta")
    recorder = _Recorder()
    try:
        with recorder, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # F.upsample* are deprecated: the user sees that warning from eager
            returned = node.target(meta, *node.args[1:], **node.kwargs)
    except Exception:  # whatever eager would raise is raised by the unchanged graph, with its own message
        return None
    if len(recorder.calls) != 1 or not isinstance(returned, torch.Tensor):
        return None
    kernel, args, call_kwargs, result = recorder.calls[0]
    if kernel not in _KERNELS or not args or args[0] is not meta:
        return None
    if any(isinstance(a, torch.Tensor) for a in (*args[1:], *call_kwargs.values())):
        return None
    args = (*args[1:], *_keyword_as_positional(kernel, len(args), call_kwargs))
    if isinstance(result, torch.Tensor):
        return (kernel, args, None) if result is returned else None
    outputs = [i for i, r in enumerate(result) if r is returned]
    return (kernel, args, outputs[0]) if len(outputs) == 1 else None


def _keyword_as_positional(kernel: Any, given: int, kwargs: dict[str, Any]) -> list[Any]:
    """Keyword arguments of a recorded call, in the schema's order after the `given` positional ones."""
    extra = []
    for argument in kernel._schema.arguments[given:]:
        if argument.name in kwargs:
            extra.append(kwargs[argument.name])
        elif kwargs:
            extra.append(argument.default_value)
    return extra if kwargs else []


def _has_node(value: Any) -> bool:
    if isinstance(value, torch.fx.Node):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_node(v) for v in value)
    if isinstance(value, dict):
        return any(_has_node(v) for v in value.values())
    return False


def restore_kept_kernels(graph: torch.fx.Graph) -> None:
    """After AOTAutograd: each stand-in call becomes the aten kernel it stands for (same schema, same arguments)."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target in _KERNEL_OF_STAND_IN:
            node.target = _KERNEL_OF_STAND_IN[node.target]


# -- nn.MultiheadAttention --------------------------------------------------------------------------
# Note [MultiheadAttention runs eager's fast path]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# In eval mode without gradients, eager nn.MultiheadAttention (batch_first, self-attention, no
# mask, ...) calls one fused kernel, `torch._native_multi_head_attention`.
# Under Dynamo, `_is_make_fx_tracing()` is a constant True (torch/_dynamo/variables/torch.py), so
# the module takes its slow path: transpose, F.multi_head_attention_forward, transpose back,
# which AOTAutograd decomposes into ~30 ops that differ from the fused kernel in the last bits.
# Where Dynamo's graph shows exactly that slow path with the arguments for which eager takes the
# fast path (checked below, condition by condition, from MultiheadAttention.forward), the
# nodes are replaced by the fused call eager makes: the same kernel, so bit for bit.


def keep_multihead_attention_whole(gm: torch.fx.GraphModule, *, needs_autograd: bool) -> int:
    if needs_autograd or not torch.backends.mha.get_fastpath_enabled() or torch.is_autocast_enabled():
        return 0
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is F.multi_head_attention_forward:
            rewritten += _rewrite_mha(gm.graph, node)
    if rewritten:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return rewritten


_MHA_PARAMETERS = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias",
                   "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias")
# Keyword arguments and the only values for which eager's module took its fast path.
_MHA_FAST_PATH_KWARGS = {"training": False, "key_padding_mask": None, "attn_mask": None, "is_causal": False}


def _rewrite_mha(graph: torch.fx.Graph, node: torch.fx.Node) -> int:
    if len(node.args) != len(_MHA_PARAMETERS):
        return 0
    a = dict(zip(_MHA_PARAMETERS, node.args))
    kwargs = dict(node.kwargs)
    average = kwargs.pop("average_attn_weights", True)
    need_weights = kwargs.pop("need_weights", True)
    if any(kwargs.get(k, v) != v or (v is None and kwargs.get(k) is not None) for k, v in _MHA_FAST_PATH_KWARGS.items()):
        return 0
    if set(kwargs) - set(_MHA_FAST_PATH_KWARGS) or not isinstance(average, bool) or not isinstance(need_weights, bool):
        return 0  # use_separate_proj_weight, static_k/v, ...: not the packed fast path
    query = a["query"]
    if not (query is a["key"] is a["value"]) or a["bias_k"] is not None or a["bias_v"] is not None:
        return 0
    if a["add_zero_attn"] is not False or a["in_proj_bias"] is None or a["in_proj_weight"] is None:
        return 0
    embed_dim, heads = a["embed_dim_to_check"], a["num_heads"]
    if not isinstance(embed_dim, int) or not isinstance(heads, int) or heads % 2 or embed_dim % heads:
        return 0
    # The batch_first slow path: x.transpose(1, 0) in, [0].transpose(1, 0) out.
    if not (query.op == "call_method" and query.target == "transpose" and tuple(query.args[1:]) == (1, 0)):
        return 0
    x = query.args[0]
    tensors = [x, a["in_proj_weight"], a["in_proj_bias"], a["out_proj_weight"], a["out_proj_bias"]]
    vals = [t.meta.get("example_value") if isinstance(t, torch.fx.Node) else None for t in tensors]
    if not all(isinstance(v, torch.Tensor) for v in vals) or vals[0].dim() != 3 or vals[0].is_nested:
        return 0
    if len({v.dtype for v in vals}) != 1 or len({v.device for v in vals}) != 1 or vals[0].device.type not in ("cpu", "cuda"):
        return 0
    users = list(node.users)
    if any(u.op != "call_function" or u.target is not operator.getitem or u.args[1] not in (0, 1) for u in users):
        return 0
    first = [u for u in users if u.args[1] == 0]
    if len(first) != 1:
        return 0
    back = list(first[0].users)
    if len(back) != 1 or not (back[0].op == "call_method" and back[0].target == "transpose"
                              and tuple(back[0].args[1:]) == (1, 0)):
        return 0
    with graph.inserting_before(node):
        fused = graph.call_function(torch._native_multi_head_attention, (
            x, x, x, embed_dim, heads, a["in_proj_weight"], a["in_proj_bias"], a["out_proj_weight"],
            a["out_proj_bias"], None, need_weights, average, None))
        out = graph.call_function(operator.getitem, (fused, 0))
    out.meta.update(back[0].meta)
    back[0].replace_all_uses_with(out)
    for weights in (u for u in users if u.args[1] == 1):  # need_weights: the same [B, L, S] (or per head) weights
        with graph.inserting_before(weights):
            fused_weights = graph.call_function(operator.getitem, (fused, 1))
        fused_weights.meta.update(weights.meta)
        weights.replace_all_uses_with(fused_weights)
    return 1
