"""The one runner (Note [A compiled graph runs in explicit phases], graphex/runtime/compiled_graph.py): explicit phases,
watchers instead of patching, lowered once, cache entries found by signature, cheap run counters."""

from __future__ import annotations

import gc
import importlib
import sys

import torch

import graphex
import graphex.runtime.compiled_graph
from graphex import _C
from graphex.custom_ops import reset_dynamo
from graphex.errors import SignatureError
from graphex.runtime import Phase, live_graphs


def _step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x + y).relu() * 2


class _Scaled(torch.nn.Module):
    def __init__(self, cache_dir: str | None = None, options: dict | None = None) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("b", torch.randn(4))
        if cache_dir is not None:
            self.cached = graphex.inference.cache_compile(self._forward, cache_dir=cache_dir, options=options)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.w + self.b).tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x)


def test_watchers_see_each_run_and_the_plain_runner_is_back_when_they_stop():
    reset_dynamo()
    compiled = torch.compile(_step, backend="graphex", fullgraph=True)
    x, y = torch.randn(3), torch.randn(3)
    with torch.no_grad():
        compiled(x, y)
        graph = live_graphs()[-1]
        assert graph.phase is Phase.STEADY and graph.runner is graph.executor
        seen = []
        unwatch = graph.watch(lambda args, outs: seen.append((list(args), list(outs))))
        out = compiled(x, y)
        unwatch()
        compiled(x, y)
    assert len(seen) == 1 and torch.equal(seen[0][1][0], out) and torch.equal(out, _step(x, y))
    assert graph.runner is graph.executor  # no watcher: the bare executor again


def test_frozen_parameters_are_lowered_once_on_the_first_call(monkeypatch):
    reset_dynamo()
    lowerings = []
    real_lower = graphex.runtime.compiled_graph.lower
    monkeypatch.setattr(graphex.runtime.compiled_graph, "lower", lambda *a, **k: lowerings.append(k.get("frozen")) or real_lower(*a, **k))
    model = _Scaled().eval()
    compiled = torch.compile(model, backend="graphex", fullgraph=True, options={"frozen_parameter": True})
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = model(x)
        assert torch.equal(compiled(x), expected)
        assert torch.equal(compiled(x), expected)
    graph = live_graphs()[-1]
    assert graph.phase is Phase.STEADY and graph.lowered.frozen_inputs
    assert len(lowerings) == 1 and lowerings[0]  # one lowering, with the real parameters


def test_cache_cold_call_lowers_once_even_with_frozen_parameter(tmp_path, monkeypatch):
    reset_dynamo()
    lowerings = []
    real_lower = graphex.runtime.compiled_graph.lower
    monkeypatch.setattr(graphex.runtime.compiled_graph, "lower", lambda *a, **k: lowerings.append(k.get("frozen")) or real_lower(*a, **k))
    monkeypatch.setattr(importlib.import_module("graphex.lowering.lower"), "lower", lambda *a, **k: lowerings.append("describe") or real_lower(*a, **k))
    model = _Scaled(str(tmp_path), options={"frozen_parameter": True}).eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(model.cached(x), model(x))
        model.w.add_(1.0)  # entries bind parameters by name: the new value is used
        assert torch.equal(model.cached(x), model(x))
    assert lowerings == [None]
    assert model.cached.stats["writes"] == 1


def _signature_errors_during(fn):
    raised = []

    def local(frame, event, arg):
        if event == "exception" and issubclass(arg[0], SignatureError):
            raised.append(arg[1])
        return local

    sys.settrace(lambda frame, event, arg: local)
    try:
        fn()
    finally:
        sys.settrace(None)
    return raised


def test_a_cache_with_several_entries_finds_its_entry_without_exceptions(tmp_path):
    reset_dynamo()
    model = _Scaled(str(tmp_path)).eval()
    xs = [torch.randn(n, 4) for n in (1, 2, 3, 4)]
    with torch.no_grad():
        for x in xs:
            model.cached(x)
        before = _C.total_run_count()
        results = []
        raised = _signature_errors_during(lambda: results.extend(model.cached(x) for x in reversed(xs)))
        assert _C.total_run_count() - before == 4  # each call ran its entry's program once
        for x, got in zip(reversed(xs), results):
            assert torch.equal(got, model(x))
    assert raised == []
    assert model.cached.stats["compiles"] == 4


def test_try_run_answers_none_for_inputs_that_do_not_fit_and_runs_nothing():
    reset_dynamo()
    compiled = torch.compile(_step, backend="graphex", fullgraph=True, dynamic=False)
    x, y = torch.randn(3), torch.randn(3)
    with torch.no_grad():
        compiled(x, y)
    executor = live_graphs()[-1].executor
    runs = executor.run_count
    assert executor.try_run([torch.randn(5), torch.randn(5)]) is None
    assert not executor.fits([torch.randn(5), torch.randn(5)]) and executor.fits([x, y])
    assert executor.run_count == runs
    (out,) = executor.try_run([x, y])
    assert torch.equal(out, _step(x, y)) and executor.run_count == runs + 1


def test_total_run_count_keeps_the_runs_of_destroyed_executors():
    reset_dynamo()
    compiled = torch.compile(_step, backend="graphex", fullgraph=True)
    with torch.no_grad():
        compiled(torch.randn(3), torch.randn(3))
    executor = live_graphs()[-1].executor
    before = _C.total_run_count()
    for _ in range(3):
        executor([torch.randn(3), torch.randn(3)])
    assert _C.total_run_count() - before == 3
    del executor, compiled
    reset_dynamo()
    gc.collect()
    assert _C.total_run_count() - before >= 3  # counted once the executor is gone too
