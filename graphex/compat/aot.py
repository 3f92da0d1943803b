"""What AOTAutograd's runtime wrapper would do per call for one inference graph, read from its own metadata.

Note [A plain inference graph skips AOTAutograd's wrapper] (csrc/python/direct_call.cpp) says why graphex hands
Dynamo a DirectCall instead of AOTAutograd's wrapper when that wrapper would only bump version counters and turn
grad mode off. This module answers "would it do anything else?" from the ViewAndMutationMeta AOTAutograd hands
the inference compiler (TracingContext.fw_metadata): each field below is one job of the wrapper, and a field this
torch does not have counts as a job (the wrapper is kept). Read against the inference path of
torch/_functorch/_aot_autograd/runtime_wrappers.py (_create_runtime_wrapper and the wrappers of
graph_compile.aot_stage2_inference) in 2.13 and 2.14. On a version whose wrapper does more that a caller can see,
tests/python/test_direct_call.py (which compares every visible effect of both paths) fails there.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def why_aot_wrapper_is_needed(meta: Any, fw_graph: torch.fx.GraphModule, dynamo_graph: torch.nn.Module,
                              example_inputs: Sequence[Any]) -> str:
    """'' when AOTAutograd's inference wrapper around `fw_graph` only bumps version counters and turns grad mode
    off (what a DirectCall does); else the first job it does beyond that, for the log."""
    if meta is None:
        return "AOTAutograd handed no metadata"
    if any(True for _ in dynamo_graph.parameters()) or any(True for _ in dynamo_graph.buffers()):
        return "Dynamo's graph holds parameters or buffers, which aot_module_simplified prepends per call"
    placeholders = len(fw_graph.graph.find_nodes(op="placeholder"))
    if placeholders != len(example_inputs):
        return (f"the graph takes {placeholders} inputs for Dynamo's {len(example_inputs)} (duplicated or aliased "
                "arguments, effect tokens or RNG state, which the wrapper rearranges per call)")
    outputs, dynamo_outputs = _outputs(fw_graph), _outputs(dynamo_graph)
    if outputs is None or dynamo_outputs is None or len(outputs) != len(dynamo_outputs):
        return "the graph returns other values than Dynamo's graph (tensor subclasses unwrapped, or extra outputs)"
    values = [*example_inputs, *(_example(n) for n in dynamo_graph.graph.find_nodes(op="placeholder")),
              *(_example(n) for n in dynamo_outputs)]
    if any(isinstance(v, torch.Tensor) and (is_traceable_wrapper_subclass(v) or
                                           type(v) not in (torch.Tensor, torch.nn.Parameter, FakeTensor))
           for v in values):
        return "a tensor subclass input or output"
    jobs = (
        ("num_mutated_inp_runtime_indices", 0, "an input mutation left for the wrapper to apply"),
        ("num_outputs_aliased", 0, "an output that aliases an input or an intermediate (regenerated per call)"),
        ("num_unsafe_view_outputs", 0, "an output the joint path would _unsafe_view"),
        ("num_intermediate_bases", 0, "an intermediate base returned for an aliased output"),
        ("dynamic_outputs", False, "outputs marked dynamic per call"),
        ("grad_enabled_mutation", None, "the graph sets grad mode"),
        ("is_rng_op_functionalized", False, "functionalized RNG state"),
        ("num_outputs_rng_offset", 0, "functionalized RNG state"),
    )
    for field, plain, why in jobs:
        if not hasattr(meta, field):
            return f"this torch's metadata has no {field}"
        if getattr(meta, field) != plain:
            return why
    if getattr(meta, "tokens", None):
        return "effect tokens"
    for field in ("subclass_inp_meta", "subclass_fw_graph_out_meta"):
        # a plain tensor's entry: its position (an int), or a PlainTensorMeta (2.13, 2.14)
        if not all(isinstance(m, int) or type(m).__name__ == "PlainTensorMeta" for m in (getattr(meta, field, None) or ())):
            return "a tensor subclass input or output"
    if torch._C._is_any_autocast_enabled():
        return "autocast is on (the wrapper turns it off per call)"
    mutated = mutated_in_graph(meta)
    if mutated is None or any(i >= len(example_inputs) for i in mutated):
        return "the inputs the graph mutates are not known"
    return ""


def mutated_in_graph(meta: Any) -> tuple[int, ...] | None:
    """The argument positions whose version counters the wrapper bumps before each call (the inputs the graph
    mutates, that autograd sees); None when this torch's metadata does not say."""
    indices = getattr(meta, "mutated_graph_handled_indices_seen_by_autograd", None)
    return None if indices is None else tuple(int(i) for i in indices)


def new_outputs(meta: Any) -> list[int] | None:
    """The positions, among the graph's outputs, of the user's outputs AOTAutograd found to be new memory (its
    OutputType.non_alias: handed to the caller as they are; every other kind it regenerates per call); None when
    this torch's metadata does not say (then every output counts)."""
    infos = getattr(meta, "output_info", None)
    first = getattr(meta, "num_mutated_inp_runtime_indices", None)  # the inputs' new values come first
    if infos is None or first is None:
        return None
    return [first + i for i, info in enumerate(infos) if getattr(getattr(info, "output_type", None), "name", "")
            == "non_alias"]


def _outputs(graph: torch.fx.GraphModule) -> list[Any] | None:
    """The values a graph returns (its output node's flattened argument), or None when it has no one output node."""
    nodes = graph.graph.find_nodes(op="output")
    if len(nodes) != 1:
        return None
    out = nodes[0].args[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _example(node: Any) -> Any:
    """What Dynamo traced a node's value as (its example value), or None."""
    if not isinstance(node, torch.fx.Node):
        return None
    return node.meta.get("example_value", node.meta.get("val"))
