"""Note [Built-in patterns ship as traced graphs] (graphex/fusion/serialized/__init__.py): the shipped search graphs of
the running torch are what tracing gives now, node for node; registered, they make the patterns tracing makes, in the
same order; decoders fuse the same with either; and a torch with no shipped module, or a module generated from other
sources, traces as before."""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest
import torch
from torch._inductor.pattern_matcher import PatternPrettyPrinter

from graphex.fusion import manager, serialized
from graphex.fusion.serialized import writer

from sweeps import coverage_decoder as cd

FIX = f"the shipped patterns are stale: run {serialized.REGENERATE} and commit the file"


@pytest.fixture(scope="module")
def traced() -> manager.PatternRegistry:
    """Every built-in group registered with each search function traced (what a torch with no shipped module does)."""
    return writer.register_builtins(serialized.tracing("the test's reference", record=True))


@pytest.fixture(scope="module")
def shipped() -> manager.PatternRegistry:
    """Every built-in group registered as a fresh process registers it: from the shipped graphs, where there are."""
    return writer.register_builtins(None)


def _has_module() -> bool:
    return os.path.exists(writer.module_path())


def _shipped_module() -> Any:
    import importlib

    return importlib.import_module(f"graphex.fusion.serialized.{serialized.module_name()}")


def test_the_shipped_graphs_are_a_fresh_trace(traced, shipped):
    graphs = shipped.graphs
    if not _has_module():  # a torch graphex ships no graphs for: traced, as before (and said why)
        assert graphs.builders is None and "no shipped patterns" in graphs.why_traced
        return
    assert graphs.builders is not None, f"{serialized.module_name()}.py is not used: {graphs.why_traced}; {FIX}"
    fresh = traced.graphs.recorded
    module = _shipped_module()
    missing = [k for k in fresh if k not in module.GRAPHS]
    extra = [k for k in module.GRAPHS if k not in fresh]
    differ = [k for k in fresh if k in module.GRAPHS
              and writer.render_builder("_", k, fresh[k].graph).split("\n", 1)[1]
              != inspect.getsource(module.GRAPHS[k]).rstrip("\n").split("\n", 1)[1]]
    assert not (missing or extra or differ), (
        f"{FIX}. Traced now but not shipped: {missing[:3]}; shipped but no longer registered: {extra[:3]}; "
        f"traced differently: {differ[:3]}")
    assert list(module.GRAPHS) == list(fresh), f"the registration order changed; {FIX}"
    with open(writer.module_path()) as f:  # and the rest of the file (header, SOURCES) is what --write writes
        assert f.read() == writer.render_module(fresh), FIX
    assert not graphs.traced, f"registered by tracing although the module is used: {graphs.traced[:3]}"


def _typed(value: Any) -> Any:
    """An argument with its type (1, 1.0 and True compare equal in Python, not in a graph), nodes by name."""
    if isinstance(value, torch.fx.Node):
        return ("node", value.name)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_typed(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _typed(v)) for k, v in value.items()))
    return (type(value).__name__, repr(value))


def _nodes(graph: torch.fx.Graph) -> list[Any]:
    return [(n.op, n.name, n.target, _typed(n.args), _typed(n.kwargs),
             len(n.users)) for n in graph.nodes]


def test_every_shipped_graph_rebuilds_the_traced_graph_node_for_node(traced):
    if not _has_module():
        pytest.skip(f"torch {torch.__version__}: no shipped module; test_the_shipped_graphs_are_a_fresh_trace checks "
                    "that this torch traces")
    module = _shipped_module()
    for key, gm in traced.graphs.recorded.items():
        assert key in module.GRAPHS, f"{key}: not shipped; {FIX}"
        rebuilt = serialized.rebuild(module.GRAPHS[key])
        assert _nodes(rebuilt.graph) == _nodes(gm.graph), f"{key}: the shipped graph is not the trace; {FIX}"
        assert str(rebuilt.graph) == str(gm.graph), key  # what torch's duplicate check compares


def _entries(registry: manager.PatternRegistry) -> dict[Any, list[tuple[str | None, str]]]:
    return {anchor: [(getattr(e, "pattern_name", None), PatternPrettyPrinter.run(e.pattern)) for e in entries]
            for anchor, entries in registry.matcher.patterns.items()}


def test_registered_from_shipped_graphs_the_patterns_are_the_traced_ones_in_order(traced, shipped):
    assert _entries(shipped) == _entries(traced)  # per anchor: the patterns, their names, their order
    assert shipped.matcher.seen_patterns == traced.matcher.seen_patterns  # the duplicate check's graphs too


# Decoders spelled as models spell them (sweeps/coverage_decoder.py), each part of the pattern set: this repo's decoder,
# Meta's complex rotary (whose view shapes only the per-match re-trace compares), Phi3's packed MLP, Gemma's norm, the
# written attention with an additive mask, and bfloat16 (its upcast group).
SPELLINGS = [cd.Spelling(), cd.Spelling(rotary="complex"), cd.Spelling(mlp="fused_gate_up", norm="gemma"),
             cd.Spelling(attention="written", mask="additive", gqa="none"), cd.Spelling(dtype="bfloat16", norm="llama")]


def _decode_fused(spelling: cd.Spelling, registry: manager.PatternRegistry,
                  monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, int], list[torch.Tensor]]:
    from graphex.compile import on_capture

    monkeypatch.setattr(manager, "REGISTRY", registry)
    torch._dynamo.reset()
    model = cd.build(spelling)
    captured: list[Any] = []
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False,
                             options={"pattern_fusion_pass": True})
    with torch.no_grad(), on_capture(lambda dynamo_graph, graph: captured.append(graph)):
        logits = [x.clone() for x in cd.decode(model, compiled, 3)]
    fired: dict[str, int] = {}
    for graph in captured:
        for name, count in graph.fused.items():
            fired[name] = fired.get(name, 0) + count
    return fired, logits


@pytest.mark.parametrize("spelling", SPELLINGS, ids=[s.name for s in SPELLINGS])
def test_a_decoder_fuses_the_same_with_shipped_and_traced_patterns(spelling, traced, shipped, monkeypatch):
    fired_shipped, got = _decode_fused(spelling, shipped, monkeypatch)
    fired_traced, want = _decode_fused(spelling, traced, monkeypatch)
    assert fired_shipped and fired_shipped == fired_traced
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"step {step}: the same kernels on the same graph give other logits"


def test_a_torch_with_no_shipped_module_traces(monkeypatch):
    monkeypatch.setattr(serialized, "module_name", lambda version=None: "torch_0_0")
    graphs = serialized.shipped()
    assert graphs.builders is None and "no shipped patterns for torch" in graphs.why_traced
    traced_now: list[str] = []
    graph = graphs.first_trace(lambda x: x, [torch.ones(2)], None, lambda: traced_now.append("traced") or "gm")
    assert graph == "gm" and traced_now == ["traced"]


def test_a_module_generated_from_other_sources_is_not_used(monkeypatch):
    if not _has_module():
        pytest.skip(f"torch {torch.__version__}: no shipped module")
    monkeypatch.setattr(manager, "_builtins_identity", lambda: "the sources after an edit")
    graphs = serialized.shipped()
    assert graphs.builders is None and "other sources" in graphs.why_traced
