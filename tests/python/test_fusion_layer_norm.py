"""Fused mode's add + LayerNorm (graphex_fused::add_layer_norm, csrc/fused/layer_norm.cpp; the patterns in
graphex/fusion/patterns.py): the residual add and the LayerNorm after it in one pass, as GPT-2, GPT-NeoX, Falcon,
Bloom and BERT write them.

- The kernel against eager (add, then F.layer_norm) in every fused dtype, with and without weight and bias, rows of
  every length class (the vector body, its tail, one element): the sum bitwise (eager's add rounds as the kernel
  does), the norm within the per-op tolerance; against float64, never further from the exact value than eager plus
  the tolerance, also on rows whose mean is far from 0 (where eager's own float32 error grows).
- The pattern fires on the spellings models use and returns the sum too; near misses stay eager's: an add with
  alpha, a norm over two dimensions, a residual that broadcasts, a weight of another dtype.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from conftest import compile_graphex, fused_op_tol, fused_ops, newest_capture

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
fused = torch.ops.graphex_fused


def _eager(x, r, w, b, eps):
    h = x + r
    return h, F.layer_norm(h, (h.shape[-1],), w, b, eps)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine", ["weight_bias", "weight", "none"])
@pytest.mark.parametrize("n", [1, 7, 31, 64, 768, 1000])
def test_add_layer_norm_kernel_is_close_to_eager(dtype, affine, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, 5, n, generator=g).to(dtype)
    r = torch.randn(3, 5, n, generator=g).to(dtype)
    w = (torch.rand(n, generator=g) + 0.5).to(dtype) if affine != "none" else None
    b = torch.randn(n, generator=g).to(dtype) if affine == "weight_bias" else None
    h, y = fused.add_layer_norm(x, r, w, b, 1e-5)
    h_ref, y_ref = _eager(x, r, w, b, 1e-5)
    assert torch.equal(h, h_ref), "the sum is eager's add"
    tol = fused_op_tol(dtype)
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mean", [0.0, 30.0, 1000.0])
def test_add_layer_norm_is_as_exact_as_eager(dtype, mean):
    """Against float64: the fused norm is at most eager's own error plus the per-op tolerance from the exact value,
    also where the row's mean is far from 0 and eager's float32 error grows with |mean| / std."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(4, 768, generator=g) + mean).to(dtype)
    r = (torch.randn(4, 768, generator=g) * 0.1).to(dtype)
    w, b = torch.rand(768, generator=g).to(dtype) + 0.5, torch.randn(768, generator=g).to(dtype)
    h, y = fused.add_layer_norm(x, r, w, b, 1e-5)
    _, y_eager = _eager(x, r, w, b, 1e-5)
    exact = F.layer_norm(h.double(), (768,), w.double(), b.double(), 1e-5)
    tol = fused_op_tol(dtype)
    err_fused = (y.double() - exact).abs()
    err_eager = (y_eager.double() - exact).abs()
    assert (err_fused <= err_eager.max() + tol * (1 + exact.abs())).all(), (err_fused.max(), err_eager.max())


