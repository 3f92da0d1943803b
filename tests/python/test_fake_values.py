"""graphex.passes.fake_values: a pass's refresh of fake values gives what a fresh propagation of the whole graph gives
(Note [A pass refreshes only the fake values its change reaches]), on the fuzzer's programs and on decoders."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conftest import assert_same, compile_graphex, fused_op_tol, require
from graphex.passes import fake_values
from sweeps import fuzz_run
from sweeps.compare import clone_tree
from sweeps.fuzz_gen import generate


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _propagated(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, Any]:
    """Every call_function node's fake value, run again in order from the graph's inputs (the oracle)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._inductor.virtualized import V

    vals: dict[torch.fx.Node, Any] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or not callable(node.target) or "val" not in node.meta:
            vals[node] = node.meta.get("val")
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: vals[n])
        with V.fake_mode, enable_python_dispatcher():
            vals[node] = node.target(*args, **kwargs)
    return vals


def _disagreement(gm: torch.fx.GraphModule) -> str | None:
    """Where the graph's fake values differ from a fresh propagation: a layout, or which nodes share memory."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

    fresh = _propagated(gm)
    ours_to_fresh: dict[int, int] = {}
    fresh_to_ours: dict[int, int] = {}
    for node in gm.graph.nodes:
        ours, theirs = _leaves(node.meta.get("val")), _leaves(fresh[node])
        if len(ours) != len(theirs):
            return f"{node.format_node()}: {len(ours)} values, a fresh propagation gives {len(theirs)}"
        for a, b in zip(ours, theirs):
            if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
                continue
            if a.dtype != b.dtype or not statically_known_true(sym_eq(a.shape, b.shape)) \
                    or not statically_known_true(sym_eq(a.stride(), b.stride())) \
                    or not statically_known_true(sym_eq(a.storage_offset(), b.storage_offset())):
                return f"{node.format_node()}: {a} against a fresh propagation's {b}"
            sa, sb = a.untyped_storage()._cdata, b.untyped_storage()._cdata
            if ours_to_fresh.setdefault(sa, sb) != sb or fresh_to_ours.setdefault(sb, sa) != sa:
                return f"{node.format_node()}: shares memory with other nodes than in a fresh propagation"
    return None


@pytest.fixture
def refreshes(monkeypatch):
    """The graph's fake values checked against a fresh propagation after every pass before reinplacing, and after
    every FakeValues refresh up to reinplacing's own (what reinplacing's alias analysis reads; the in-place ops it
    makes keep their functional values, as in inductor): the disagreements found, and how many refreshes ran."""
    import dataclasses

    from torch._inductor.virtualized import V

    import graphex.passes as passes

    found: list[str] = []
    runs = [0]
    state = {"pass": "", "reinplaced": False}

    def check(where: str, gm: torch.fx.GraphModule) -> None:
        why = _disagreement(gm)
        if why is not None:
            found.append(f"{where}: {why}")

    def checked(p: Any) -> Any:
        def run(r: Any) -> None:
            state["pass"] = p.name
            p.run(r)
            if state["reinplaced"] or p.run is passes._reinplace:
                state["reinplaced"] = True
                return
            with V.set_fake_mode(r.fake_mode):
                check(f"after {p.name}", r.gm)
        return dataclasses.replace(p, run=run)

    update = fake_values.FakeValues.incremental_update

    def counted(self: fake_values.FakeValues) -> int:
        updated = update(self)
        runs[0] += 1
        if not state["reinplaced"]:
            check(f"the refresh in {state['pass']}", self.gm)
        return updated

    monkeypatch.setattr(passes, "PIPELINE", tuple(checked(p) for p in passes.PIPELINE))
    monkeypatch.setattr(fake_values.FakeValues, "incremental_update", counted)
    yield found, runs


@pytest.mark.parametrize("first", range(0, 240, 40))
def test_the_fuzzers_programs_refresh_as_a_fresh_propagation(refreshes, first):
    found, runs = refreshes
    outcomes = []
    for seed in range(first, first + 40):
        torch._dynamo.reset()
        outcomes.append(fuzz_run.check(generate(seed), seed).kind)
    assert not found, sorted({f.split(":")[0] for f in found})
    assert runs[0] > 40  # the refresh ran (no-op removal and reinplacing on each graph)
    assert outcomes.count("ok") > 20, outcomes
    assert "graphex_diff" not in outcomes, outcomes


class _Decoder(torch.nn.Module):
    """A decode step over a KV cache written in place (slice_scatter once functional), with no-op copies and views."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)
        self.register_buffer("k_cache", torch.zeros(1, 2, 8, 8))
        self.register_buffer("v_cache", torch.zeros(1, 2, 8, 8))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(16, dim=-1)
        q, k, v = (t.view(1, 1, 2, 8).transpose(1, 2) for t in (q, k, v))
        self.k_cache.index_copy_(2, pos, k.contiguous())
        self.v_cache[:, :, pos] = v.clone()
        a = torch.nn.functional.scaled_dot_product_attention(q, self.k_cache, self.v_cache)
        h = a.transpose(1, 2).reshape(1, 1, 16).contiguous().clone()
        return self.out(h + x) * x.to(torch.float32)


FUSED = pytest.mark.parametrize("options", [{}, {"pattern_fusion_pass": True}], ids=["exact", "fused"])


def _close(got: torch.Tensor, expected: torch.Tensor, options: dict[str, Any]) -> None:
    if options:
        torch.testing.assert_close(got, expected, rtol=0, atol=fused_op_tol(expected.dtype) * 10)
    else:
        assert_same(got, expected)


@FUSED
def test_a_decoder_with_a_kv_cache_refreshes_as_a_fresh_propagation(refreshes, options):
    found, runs = refreshes
    torch._dynamo.reset()
    model, eager = _Decoder().eval(), _Decoder().eval()
    eager.load_state_dict(model.state_dict())
    compiled = compile_graphex(model, **options)
    with torch.no_grad():
        for step in range(3):
            x, pos = torch.randn(1, 1, 16), torch.tensor([step])
            _close(compiled(*clone_tree([x, pos])), eager(x, pos), options)
            _close(model.k_cache, eager.k_cache, options)
            _close(model.v_cache, eager.v_cache, options)
    assert runs[0] >= 2 and not found, found[:3]


@FUSED
def test_a_transformers_decoder_refreshes_as_a_fresh_propagation(refreshes, options):
    transformers = require("transformers")
    found, runs = refreshes
    torch._dynamo.reset()
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
        got = compile_graphex(model, **options)(ids, use_cache=False).logits
    _close(got, expected, options)
    assert runs[0] >= 2 and not found, found[:3]


def test_a_graph_with_a_subgraph_takes_inductors_updater():
    from torch._inductor.fx_utils import FakeTensorUpdater

    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    assert isinstance(fake_values.refresher(gm), fake_values.FakeValues)
    gm.add_submodule("branch", torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()))
    assert isinstance(fake_values.refresher(gm), FakeTensorUpdater)


class _ConvNet(torch.nn.Module):
    """Fused mode's rules: channels_last convolutions, batch norm as a multiply and an add, max pooling without
    indices, and element-wise chains around them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        y = self.bn2(self.conv2(h))
        return torch.sigmoid(y + h).flatten(1).mean(1, keepdim=True) * 2 - h.amax((2, 3))


@FUSED
def test_a_conv_net_refreshes_as_a_fresh_propagation(refreshes, options):
    found, runs = refreshes
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _ConvNet().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
        got = compile_graphex(model, **options)(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5) if options else assert_same(got, expected)
    assert runs[0] >= 1 and not found, found[:3]
