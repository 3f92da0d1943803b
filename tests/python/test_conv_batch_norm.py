"""Note [A convolution takes its batch norm and ReLU] (graphex/fusion/conv_bn.py): in fused mode a float32 2-d
convolution in channels_last order, the inference batch norm after it and a ReLU after that run as one
mkldnn::_convolution_pointwise with the batch norm folded into the weight and bias on every call; results within
fused mode's tolerance of eager's, strides eager's; a later write to the weight or the batch norm's tensors is read by
the next call. Declined: a convolution or batch norm result read elsewhere, other dtypes, the option off."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn as nn

from graphex import _C  # noqa: F401  (registers graphex_fused::*)

from conftest import fused_op_tol, newest_capture

FUSED = {"pattern_fusion_pass": True}
pointwise = torch.ops.mkldnn._convolution_pointwise.default
fold = torch.ops.graphex_fused.conv_batch_norm_fold.default

pytestmark = pytest.mark.skipif(not torch._C._has_mkldnn, reason="this torch build has no oneDNN")


def _run(model, *args, **options):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False, options=options)
    with torch.no_grad():
        got = compiled(*args)
        again = compiled(*args)  # the replay
    return compiled, got, again, newest_capture()


def _attrs(graph) -> list[str]:
    return [n.args[7] for n in graph.gm.graph.nodes if n.op == "call_function" and n.target is pointwise]


def _close(got: torch.Tensor, want: torch.Tensor, ops: int) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), \
        (got.stride(), want.stride())
    tol = ops * fused_op_tol(want.dtype) * 10
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


def _trained(bn: nn.BatchNorm2d, seed: int) -> nn.BatchNorm2d:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(bn.num_features, generator=g) * 0.1)
        bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
        if bn.affine:
            bn.weight.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
            bn.bias.copy_(torch.randn(bn.num_features, generator=g) * 0.1)
    return bn


class Block(nn.Module):
    def __init__(self, cin=8, cout=16, *, bias=False, affine=True, relu=True, groups=1, dilation=1, stride=1,
                 padding=1, kernel=3):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, dilation=dilation, groups=groups, bias=bias)
        self.bn = _trained(nn.BatchNorm2d(cout, affine=affine), 1)
        self.relu = relu
        self.head = nn.Conv2d(cout, 4, 1)  # a second convolution, so the region is channels_last throughout

    def forward(self, x):
        y = self.bn(self.conv(x))
        return self.head(torch.relu(y) if self.relu else y)


def test_the_conv_net_runs_each_convolution_with_its_batch_norm_and_relu():
    from bench.models import build_convnet

    net, x = build_convnet(8), torch.randn(2, 3, 32, 32)
    _, got, again, graph = _run(net, x, **FUSED)
    with torch.no_grad():
        want = net(x)
    # Note [A batch norm is folded where its pass costs more than the fold]: of the 13 convolutions, the four of the
    # last blocks whose weights outnumber their outputs (2304 > 2048, 4608 > 2 x 1024, 9216 > 1024) keep their batch
    # norms; of the nine that take theirs, the stem and four blocks' first convolutions take their ReLU too, the
    # others (an add comes first, or a 1x1 shortcut) do not
    assert graph.fused.get("conv_batch_norm") == 9, graph.fused
    assert sorted(_attrs(graph)) == ["none"] * 4 + ["relu"] * 5, _attrs(graph)
    targets = collections.Counter(n.target for n in graph.gm.graph.nodes if n.op == "call_function")
    assert targets[torch.ops.aten._native_batch_norm_legit_no_training.default] == 4
    assert targets[torch.ops.aten.convolution.default] == 4
    _close(got, want, 13 * 3)
    assert torch.equal(got, again)


@pytest.mark.parametrize("kwargs", [
    {}, {"bias": True}, {"affine": False}, {"relu": False}, {"groups": 2}, {"groups": 8, "cout": 8},
    {"dilation": 2, "padding": 2}, {"stride": 2, "padding": 0}, {"kernel": 1, "padding": 0}, {"kernel": 5, "padding": 2},
], ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "plain")
def test_each_convolution_and_batch_norm_spelling_matches_eager(kwargs):
    model, x = Block(**kwargs).eval(), torch.randn(2, 8, 12, 12)
    _, got, again, graph = _run(model, x, **FUSED)
    with torch.no_grad():
        want = model(x)
    assert graph.fused.get("conv_batch_norm") == 1, graph.fused
    assert _attrs(graph) == ["relu" if kwargs.get("relu", True) else "none"], _attrs(graph)
    _close(got, want, 4)
    assert torch.equal(got, again)


def test_a_later_write_to_the_weight_or_the_statistics_is_read_by_the_next_call():
    """The folded weight is computed on every call: never stale, whatever writes the tensors (in place, through
    `.data`, load_state_dict), with frozen_parameter too."""
    for options in (FUSED, {**FUSED, "frozen_parameter": True}):
        model, x = Block(bias=True).eval(), torch.randn(1, 8, 10, 10)
        compiled, got, _, graph = _run(model, x, **options)
        assert graph.fused.get("conv_batch_norm") == 1, graph.fused
        with torch.no_grad():
            model.conv.weight.mul_(-1.5)
            model.bn.running_var.data.add_(2.0)
            model.bn.running_mean.fill_(0.25)
            model.load_state_dict({**model.state_dict(), "bn.bias": torch.full((16,), 3.0),
                                   "conv.bias": torch.linspace(-1, 1, 16)})
            got = compiled(x)
            want = model(x)
        _close(got, want, 4)


@pytest.mark.parametrize("case", ["conv_read_twice", "bn_read_twice", "float64", "bfloat16", "option_off",
                                  "exact_mode", "nchw_only", "weight_outnumbers_output"])
def test_a_near_miss_keeps_eagers_kernels(case):
    class ReadTwice(nn.Module):
        def __init__(self, what):
            super().__init__()
            self.block, self.what = Block(), what

        def forward(self, x):
            c = self.block.conv(x)
            y = self.block.bn(c)
            extra = c if self.what == "conv" else y
            return self.block.head(torch.relu(y)) , extra.sum()

    class OneConv(nn.Module):  # one convolution of a contiguous input: nothing to put in channels_last order before it
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(8, 8, 3, padding=1, bias=False), _trained(nn.BatchNorm2d(8), 2)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    dtype = {"float64": torch.float64, "bfloat16": torch.bfloat16}.get(case, torch.float32)
    model = {"conv_read_twice": lambda: ReadTwice("conv"), "bn_read_twice": lambda: ReadTwice("bn"),
             "nchw_only": OneConv,
             # 64 x 64 x 3 x 3 weights against a 64 x 4 x 4 output (x 2 with the ReLU): the fold would cost more
             "weight_outnumbers_output": lambda: Block(64, 64)}.get(case, Block)().eval().to(dtype)
    options = {"option_off": {**FUSED, "conv_batch_norm": False}, "exact_mode": {}}.get(case, FUSED)
    x = torch.randn(1, 64, 4, 4, dtype=dtype) if case == "weight_outnumbers_output" else \
        torch.randn(1, 8, 10, 10, dtype=dtype)
    _, got, _, graph = _run(model, x, **options)
    with torch.no_grad():
        want = model(x)
    if case == "bn_read_twice":  # the ReLU is not the batch norm's only reader: the convolution takes the norm alone
        assert _attrs(graph) == ["none"], _attrs(graph)
    elif case == "nchw_only":  # channels_last_conv makes its input channels_last first: it applies
        assert _attrs(graph) == ["relu"], _attrs(graph)
    else:
        assert "conv_batch_norm" not in graph.fused and not _attrs(graph), (graph.fused, _attrs(graph))
    for g, w in zip(*(t if isinstance(t, tuple) else (t,) for t in (got, want))):
        if case == "exact_mode":
            assert torch.equal(g, w)
        else:
            _close(g, w, 40)


@pytest.mark.default_isa  # the fold's row kernel is built per CPU capability: bit for bit on each
def test_the_folded_weight_is_the_weight_times_the_batch_norms_factor_bit_for_bit():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(24, 6, 3, 3, generator=g)
    b = torch.randn(24, generator=g)
    bn_w, bn_b = torch.rand(24, generator=g) + 0.5, torch.randn(24, generator=g)
    mean, var = torch.randn(24, generator=g), torch.rand(24, generator=g) + 0.1
    scale_shift = torch.ops.graphex_fused.batch_norm_scale_shift.default
    for args in ((bn_w, bn_b), (None, None)):
        scale = scale_shift(*args, mean, var, 1e-3, 5, 0)
        assert torch.equal(fold(w, b, *args, mean, var, 1e-3, 0), w * scale)
        scale1, shift1 = scale_shift(*args, mean, var, 1e-3, 2, 0), scale_shift(*args, mean, var, 1e-3, 2, 1)
        torch.testing.assert_close(fold(w, b, *args, mean, var, 1e-3, 1), b * scale1 + shift1, rtol=2e-7, atol=1e-7)
        assert torch.equal(fold(w, None, *args, mean, var, 1e-3, 1), shift1)
    # a non-contiguous weight and statistics read as views
    wt = torch.randn(6, 24, 3, 3, generator=g).transpose(0, 1)
    assert torch.equal(fold(wt, None, bn_w, bn_b, mean, var, 1e-3, 0),
                       wt * scale_shift(bn_w, bn_b, mean, var, 1e-3, 5, 0))
    with pytest.raises(RuntimeError, match="running_mean must have shape"):
        fold(w, None, bn_w, bn_b, mean[:8], var, 1e-3, 0)
    with pytest.raises(RuntimeError, match="float32"):
        fold(w.double(), None, bn_w, bn_b, mean, var, 1e-3, 0)


def test_graphex_run_runs_a_conv_net_with_its_batch_norms_folded(tmp_path):
    """The exported fused program calls mkldnn::_convolution_pointwise and graphex_fused::conv_batch_norm_fold from
    C++ alone: the Python engine's result, bit for bit."""
    import os
    import subprocess

    import graphex
    from graphex.exporting import load_safetensors, safetensors_bytes

    from conftest import ROOT
    from bench.models import build_convnet

    runner = os.path.join(os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py"), "graphex-run")
    assert os.path.exists(runner), "graphex-run is not built: make build"
    net, x = build_convnet(8), torch.randn(1, 3, 32, 32)
    path = graphex.export(net, (x,), tmp_path / "convnet.graphex", options=FUSED)
    program = open(os.path.join(path, "program.gxp"), "rb").read().decode("latin-1")
    assert "_convolution_pointwise" in program and "conv_batch_norm_fold" in program
    (tmp_path / "in.safetensors").write_bytes(safetensors_bytes({"0": x}))
    proc = subprocess.run([runner, path, "--inputs", str(tmp_path / "in.safetensors"),
                           "--output", str(tmp_path / "out.safetensors")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _, in_python, _, _ = _run(net, x, **FUSED)
    got = load_safetensors(tmp_path / "out.safetensors")["0"]
    assert torch.equal(got, in_python)
    with torch.no_grad():
        _close(got, net(x), 13 * 3)
