"""Note [A frozen convolution weight is prepacked once] (graphex/lowering/prepack.py): in fused mode with
frozen_parameter, a channels_last float32 convolution on a frozen weight larger than 1x1 runs on the weight reordered
once for oneDNN, within fused mode's tolerance of eager; the weight is watched by contents, so every way of writing
it is seen on the next call (never a stale reordered weight); and nothing changes where the rule does not apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from graphex import _C
from graphex.lowering.prepack import CONVOLUTION_ON_PACKED

from conftest import fused_op_tol, newest_capture

FUSED_FROZEN = {"pattern_fusion_pass": True, "frozen_parameter": True}


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def _compile(model: nn.Module, **options):
    torch._dynamo.reset()
    return torch.compile(model, backend="graphex", fullgraph=True, dynamic=False, options={**FUSED_FROZEN, **options})


def _packed(graph) -> int:
    """How many of the lowered program's calls run on a reordered weight."""
    return sum(1 for op in graph.lowered.node_ops if op is CONVOLUTION_ON_PACKED)


def _close(got: torch.Tensor, want: torch.Tensor, ops: int = 1) -> None:
    assert got.shape == want.shape and got.stride() == want.stride(), (got.stride(), want.stride())
    tol = ops * fused_op_tol(torch.float32) * 10
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, equal_nan=True)


def _net():
    from bench.models import build_convnet

    return build_convnet(8)


def test_the_conv_nets_3x3_convolutions_read_reordered_weights_and_match_eager():
    net, x = _net(), torch.randn(2, 3, 32, 32)
    compiled = _compile(net)
    got, again = compiled(x), compiled(x)
    graph = newest_capture()
    assert _packed(graph) == 11, graph.lowered.node_ops  # 13 convolutions, of which two 1x1 shortcuts keep ATen's
    _close(got, net(x), ops=13)
    assert torch.equal(got, again)
    # each reordered weight's parameter is watched by its bytes
    contents = [i for i, level in graph.lowered.frozen_watch.items() if level == _C.WATCH_CONTENTS]
    assert len(contents) == 11


