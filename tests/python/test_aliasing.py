"""Note [One alias analysis] (graphex/passes/aliasing.py): the analysis reinplace, copy-back and fold share."""

from __future__ import annotations

import operator

import torch
import torch.fx

from graphex.lowering.fold import fold_constants
from graphex.passes.aliasing import root, written_nodes


def _graph(build) -> tuple[torch.fx.Graph, dict[str, torch.fx.Node]]:
    g = torch.fx.Graph()
    names: dict[str, torch.fx.Node] = {}
    build(g, names)
    return g, names


def test_an_item_of_a_view_names_its_base():
    def build(g, n):
        n["x"] = g.placeholder("x")
        n["parts"] = g.call_function(torch.ops.aten.split.Tensor, (n["x"], 2))
        n["part"] = g.call_function(operator.getitem, (n["parts"], 1))
        n["stats"] = g.call_function(torch.ops.aten.var_mean.correction, (n["x"],))
        n["mean"] = g.call_function(operator.getitem, (n["stats"], 1))
        g.output((n["part"], n["mean"]))

    _, n = _graph(build)
    assert root(n["part"]) is n["x"]  # split's items share x's memory
    assert root(n["mean"]) is n["mean"]  # var_mean's are new tensors


def test_an_out_op_names_the_tensor_it_writes():
    def build(g, n):
        n["a"], n["b"], n["c"] = g.placeholder("a"), g.placeholder("b"), g.placeholder("c")
        n["r"] = g.call_function(torch.ops.aten.add.out, (n["a"], n["b"]), {"out": n["c"]})
        g.output(n["r"])

    g, n = _graph(build)
    assert root(n["r"]) is n["c"]  # not `a`, its first argument
    assert written_nodes(g) == {n["c"], n["r"]}


def test_fold_leaves_a_buffer_written_through_an_item_of_its_split():
    """A buffer one op writes through `split(buf)[0]` is never folded: its value changes on every call."""
    def build(g, n):
        n["buf"], n["x"] = g.placeholder("buf"), g.placeholder("x")
        n["parts"] = g.call_function(torch.ops.aten.split.Tensor, (n["buf"], 2))
        n["head"] = g.call_function(operator.getitem, (n["parts"], 0))
        n["bumped"] = g.call_function(torch.ops.aten.add_.Tensor, (n["head"], n["x"]))
        n["doubled"] = g.call_function(torch.ops.aten.mul.Tensor, (n["buf"], 2))
        n["out"] = g.call_function(torch.ops.aten.add.Tensor, (n["doubled"], n["x"]))
        g.output(n["out"])

    g, n = _graph(build)
    buf = torch.ones(4)
    for node, value in (("buf", buf), ("x", torch.ones(2)), ("parts", list(buf.split(2))), ("head", buf[:2]),
                        ("bumped", buf[:2]), ("doubled", buf * 2), ("out", buf * 2)):
        n[node].meta["val"] = value
    assert n["buf"] in written_nodes(g)
    folded = fold_constants(torch.fx.GraphModule(torch.nn.Module(), g), {0: buf})
    assert n["doubled"] not in folded.nodes
