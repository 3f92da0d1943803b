"""Note [An inference batch norm is a multiply and an add]: in fused mode (option pointwise_fusion), an inference batch
norm whose saved statistics nothing reads becomes graphex_fused::batch_norm_scale_shift per channel and a multiply
and an add that the element-wise chains fuse with the ReLU or residual add around them; within fused mode's
tolerance of eager, NaN and inf where eager has them; every other form (training mode, channels_last, float64, a read
of the statistics, exact mode) keeps eager's kernel, bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import graphex  # noqa: F401
import graphex._C  # noqa: F401  (graphex_fused::*)

from conftest import assert_same, fused_op_tol, newest_capture

FUSED = {"pattern_fusion_pass": True}
scale_shift = torch.ops.graphex_fused.batch_norm_scale_shift.default


def _run(fn, *args, **options):
    """fn compiled by graphex (fused unless options say otherwise), called once under no_grad: (result, graph)."""
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend="graphex", fullgraph=True, dynamic=False, options={**FUSED, **options})(*args)
    return got, newest_capture()


def _calls(graph, target) -> int:
    return sum(1 for n in graph.gm.graph.nodes if n.op == "call_function" and n.target is target)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    g, w = got.double(), want.double()
    assert bool((torch.isnan(g) == torch.isnan(w)).all()), "NaN where eager has none, or none where eager has one"
    g, w = g.nan_to_num(0.0, 1e300, -1e300), w.nan_to_num(0.0, 1e300, -1e300)
    err = (g - w).abs()
    assert not bool((err > tol * (1 + w.abs())).any()), f"max |fused - eager| {err.max().item()} over tol {tol}"


def _bn(kind, channels: int, affine: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    bn = kind(channels, affine=affine)
    with torch.no_grad():  # trained-looking statistics, not the identity
        bn.running_mean.copy_(torch.randn(channels, generator=g))
        bn.running_var.copy_(torch.rand(channels, generator=g) * 3 + 0.01)
        if affine:
            bn.weight.copy_(torch.randn(channels, generator=g))
            bn.bias.copy_(torch.randn(channels, generator=g))
    return bn.eval()


class _Block(nn.Module):
    """A residual block's tail: batch norm, the residual add, ReLU."""

    def __init__(self, bn: nn.Module) -> None:
        super().__init__()
        self.bn = bn

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(x) + r)


SHAPES = [  # (module, input shape)
    (nn.BatchNorm2d, (2, 8, 7, 9)),
    (nn.BatchNorm2d, (1, 3, 1, 1)),
    (nn.BatchNorm1d, (5, 12)),  # [N, C]: the channel is the last dim
    (nn.BatchNorm1d, (3, 6, 17)),
    (nn.BatchNorm3d, (1, 4, 3, 5, 6)),
    (nn.BatchNorm2d, (1, 16, 64, 70)),  # several tiles
]