def test_add_layer_norm_specials_follow_eager():
    """A row holding an inf or a NaN is NaN everywhere, as eager's (its mean is), and so is a row whose variance
    overflows float32 (|x| near 1e20: eager's Welford gives NaN; the kernel gave the bias, found by a helper); the
    other rows are untouched."""
    x, r = torch.randn(4, 64), torch.randn(4, 64)
    x[0, 5], x[1, 9] = float("inf"), float("nan")
    x[3] = torch.randn(64) * 1e25
    w, b = torch.rand(64) + 0.5, torch.randn(64)
    h, y = fused.add_layer_norm(x, r, w, b, 1e-5)
    h_ref, y_ref = _eager(x, r, w, b, 1e-5)
    assert torch.equal(h.isnan(), h_ref.isnan()) and torch.equal(y.isnan(), y_ref.isnan())
    assert y_ref[3].isnan().all(), "eager's row of overflowing variance is NaN"
    torch.testing.assert_close(y[2], y_ref[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [3e18, 1e19])
def test_a_row_whose_squares_overflow_here_is_eagers(scale):
    """Note [A norm that is not finite is eager's]: a row of values near 1e19 has a variance within float32's range
    but squared deviations whose sum is not; the kernel gave NaN where eager's Welford gave a finite row (a helper's
    find). Such a call is eager's own add and layer_norm: the same values, NaN where eager has them."""
    g = torch.Generator().manual_seed(0)
    x, r = torch.randn(3, 48, generator=g), torch.randn(3, 48, generator=g)
    x[1] = torch.randn(48, generator=g) * scale
    w, b = torch.rand(48, generator=g) + 0.5, torch.randn(48, generator=g)
    h, y = fused.add_layer_norm(x, r, w, b, 1e-5)
    h_ref, y_ref = _eager(x, r, w, b, 1e-5)
    assert torch.equal(h, h_ref)
    assert torch.equal(y.isnan(), y_ref.isnan())
    assert torch.equal(y.nan_to_num(), y_ref.nan_to_num())  # the whole call is eager's


class Block(torch.nn.Module):
    """GPT-2's residual stream: h = attn + residual; y = ln(h); the sum is the next residual."""

    def __init__(self, n: int, dtype: torch.dtype, bias: bool = True, affine: bool = True):
        super().__init__()
        self.ln = torch.nn.LayerNorm(n, eps=1e-5, bias=bias, elementwise_affine=affine).to(dtype)
        self.proj = torch.nn.Linear(n, n).to(dtype)
        if affine:
            with torch.no_grad():
                self.ln.weight.uniform_(0.5, 1.5)
                if bias:
                    self.ln.bias.normal_()

    def forward(self, x, residual):
        h = self.proj(x) + residual
        return self.ln(h) * 2, h


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias,affine", [(True, True), (False, True), (False, False)], ids=["affine", "no_bias", "none"])
def test_the_residual_add_and_layer_norm_fuse(dtype, bias, affine):
    torch._dynamo.reset()
    model = Block(48, dtype, bias, affine).eval()
    x, r = torch.randn(2, 3, 48).to(dtype), torch.randn(2, 3, 48).to(dtype)
    compiled = compile_graphex(model, pattern_fusion_pass=True, pointwise_fusion=False)
    with torch.no_grad():
        got, want = compiled(x, r), model(x, r)
    assert fused_ops(newest_capture().gm)["add_layer_norm"] == 1
    assert torch.equal(got[1], want[1])
    tol = 2 * fused_op_tol(dtype)  # the norm's tolerance, then eager's * 2
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)


def _alpha(x, r, w, b):
    h = torch.add(x, r, alpha=0.5)
    return F.layer_norm(h, (h.shape[-1],), w, b, 1e-5), h


def _two_dims(x, r, w, b):  # normalized over the last two dimensions: another norm
    h = x + r
    return F.layer_norm(h, h.shape[-2:], w.expand(h.shape[-2:]).contiguous(), None, 1e-5), h


def _broadcast_residual(x, r, w, b):
    h = x + r[0]
    return F.layer_norm(h, (h.shape[-1],), w, b, 1e-5), h


def _other_weight_dtype(x, r, w, b):
    h = x + r
    return F.layer_norm(h.float(), (h.shape[-1],), w.float(), b.float(), 1e-5), h


@pytest.mark.parametrize("fn", [_alpha, _two_dims, _broadcast_residual], ids=lambda f: f.__name__)
def test_a_near_miss_is_not_add_layer_norm(fn):
    torch._dynamo.reset()
    x, r, w, b = torch.randn(2, 3, 16), torch.randn(2, 3, 16), torch.rand(16) + 0.5, torch.randn(16)
    compiled = compile_graphex(fn, pattern_fusion_pass=True, pointwise_fusion=False)
    with torch.no_grad():
        got, want = compiled(x, r, w, b), fn(x, r, w, b)
    assert "add_layer_norm" not in fused_ops(newest_capture().gm)
    for g, e in zip(got, want):
        assert torch.equal(g, e)


def test_a_float32_norm_of_a_bfloat16_sum_is_not_add_layer_norm():
    torch._dynamo.reset()
    x, r = torch.randn(2, 16).bfloat16(), torch.randn(2, 16).bfloat16()
    w, b = torch.rand(16) + 0.5, torch.randn(16)
    compiled = compile_graphex(_other_weight_dtype, pattern_fusion_pass=True, pointwise_fusion=False)
    with torch.no_grad():
        got, want = compiled(x, r, w, b), _other_weight_dtype(x, r, w, b)
    assert "add_layer_norm" not in fused_ops(newest_capture().gm)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
