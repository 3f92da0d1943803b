"""Input signatures: static graphs never serve another signature; dynamic graphs resolve sizes per call."""

from __future__ import annotations

import pytest
import torch

import graphex
from conftest import assert_same, captures, compile_graphex, engine_runs, newest_capture


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def f(x, w):
    return (x @ w).softmax(-1) + x.sum()


def test_static_graph_recaptures_for_each_new_shape_dtype_and_stride():
    compiled = compile_graphex(f)
    w = torch.randn(4, 4)
    variants = [
        torch.randn(2, 4),                    # first capture
        torch.randn(3, 4),                    # new shape
        torch.randn(2, 4, dtype=torch.float64),  # new dtype (w promoted inside)
        torch.randn(4, 2).t(),                # new strides
    ]
    seen = set()
    for x in variants:
        ww = w.to(x.dtype)
        assert_same(compiled(x, ww), f(x, ww))
        seen.add(newest_capture().name)
    assert len(seen) == len(variants), "a graph captured for one signature served another"
    # Each program still checks what it receives (Note [A program never runs on inputs it was not built for]).
    program = captures()[0]
    with pytest.raises(graphex.SignatureError, match="expected float32\\[2, 4\\]"):
        program.executor([torch.randn(5, 4), w])


def test_static_graph_replays_the_same_capture_for_the_same_signature():
    compiled = compile_graphex(f)
    w = torch.randn(4, 4)
    compiled(torch.randn(2, 4), w)
    count = len(captures())
    before = engine_runs()
    for _ in range(5):
        x = torch.randn(2, 4)
        assert_same(compiled(x, w), f(x, w))
    assert len(captures()) == count
    assert engine_runs() == before + 5


def test_dynamic_shapes_resolve_sizes_per_call():
    def g(x, y):
        n = x.shape[0]
        return torch.cat([x, y], 0).view(n + y.shape[0], -1) * n, x.new_zeros(n * 2).sum()

    compiled = compile_graphex(g, dynamic=True)
    before = engine_runs()
    for n, m in [(2, 3), (5, 1), (7, 7)]:
        x, y = torch.randn(n, 3), torch.randn(m, 3)
        assert_same(compiled(x, y), g(x, y))
    assert engine_runs() == before + 3
    assert newest_capture().dynamic