@pytest.mark.parametrize("affine", (True, False), ids=("affine", "no_affine"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("kind,shape", SHAPES, ids=[f"{k.__name__}{list(s)}" for k, s in SHAPES])
def test_a_batch_norm_runs_in_the_chain_around_it(kind, shape, dtype, affine):
    block = _Block(_bn(kind, shape[1], affine)).to(dtype)
    x, r = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    got, graph = _run(block, x, r)
    assert graph.fused.get("batch_norm") == 1 and graph.fused.get("pointwise") == 1, graph.fused
    assert _calls(graph, torch.ops.aten._native_batch_norm_legit_no_training.default) == 0
    with torch.no_grad():
        want = block(x, r)
    # one norm (its two roundings may differ from eager's FMA by one), the add and the ReLU: each op's tolerance
    _close(got, want, 2 * fused_op_tol(dtype))


def test_a_bfloat16_input_with_float32_parameters():  # eager's mixed-dtype batch norm, a bfloat16 result
    bn = _bn(nn.BatchNorm2d, 6)
    x, r = torch.randn(2, 6, 5, 7).bfloat16(), torch.randn(2, 6, 5, 7).bfloat16()
    got, graph = _run(lambda t, s: torch.relu(bn(t) + s), x, r)
    assert graph.fused.get("batch_norm") == 1
    with torch.no_grad():
        want = torch.relu(bn(x) + r)
    _close(got, want, 2 * fused_op_tol(torch.bfloat16))


def test_the_conv_net_runs_its_batch_norms_in_chains():
    from bench.models import build_convnet

    net = build_convnet(8)
    x = torch.randn(2, 3, 32, 32)
    # in channels_last order (the default, Note [A conv net runs channels_last between its convolutions]) the batch
    # norms keep eager's kernel: the chains write contiguous memory
    got, graph = _run(net, x, channels_last_conv=False)
    batch_norms = sum(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    assert graph.fused.get("batch_norm") == batch_norms, graph.fused
    assert graph.fused.get("pointwise", 0) >= 1
    with torch.no_grad():
        want = net(x)
    # thirteen layers, each within a rounding or two of eager's
    _close(got, want, 1e-4)


def test_edges_give_eagers_nan_and_inf():
    bn = _bn(nn.BatchNorm2d, 6)
    with torch.no_grad():
        bn.running_var.copy_(torch.tensor([0.0, -bn.eps, 1.0, float("inf"), float("nan"), 2.0]))
        bn.weight.copy_(torch.tensor([1.0, 2.0, float("inf"), 1.0, 1.0, 0.0]))
    x = torch.randn(2, 6, 3, 4)
    x[0, 5, 0, 0] = float("inf")  # 0 * inf
    x[1, 2, 1, 1] = 0.0  # inf weight times a zero
    x[1, 0, 2, 2] = float("nan")
    got, graph = _run(lambda t: torch.relu(bn(t)), x)
    assert graph.fused.get("batch_norm") == 1
    with torch.no_grad():
        want = torch.relu(bn(x))
    assert bool(torch.isnan(want).any()) and bool(torch.isinf(want).any())  # the edges are in the test
    _close(got, want, 2 * fused_op_tol(torch.float32))


def _input_channels_last(bn):
    return lambda t: torch.relu(bn(t.contiguous(memory_format=torch.channels_last)))


NOT_FIRED = [  # (name, function of x, input dtype): each keeps eager's kernel, bit for bit
    ("channels_last", _input_channels_last, torch.float32),
    ("float64", lambda bn: (lambda m: lambda t: torch.relu(m(t)))(bn.double()), torch.float64),
]


@pytest.mark.parametrize("name,make,dtype", NOT_FIRED, ids=[n for n, _, _ in NOT_FIRED])
def test_other_forms_keep_eagers_kernel(name, make, dtype):
    fn = make(_bn(nn.BatchNorm2d, 5))
    x = torch.randn(2, 5, 6, 7, dtype=dtype)
    got, graph = _run(fn, x)
    assert "batch_norm" not in graph.fused, graph.fused
    with torch.no_grad():
        assert_same(got, fn(x))


def test_training_mode_and_exact_mode_keep_eagers_kernel():
    bn = _bn(nn.BatchNorm2d, 4)
    x = torch.randn(3, 4, 5, 5)
    got, graph = _run(bn, x, pattern_fusion_pass=False)  # exact mode: bit for bit
    assert graph.fused == {}
    with torch.no_grad():
        assert_same(got, bn(x))
    bn.train()
    mean, var = bn.running_mean.clone(), bn.running_var.clone()
    got, graph = _run(bn, x)
    assert "batch_norm" not in graph.fused
    ref = _bn(nn.BatchNorm2d, 4).train()  # the same statistics before this call
    with torch.no_grad():
        want = ref(x)
    assert_same(got, want)
    assert_same(bn.running_mean, ref.running_mean) and not torch.equal(bn.running_mean, mean)
    assert_same(bn.running_var, ref.running_var) and not torch.equal(bn.running_var, var)


def test_a_read_of_the_saved_statistics_keeps_eagers_kernel():
    bn = _bn(nn.BatchNorm2d, 4)
    x = torch.randn(2, 4, 3, 3)

    def fn(t):
        out, save_mean, save_invstd = torch.ops.aten._native_batch_norm_legit_no_training(
            t, bn.weight, bn.bias, bn.running_mean, bn.running_var, 0.1, 1e-5)
        return out.relu(), save_mean, save_invstd

    got, graph = _run(fn, x)
    assert "batch_norm" not in graph.fused
    with torch.no_grad():
        assert_same(got, fn(x))


def test_frozen_parameters_fold_the_per_channel_terms_and_see_a_change():
    block = _Block(_bn(nn.BatchNorm2d, 8))
    x, r = torch.randn(2, 8, 5, 5), torch.randn(2, 8, 5, 5)
    got, graph = _run(block, x, r)
    assert _calls(graph, scale_shift) == 2 and graph.lowered.folded_ops == 0  # computed per call
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="graphex", fullgraph=True, dynamic=False,
                             options={**FUSED, "frozen_parameter": True})
    with torch.no_grad():
        got_frozen = compiled(x, r)
    graph = newest_capture()
    assert graph.fused.get("batch_norm") == 1 and graph.lowered.folded_ops == 2  # computed once, at lowering
    assert_same(got_frozen, got)
    with torch.no_grad():  # Note [Folding frozen parameters]: a write into a statistic is seen, the terms refolded
        block.bn.running_var.mul_(4.0)
        block.bn.weight.data[3] = -2.0
        want = block(x, r)
        _close(compiled(x, r), want, 2 * fused_op_tol(torch.float32))
        assert not torch.allclose(want, got)


def test_the_scale_and_shift_are_eagers_terms():
    g = torch.Generator().manual_seed(3)
    c = 7
    w, b, mean = (torch.randn(c, generator=g) for _ in range(3))
    var = torch.rand(c, generator=g) + 0.1
    scale = scale_shift(w, b, mean, var, 1e-5, 4, 0)
    shift = scale_shift(w, b, mean, var, 1e-5, 4, 1)
    assert scale.shape == shift.shape == (c, 1, 1) and scale.dtype == torch.float32
    torch.testing.assert_close(scale.view(-1), w / torch.sqrt(var + 1e-5), rtol=2e-7, atol=0)
    torch.testing.assert_close(shift.view(-1), b - mean * scale.view(-1), rtol=2e-7, atol=1e-7)
    assert scale_shift(None, None, mean, var, 0.5, 2, 0).shape == (c,)
    assert torch.equal(scale_shift(None, None, mean, var, 0.5, 2, 1), -mean * scale_shift(None, None, mean, var, 0.5,
                                                                                          2, 0))
    half = scale_shift(w.bfloat16(), b.bfloat16(), mean.bfloat16(), var.bfloat16(), 1e-5, 3, 0)
    assert half.dtype == torch.float32 and half.shape == (c, 1)
    meta = scale_shift(None, None, mean.to("meta"), var.to("meta"), 1e-5, 5, 1)
    assert meta.device.type == "meta" and meta.shape == (c, 1, 1, 1)


@pytest.mark.parametrize("x_dtype,params", [
    (torch.bfloat16, dict(weight=torch.bfloat16, bias=torch.bfloat16, running_mean=torch.float32,
                          running_var=torch.float32)),
    (torch.float16, dict(weight=torch.bfloat16, bias=torch.float32, running_mean=torch.float32,
                         running_var=torch.float32)),
    (torch.bfloat16, dict(weight=torch.float32, bias=torch.float32, running_mean=torch.float16,
                          running_var=torch.float16)),
], ids=["bf16_params_f32_stats", "f16_input_bf16_weight", "bf16_input_f16_stats"])
def test_parameter_dtypes_eager_refuses_raise_as_in_eager(x_dtype, params):
    """A helper's find: a mix of parameter dtypes ATen's CPU batch norm refuses (it takes the input's dtype, or
    float32 for a bfloat16/float16 input, all alike) returned a value in fused mode where eager raises."""
    bn = _bn(nn.BatchNorm2d, 4)
    for name, dtype in params.items():
        getattr(bn, name).data = getattr(bn, name).data.to(dtype)
    x = torch.randn(2, 4, 5, 6).to(x_dtype)
    with torch.no_grad(), pytest.raises(RuntimeError) as eager:
        bn(x)
    with pytest.raises(RuntimeError) as fused:
        _run(lambda t: torch.relu(bn(t) + t), x)
    assert str(eager.value).splitlines()[0].rstrip(".") in str(fused.value), fused.value


@pytest.mark.parametrize("bad,message", [
    (dict(weight=torch.ones(3)), "weight must have shape \\[7\\]"),
    (dict(running_var=torch.ones(7, 1)), "running_var must have shape \\[7\\]"),
    (dict(bias=torch.ones(7, dtype=torch.float64)), "bias must be float32, bfloat16 or float16"),
    (dict(dims=1), "rank must be at least 2"),
    (dict(which=2), "which must be 0 \\(scale\\) or 1 \\(shift\\)"),
])
def test_a_wrong_argument_is_named(bad, message):
    args = dict(weight=None, bias=None, running_mean=torch.zeros(7), running_var=torch.ones(7), eps=1e-5, dims=4,
                which=0)
    args.update(bad)
    with pytest.raises(RuntimeError, match=message):
        scale_shift(*args.values())
