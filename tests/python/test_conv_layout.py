"""Note [A conv net runs channels_last between its convolutions] (graphex/fusion/conv_layout.py): in fused mode the
activations of 2-d convolutions and of the ops between them run in channels_last order; every reader outside that
region (a view, an as_strided, a graph output) sees its original contiguous layout; results within fused mode's
tolerance of eager's, strides eager's. Declined: exact mode, the option off, an input already channels_last, float64,
a training graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import graphex
from graphex import _C

from conftest import fused_op_tol, newest_capture

FUSED = {"pattern_fusion_pass": True}
clone = torch.ops.aten.clone.default


def _run(model, *args, grad: bool = False, **options):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False, options=options)
    with torch.set_grad_enabled(grad):
        got = compiled(*args)
        again = compiled(*args)  # the replay
    return got, again, newest_capture()


def _clones(graph) -> list[torch.fx.Node]:
    return [n for n in graph.gm.graph.nodes if n.op == "call_function" and n.target is clone]


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), \
        (got.stride(), want.stride())
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


def _net(dtype=torch.float32):
    from bench.models import build_convnet

    return build_convnet(8).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_conv_net_runs_channels_last_between_its_convolutions(dtype):
    net, x = _net(dtype), torch.randn(2, 3, 32, 32).to(dtype)
    got, again, graph = _run(net, x, **FUSED)
    with torch.no_grad():
        want = net(x)
    assert graph.fused.get("channels_last_conv") == 13, graph.fused
    # one copy in (the image) and none out: the region spans the whole trunk, to the average pool (a mean over
    # height and width), whose [N, C, 1, 1] result has eager's strides in either order
    formats = sorted(str(n.kwargs["memory_format"]) for n in _clones(graph))
    assert formats == ["torch.channels_last"], formats
    tol = 13 * fused_op_tol(dtype) * 10
    _close(got, want, tol)
    assert torch.equal(got, again)


class _Trunk(nn.Module):
    """conv -> batch norm -> relu -> conv, then `read` of the feature map (a reader outside the region)."""

    def __init__(self, read):
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3, padding=1)
        self.read = read

    def forward(self, x):
        return self.read(self.c2(torch.relu(self.bn(self.c1(x)))))


READERS = {
    "the_feature_map_itself": lambda y: y,
    "as_strided": lambda y: y.as_strided((8, 5), (7, 3), 2),  # reads memory by its own strides
    "flatten": lambda y: y.flatten(1),
    "view": lambda y: y.view(2, 8, -1).sum(-1),
    "permute_contiguous": lambda y: y.permute(0, 2, 3, 1).contiguous(),
    "two_readers": lambda y: (y + 1, y.transpose(2, 3)),
}


@pytest.mark.parametrize("name", READERS)
def test_a_reader_outside_the_region_sees_the_original_layout(name):
    """as_strided is the sharp case: on a channels_last value it would read other elements (not a rounding away)."""
    model = _Trunk(READERS[name]).eval()
    x = torch.randn(2, 3, 10, 10)
    got, again, graph = _run(model, x, **FUSED)
    with torch.no_grad():
        want = model(x)
    assert graph.fused.get("channels_last_conv") == 2, graph.fused
    got, again, want = ((t,) if isinstance(t, torch.Tensor) else t for t in (got, again, want))
    for g, a, w in zip(got, again, want):
        _close(g, w, 1e-4)
        assert torch.equal(g, a)


class _Input(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


@pytest.mark.parametrize("case", ["exact_mode", "option_off", "input_already_channels_last", "float64",
                                  "a_training_graph"])
def test_other_cases_keep_eagers_layout_and_kernels_bit_for_bit(case):
    model, x, options, grad = _Input(), torch.randn(2, 3, 9, 9), dict(FUSED), False
    if case == "exact_mode":
        options = {}
    elif case == "option_off":
        options["channels_last_conv"] = False
    elif case == "input_already_channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif case == "float64":
        model, x = model.double(), x.double()
    else:
        model, grad = _Trunk(lambda y: y), True  # in training mode: its activations are saved for the backward
    got, _, graph = _run(model, x, grad=grad, **options)
    with torch.set_grad_enabled(grad):
        want = model(x)
    assert "channels_last_conv" not in graph.fused, graph.fused
    assert not [n for n in _clones(graph) if n.kwargs.get("memory_format") == torch.channels_last]
    if case == "a_training_graph":
        got.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        want.sum().backward()
        for g, w in zip(grads, (p.grad for p in model.parameters())):
            torch.testing.assert_close(g, w)
        torch.testing.assert_close(got, want)
    else:
        assert torch.equal(got, want) and got.stride() == want.stride()


def test_an_exported_conv_net_runs_channels_last_in_the_cpp_runtime(tmp_path):
    """The copies into and out of channels_last order are ordinary clones with a memory_format: the program format
    holds them, and graphex::Module gives the Python replay's bits."""
    net, x = _net(), torch.randn(1, 3, 32, 32)
    path = graphex.export(net, (x,), tmp_path / "convnet.graphex", options=FUSED)
    (got,) = _C.Module(str(path))([x])
    torch._dynamo.reset()
    with torch.no_grad():
        replay = torch.compile(net, backend="graphex", fullgraph=True, dynamic=False, options=FUSED)(x)
        want = net(x)
    assert newest_capture().fused.get("channels_last_conv") == 13
    assert torch.equal(got, replay)
    _close(got, want, 1e-3)
