"""From a Dynamo graph to a replayable program.

    Dynamo FX graph
      └─ AOTAutograd (inference, keep_inference_input_mutations=True): functional ATen graph
           └─ passes (graphex/passes): reinplace, remove no-ops, the user's passes
                └─ lower (graphex/lowering/lower.py): the typed Program (graphex/program/typed.py)
                     └─ graphex._C.Executor: ops resolved once, run from C++

When autograd is needed (grad mode on and an input requires grad) the forward
graph still runs on the engine and the backward on AOTAutograd's eager path
(Note [Inference first]).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx
from torch._functorch._aot_autograd.utils import make_boxed_func
from torch._functorch.aot_autograd import aot_module_simplified
from torch._guards import TracingContext, detect_fake_mode

from . import _C, compat
from .base import log as _log
from .base.source import pretty_source
from .custom_ops import check_dynamo_graph, install_trace_checks
from .runtime.debug_dump import keep_original
from .runtime.dump import dump_graph
from .lowering import lower
from .options import Options
from .passes import run_passes
from .passes.keep_whole import keep_interpolation_whole, keep_multihead_attention_whole
from .runtime import CompiledGraph

_graph_ids = itertools.count()

# Note [Tools see captures through one registry]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A tool that needs to know what graphex captured (`graphex triage` counts the copies the user's own
# Dynamo graph makes) registers a hook for the length of a `with on_capture(hook):` block; each graph
# graphex captures meanwhile, on any thread, calls hook(dynamo_graph, compiled_graph). Nothing of
# graphex (or torch) is replaced to see it. The registry is a tuple swapped under a lock: a capture
# reads it once, without the lock.
_capture_hooks: tuple[Callable[[torch.fx.GraphModule, CompiledGraph], None], ...] = ()
_capture_hooks_lock = threading.Lock()


@contextlib.contextmanager
def on_capture(hook: Callable[[torch.fx.GraphModule, CompiledGraph], None]) -> Iterator[None]:
    """Call hook(dynamo_graph, compiled_graph) for each graph graphex captures inside the block (Note [Tools see
    captures through one registry])."""
    global _capture_hooks
    with _capture_hooks_lock:
        _capture_hooks = (*_capture_hooks, hook)
    try:
        yield
    finally:
        with _capture_hooks_lock:
            hooks = list(_capture_hooks)
            hooks.remove(hook)
            _capture_hooks = tuple(hooks)


def compile_dynamo_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options,
                         on_capture: Callable[[CompiledGraph], None] | None = None) -> Callable[..., Any]:
    """The backend proper: Dynamo's graph and example inputs in, a callable out.

    `on_capture` is told about each CompiledGraph made (cache_compile records it).
    """
    install_trace_checks()  # back after a torch._dynamo.reset() (Note [Where custom-op errors are caught])
    check_dynamo_graph(gm)
    user_names = [pretty_source(n._dynamo_source.name) if getattr(n, "_dynamo_source", None) else n.name
                  for n in gm.graph.find_nodes(op="placeholder")]

    # (graph, its ATen graph, whether AOTAutograd compiled it as its inference graph) for each graph compiled
    captured: list[tuple[CompiledGraph, torch.fx.GraphModule, bool]] = []

    def engine_compiler(fx_gm: torch.fx.GraphModule, flat_inputs: Sequence[Any],
                        inference: bool = False) -> CompiledGraph:
        compiled = capture(fx_gm, flat_inputs, options, user_names)
        captured.append((compiled, fx_gm, inference))
        if on_capture is not None:
            on_capture(compiled)
        for hook in _capture_hooks:
            hook(gm, compiled)
        return compiled

    # Note [Inference first]
    # The engine replays inference graphs: AOTAutograd's inference graph, with input
    # mutations kept in it so that a KV cache is written in place. When autograd is
    # needed (grad mode on and an input or parameter requires grad), AOTAutograd
    # partitions the joint graph: its forward graph (outputs plus the activations the
    # backward saves) runs on the engine too, and the backward runs on AOTAutograd's
    # eager path, so gradients are what AOTAutograd computes.
    needs_autograd = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
    # Note [Interpolation runs eager's kernel], Note [MultiheadAttention runs eager's fast path]
    kept_whole = keep_interpolation_whole(gm, needs_autograd=needs_autograd)
    kept_mha = keep_multihead_attention_whole(gm, needs_autograd=needs_autograd)
    if kept_whole or kept_mha:
        _log.info("graphex: kept whole as eager runs them (bit for bit): %d interpolation call(s), %d "
                  "MultiheadAttention fast path(s)", kept_whole, kept_mha)
    if needs_autograd:
        _log.info("graphex: this graph needs autograd (grad mode is on and an input or parameter requires grad): "
                  "its forward runs on the engine and saves activations for AOTAutograd's eager backward. For "
                  "inference, call it under torch.no_grad() or torch.inference_mode().")
        return aot_module_simplified(gm, example_inputs, fw_compiler=engine_compiler,
                                     inference_compiler=engine_compiler, bw_compiler=make_boxed_func_nop())

    aot = aot_module_simplified(
        gm, example_inputs,
        # AOTAutograd may still pick its training path (grad re-enabled inside the graph, an input requiring grad)
        fw_compiler=engine_compiler,
        inference_compiler=functools.partial(engine_compiler, inference=True),
        keep_inference_input_mutations=True,
    )
    return _direct_call(aot, gm, example_inputs, captured, options)


def _direct_call(aot: Callable[..., Any], gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 captured: list[tuple[CompiledGraph, torch.fx.GraphModule, bool]],
                 options: Options) -> Callable[..., Any]:
    """What Dynamo calls per step: a DirectCall into the one inference graph when AOTAutograd's wrapper would only
    bump version counters and turn grad mode off (Note [A plain inference graph skips AOTAutograd's wrapper]),
    else AOTAutograd's own callable."""
    if not options.direct_call:
        return aot
    if len(captured) != 1:
        _log.detail("graphex: AOTAutograd's wrapper kept: %d graphs were compiled for one Dynamo graph", len(captured))
        return aot
    compiled, fw_graph, inference = captured[0]
    if not inference:
        _log.detail("graphex: %s: AOTAutograd's wrapper kept: it compiled a training graph (autograd runs around it)",
                    compiled.name)
        return aot
    why = compat.why_aot_wrapper_is_needed(compiled.aot_metadata, fw_graph, gm, example_inputs)
    if why:
        _log.detail("graphex: %s: AOTAutograd's wrapper kept: %s", compiled.name, why)
        return aot
    mutated = compat.mutated_in_graph(compiled.aot_metadata) or ()
    return _C.DirectCall(compiled, aot, mutated, torch._C._increment_version)


def make_boxed_func_nop() -> Callable[..., Any]:
    def nop(fx_gm: torch.fx.GraphModule, _inputs: Sequence[Any]) -> Callable[..., Any]:
        return make_boxed_func(fx_gm.forward)

    return nop


def capture(fx_gm: torch.fx.GraphModule, flat_inputs: Sequence[Any], options: Options,
            user_names: Sequence[str] = ()) -> CompiledGraph:
    """Optimize and lower one functional ATen graph; returns the boxed callable AOTAutograd runs.

    `user_names`: what the user calls each input (from Dynamo's sources), for messages.
    """
    start = time.perf_counter()
    placeholders = list(fx_gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) == len(user_names):  # AOTAutograd kept Dynamo's inputs one to one
        for node, user_name in zip(placeholders, user_names):
            node.meta["graphex_user_name"] = user_name
    graph_id = next(_graph_ids)
    name = f"graph_{graph_id}"
    fake_mode = detect_fake_mode(flat_inputs)
    original = keep_original(fx_gm, options)  # None unless data_dump_stage='original'
    ctx = TracingContext.try_get()
    aot_metadata = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    done = run_passes(fx_gm, options, fake_mode, name, new_outputs=compat.new_outputs(aot_metadata))
    for copy in done.kept:
        _log.info("%s: %s", name, copy)

    static_inputs = _static_input_indices(len(flat_inputs))
    compiled = CompiledGraph(name, fx_gm, options, static_inputs=static_inputs, kept_copies=done.kept,
                             in_place=done.in_place, fused=done.fused)
    compiled.original_gm = original
    compiled.aot_metadata = aot_metadata
    elapsed = (time.perf_counter() - start) * 1000
    _log.info("%s: captured %d ops, %d inputs, %d outputs in %.1f ms%s", name, compiled.num_ops,
              len(flat_inputs), compiled.num_outputs, elapsed, " (dynamic shapes)" if compiled.dynamic else "")
    if options.dump_dir:
        dump_graph(options.dump_dir, compiled)
    return compiled


def _static_input_indices(num_inputs: int) -> list[int]:
    """Graph inputs that are parameters or buffers (for frozen_parameter)."""
    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    indices = list(getattr(meta, "static_input_indices", None) or [])
    return [i for i in indices if i < num_inputs]


__all__ = ["compile_dynamo_graph", "capture", "lower"]
