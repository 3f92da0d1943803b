"""Note [A match's re-trace is made once per shape] (graphex/compat/inductor.py): within one fusion run, torch's
re-trace of a pattern on a match's shapes is made once per distinct input metadata and reused, the replacement
copied per match. Each test compares a compile with the reuse against one without it (every match re-traced, as
torch does): the same kernels fire and the outputs are bit for bit the same."""

from __future__ import annotations

import collections
import contextlib
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._inductor import pattern_matcher

import graphex.fusion.manager as manager
from conftest import fused_ops, newest_capture
from examples.models.decoder import DecoderConfig, build_decoder

FUSED = {"pattern_fusion_pass": True}


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


@contextlib.contextmanager
def counting_traces(monkeypatch):
    """The traces torch's pattern matcher makes (make_fx, which its fwd_only calls), by function name."""
    counts: collections.Counter[str] = collections.Counter()
    make_fx = pattern_matcher.make_fx

    def counted(fn, *args, **kwargs):
        counts[getattr(fn, "__name__", repr(fn))] += 1
        return make_fx(fn, *args, **kwargs)

    monkeypatch.setattr(pattern_matcher, "make_fx", counted)
    yield counts


def compiled_twice(fn, args, monkeypatch):
    """(outputs, fused ops, traces) compiled with the reuse, then without it (torch's own per-match re-trace)."""
    results = []
    for reuse in (True, False):
        torch._dynamo.reset()
        with monkeypatch.context() as m, counting_traces(m) as traces:
            if not reuse:
                m.setattr(manager, "one_trace_per_shape", contextlib.nullcontext)
            compiled = torch.compile(fn, backend="graphex", fullgraph=True, dynamic=False, options=FUSED)
            out = compiled(*args)
        results.append((out, fused_ops(newest_capture().gm), dict(traces)))
    return results


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_a_decoders_layers_share_their_retraces_and_fuse_the_same(monkeypatch):
    model = build_decoder(DecoderConfig(layers=3, max_positions=32))
    k, v = model.new_cache()
    args = (torch.tensor([[3]]), torch.tensor([5]), k, v)
    (out, fused, traces), (out_torch, fused_torch, traces_torch) = compiled_twice(model, args, monkeypatch)
    assert fused == fused_torch and fused["rms_norm"] == 1 and fused["add_rms_norm"] == 6
    assert torch.equal(out, out_torch)
    assert sum(traces.values()) < sum(traces_torch.values()) / 2, (traces, traces_torch)
    # each search and replacement function traced at most once per distinct input shape: 3 layers, 1 trace
    assert traces["add_rms_norm"] == 1 and traces["add_rms_norm_fused"] == 1, traces
    assert traces_torch["add_rms_norm"] == 6, traces_torch


def test_matches_of_other_shapes_in_one_graph_are_retraced_each(monkeypatch):
    def f(x, w, x2, w2, y, u, z, t):
        return rms(x, w), rms(x2, w2), rms(y, u), rms(z, t)

    torch.manual_seed(0)
    args = (torch.randn(2, 3, 16), torch.randn(16), torch.randn(2, 3, 16), torch.randn(16),
            torch.randn(4, 32), torch.randn(32), torch.randn(3, 16).t(), torch.randn(3))  # the last x strided
    (out, fused, traces), (out_torch, fused_torch, _) = compiled_twice(f, args, monkeypatch)
    assert fused == fused_torch and fused["rms_norm"] >= 3, (fused, fused_torch)
    for got, same, want in zip(out, out_torch, f(*args)):
        assert torch.equal(got, same)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert traces["rms_norm"] == 3, traces  # three shapes: the two [2, 3, 16] norms share one re-trace
    assert traces["rms_norm_fused"] < fused["rms_norm"], traces  # and one replacement, copied for each


def test_one_search_function_registered_twice_is_retraced_per_registration(tmp_path):
    """The same search function under two trace functions is two patterns (found by a helper): the second's re-trace of
    its match must not be the first's graph, or its match is declined. In a fresh process (patterns stay registered)."""
    script = tmp_path / "twice.py"
    script.write_text(textwrap.dedent('''
        import collections, contextlib
        import torch, torch.nn.functional as F
        from torch._decomp import get_decompositions
        from torch._inductor.pattern_matcher import fwd_only
        import graphex
        import graphex.fusion.manager as manager

        @torch.library.custom_op("graphex_test_retrace::silu_add", mutates_args=())
        def silu_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.silu(x) + y

        @silu_add.register_fake
        def _(x, y):
            return torch.empty_like(x)

        def search(x, y):
            return F.silu(x) + y

        def replace(x, y):
            return torch.ops.graphex_test_retrace.silu_add(x, y)

        def decomposing(fn, args):  # the same search function, traced as x * sigmoid(x) + y
            return fwd_only(fn, args, get_decomp_fn=lambda: get_decompositions([torch.ops.aten.silu]))

        examples = [torch.randn(4, 4), torch.randn(4, 4)]
        graphex.register_replacement(search, replace, examples)
        graphex.register_replacement(search, replace, examples, trace_fn=decomposing)

        def f(a, b, c, d):
            return c * torch.sigmoid(c) + d, F.silu(a) + b  # both spellings, inputs of one shape

        args = [torch.randn(2, 8) for _ in range(4)]
        for reuse in (True, False):
            torch._dynamo.reset()
            if not reuse:
                manager.one_trace_per_shape = contextlib.nullcontext
            graph = torch.compile(f, backend="graphex", fullgraph=True, dynamic=False,
                                  options={"pattern_fusion_pass": True, "pointwise_fusion": False})
            with torch.no_grad():
                out = graph(*args)
            for got, want in zip(out, f(*args)):
                torch.testing.assert_close(got, want)
            fired = [n for n in graphex.runtime.compiled_graph.live_graphs()[-1].gm.graph.nodes
                     if n.target is torch.ops.graphex_test_retrace.silu_add.default]
            print("reuse" if reuse else "no reuse", len(fired))
    '''))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-5:] == ["reuse", "2", "no", "reuse", "2"], proc.stdout