class Conv(nn.Module):
    def __init__(self, cin=8, cout=16, k=3, stride=1, padding=1, dilation=1, groups=1, bias=True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, padding, dilation, groups, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def _write_in_place(m: Conv) -> None:
    m.conv.weight.mul_(-2)


def _write_through_data(m: Conv) -> None:
    m.conv.weight.data.copy_(torch.randn(m.conv.weight.shape))


def _write_a_view(m: Conv) -> None:
    m.conv.weight[0, 0].fill_(3.0)


def _assign_data(m: Conv) -> None:
    m.conv.weight.data = torch.randn(m.conv.weight.shape)


def _replace_parameter(m: Conv) -> None:
    m.conv.weight = nn.Parameter(torch.randn(m.conv.weight.shape))


def _load_state_dict(m: Conv) -> None:
    m.load_state_dict({"conv.weight": torch.randn(m.conv.weight.shape), "conv.bias": m.conv.bias.clone()})


def _write_the_bias(m: Conv) -> None:
    m.conv.bias.add_(5.0)  # read live on every call: nothing to re-lower


@pytest.mark.parametrize("write", [_write_in_place, _write_through_data, _write_a_view, _assign_data,
                                   _replace_parameter, _load_state_dict, _write_the_bias],
                         ids=lambda w: w.__name__.lstrip("_"))
def test_every_write_into_a_reordered_weight_is_seen_on_the_next_call(write):
    torch.manual_seed(1)
    m, x = Conv().eval(), torch.randn(1, 8, 12, 12)
    compiled = _compile(m)
    _close(compiled(x), m(x))
    graph = newest_capture()
    assert _packed(graph) == 1
    write(m)
    _close(compiled(x), m(x))  # the new weight, never the reordered copy of the old one
    assert graph.relowerings == (0 if write is _write_the_bias else 1)
    _close(compiled(x), m(x))
    assert _packed(graph) == 1  # the re-lowered program reorders the new weight


@pytest.mark.parametrize("shape", [
    dict(k=3, stride=2, padding=0), dict(k=5, padding=2, dilation=2), dict(k=(3, 1), padding=(1, 0)),
    dict(groups=2), dict(cin=8, cout=8, groups=8), dict(bias=False), dict(k=7, stride=3, padding=3),
], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_convolution_shapes_match_eager(shape):
    torch.manual_seed(2)
    m, x = Conv(**shape).eval(), torch.randn(2, 8, 15, 13)
    compiled = _compile(m)
    got = compiled(x)
    assert _packed(newest_capture()) == 1
    _close(got, m(x))


def test_nan_and_inf_in_input_and_weight_stay_eagers():
    torch.manual_seed(3)
    m, x = Conv().eval(), torch.randn(1, 8, 10, 10)
    x[0, 1, 4, 4] = float("nan")
    x[0, 2, 7, 1] = float("inf")
    m.conv.weight[3, 0, 1, 1] = float("-inf")
    want = m(x)
    assert want.isnan().any() and want.isinf().any()
    compiled = _compile(m)
    got = compiled(x)
    assert _packed(newest_capture()) == 1
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    _close(got, want)


def test_another_thread_count_after_lowering_still_matches():
    torch.manual_seed(4)
    threads = torch.get_num_threads()
    m, x = Conv(16, 32).eval(), torch.randn(1, 16, 20, 20)
    try:
        torch.set_num_threads(1)
        compiled = _compile(m)
        _close(compiled(x), m(x))
        torch.set_num_threads(2)
        _close(compiled(x), m(x))
    finally:
        torch.set_num_threads(threads)


class Writes(nn.Module):
    """A forward that writes its own convolution weight: never reordered ahead of the write."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.conv.weight.mul_(0.5)
        return self.conv(x)


def test_a_weight_the_graph_writes_is_not_reordered():
    torch.manual_seed(5)
    m, x = Writes().eval(), torch.randn(1, 4, 8, 8)
    ref = Writes().eval()
    ref.load_state_dict(m.state_dict())
    compiled = _compile(m)
    for _ in range(3):
        _close(compiled(x), ref(x))
    assert _packed(newest_capture()) == 0


@pytest.mark.parametrize("options", [{"frozen_parameter": False}, {"prepack_conv_weights": False},
                                     {"channels_last_conv": False}, {"pattern_fusion_pass": False}],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_nothing_is_reordered_without_fused_mode_frozen_weights_and_channels_last(options):
    torch.manual_seed(6)
    m, x = Conv().eval(), torch.randn(1, 8, 12, 12)
    compiled = _compile(m, **options)
    got = compiled(x)
    graph = newest_capture()
    assert graph.lowered is None or _packed(graph) == 0
    if options.get("pattern_fusion_pass") is False:
        assert torch.equal(got, m(x))  # exact mode: bit for bit
    else:
        _close(got, m(x))


def test_float64_and_a_1x1_kernel_keep_atens_convolution():
    torch.manual_seed(7)
    for m, x in ((Conv(k=1, padding=0).eval(), torch.randn(1, 8, 12, 12)),
                 (Conv().double().eval(), torch.randn(1, 8, 12, 12, dtype=torch.float64))):
        compiled = _compile(m)
        got = compiled(x)
        assert _packed(newest_capture()) == 0
        torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-5)


class SlicedBias(nn.Module):
    """A convolution whose bias is a view of a parameter (a helper's find: the packed call reads its bias dense)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.w = nn.Parameter(torch.randn(16, 8, 3, 3) * 0.1)
        self.ball = nn.Parameter(torch.randn(32))
        self.b2 = nn.Parameter(torch.randn(16, 2))
        self.b1 = nn.Parameter(torch.randn(1))

    def forward(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        bias = {"strided": self.ball[::2], "column": self.b2[:, 1], "expand": self.b1.expand(16), "offset": self.ball[16:],
                "argument": b}[self.how]
        return torch.relu(torch.nn.functional.conv2d(x, self.w, bias, padding=1))


@pytest.mark.parametrize("how", ["strided", "column", "expand", "offset", "argument"])
def test_a_bias_that_is_not_dense_keeps_atens_convolution(how):
    torch.manual_seed(8)
    m, x = SlicedBias(how).eval(), torch.randn(2, 8, 7, 7)
    b = torch.randn(32)[::2]  # a strided argument
    compiled = _compile(m)
    _close(compiled(x, b), m(x, b))
    assert _packed(newest_capture()) == (1 if how == "offset" else 0)  # an offset slice is dense


@pytest.mark.parametrize("guards", ["dynamo's", "none"])
def test_a_frozen_bias_given_another_layout_is_seen(guards):
    torch.manual_seed(9)
    m, x = Conv().eval(), torch.randn(1, 8, 12, 12)
    # without Dynamo's guards, graphex's own watch on the frozen bias is all that sees the change
    options = {"guard_filter_fn": torch.compiler.skip_all_guards_unsafe} if guards == "none" else {}
    compiled = _compile(m, **options)
    _close(compiled(x), m(x))
    graph = newest_capture()
    assert _packed(graph) == 1
    m.conv.bias.data = torch.randn(32)[::2]  # the same parameter object, now strided
    _close(compiled(x), m(x))
    if guards == "none":
        assert graph.relowerings == 1  # seen by the engine: re-lowered
    assert _packed(newest_capture()) == 0  # the strided bias keeps ATen's call (re-lowered, or compiled again)
