"""Per-op data dumps (dump_tensor_data / data_dump_stage / data_dump_dir / data_dump_calls) and
graphex.save_tensor, compared with eager bit for bit."""

from __future__ import annotations

import os

import pytest
import torch

import graphex
from graphex.custom_ops import reset_dynamo
from graphex.runtime.debug_dump import read_call
from graphex.runtime import live_graphs


def _step(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    h = torch.sin(x) * 2
    cache.add_(h)
    return h.cos() + cache.sum()


def _eager_values(x: torch.Tensor, cache: torch.Tensor) -> dict[str, torch.Tensor]:
    sin = torch.sin(x)
    mul = sin * 2
    after = cache + mul
    cos = mul.cos()
    total = after.sum()
    return {"sin": sin, "mul": mul, "add": after, "cos": cos, "sum_1": total, "add_1": cos + total}


@pytest.mark.parametrize("stage", ["optimized", "original"])
def test_dump_holds_inputs_and_every_op_output_of_each_dumped_replay(tmp_path, stage):
    reset_dynamo()
    compiled = torch.compile(_step, backend="graphex", fullgraph=True, options={
        "dump_tensor_data": True, "data_dump_stage": stage, "data_dump_dir": str(tmp_path), "data_dump_calls": 2})
    cache = torch.zeros(5)
    xs = [torch.randn(5) for _ in range(3)]
    expected = []
    with torch.no_grad():
        for x in xs:
            before = cache.clone()
            expected.append((before, _eager_values(x, before)))
            out = compiled(x, cache)
    ref = torch.zeros(5)
    for x in xs:
        ref_out = _step(x, ref)
    assert torch.equal(out, ref_out) and torch.equal(cache, ref)  # the replays themselves are untouched
    (graph,) = os.listdir(tmp_path)
    assert sorted(os.listdir(tmp_path / graph)) == ["call_0", "call_1"]  # bounded by data_dump_calls
    for k in range(2):
        got_stage, entries = read_call(str(tmp_path / graph / f"call_{k}"))
        assert got_stage == stage
        inputs = [v for kind, _, _, v in entries if kind == "input"]
        assert torch.equal(inputs[0], xs[k]) and torch.equal(inputs[1], expected[k][0])  # before the call
        ops = {node: v for kind, node, _, v in entries if kind == "op"}
        for node, want in expected[k][1].items():
            assert torch.equal(ops[node][0], want), (stage, k, node)
    if stage == "optimized":  # the engine's own program: the update was reinplaced into the input
        assert [t for kind, _, t, _ in entries if kind == "op"][2] == "aten::add_.Tensor"
    else:  # the functional graph from before graphex's passes
        assert "copy_" in ops


def test_plain_run_is_the_executor_itself_and_dumping_ends_after_data_dump_calls(tmp_path):
    reset_dynamo()
    compiled = torch.compile(_step, backend="graphex", fullgraph=True)
    with torch.no_grad():
        compiled(torch.randn(3), torch.zeros(3))
    plain = live_graphs()[-1]
    assert plain.runner is plain.executor  # option off: zero cost
    reset_dynamo()
    compiled = torch.compile(_step, backend="graphex", fullgraph=True, options={
        "dump_tensor_data": True, "data_dump_dir": str(tmp_path), "data_dump_calls": 1})
    with torch.no_grad():
        compiled(torch.randn(3), torch.zeros(3))
        dumped = live_graphs()[-1]
        compiled(torch.randn(3), torch.zeros(3))
    assert dumped.runner is dumped.executor


def test_bad_dump_options_are_refused():
    with pytest.raises(graphex.OptionsError, match="data_dump_stage"):
        graphex.Options.from_user({"data_dump_stage": "fused"})
    with pytest.raises(graphex.OptionsError, match="data_dump_calls"):
        graphex.Options.from_user({"data_dump_calls": 0})


def test_save_tensor_writes_on_every_replay(tmp_path):
    reset_dynamo()
    path = str(tmp_path / "h.pt")

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.sin(x) * 2
        graphex.save_tensor(h, path)
        return h.cos()

    compiled = torch.compile(fn, backend="graphex", fullgraph=True)
    with torch.no_grad():
        for i in range(3):
            x = torch.randn(4) + i
            out = compiled(x)
    graph = live_graphs()[-1]
    assert graph.executor is not None and graph.executor.run_count == 3  # all three replays ran on the engine
    assert torch.equal(torch.load(path), torch.sin(x) * 2)  # the last replay's value, as eager computes it
    assert torch.equal(out, (torch.sin(x) * 2).cos())
