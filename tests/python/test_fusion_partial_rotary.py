"""Fused mode's partial rotary (graphex_fused::partial_rotary, csrc/fused/rotary.cpp; the rewrite in
graphex/fusion/partial_rotary.py): `cat([rotate(x[..., :r]), x[..., r:]], -1)` as GPT-NeoX and Phi write it, in one
pass. The rotated part is rotary's row kernel and the tail a copy, so the result is eager's bit for bit in every fused
dtype; near misses keep the cat.
"""

from __future__ import annotations

import pytest
import torch

from conftest import compile_graphex, fused_ops, newest_capture

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
fused = torch.ops.graphex_fused


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def neox(q, cos, sin, r):
    """transformers' GPT-NeoX: the first r elements of each head rotated, the rest passed through."""
    q_rot, q_pass = q[..., :r], q[..., r:]
    return torch.cat([q_rot * cos + rotate_half(q_rot) * sin, q_pass], dim=-1)


def _tables(shape, r, dtype, g):
    angle = torch.randn(*shape[:-1], r // 2, generator=g)
    return torch.cat([angle, angle], -1).cos().to(dtype), torch.cat([angle, angle], -1).sin().to(dtype)


@pytest.mark.default_isa
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,r", [(64, 16), (64, 32), (64, 62), (40, 8), (6, 2), (128, 64)])
def test_the_kernel_is_eagers_bit_for_bit(dtype, n, r):
    g = torch.Generator().manual_seed(n * 100 + r)
    q = torch.randn(2, 4, 3, n, generator=g).to(dtype)
    cos, sin = _tables((1, 1, 3, n), r, dtype, g)
    assert torch.equal(fused.partial_rotary(q, cos, sin), neox(q, cos, sin, r))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_transposed_x_and_one_row_of_tables(dtype):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 5, 4, 64, generator=g).to(dtype).transpose(1, 2)  # [B, H, T, D] over [B, T, H, D] memory
    cos, sin = _tables((1, 64), 16, dtype, g)
    out = fused.partial_rotary(q, cos, sin)
    assert out.is_contiguous() and torch.equal(out, neox(q, cos, sin, 16))


def test_the_kernel_refuses_tables_it_cannot_place():
    q = torch.randn(2, 3, 8)
    with pytest.raises(RuntimeError, match="even last dimension"):
        fused.partial_rotary(q, torch.randn(3, 3), torch.randn(3, 3))
    with pytest.raises(RuntimeError, match="broadcast to x's rows"):
        fused.partial_rotary(q, torch.randn(4, 2, 3, 4), torch.randn(4, 2, 3, 4))


class Attention(torch.nn.Module):
    """A NeoX-style attention head's rotary: q and k from one projection, partial rotary on both."""

    def __init__(self, r=16, heads=4, d=64, form=neox):
        super().__init__()
        self.r, self.heads, self.d, self.form = r, heads, d, form
        self.qk = torch.nn.Linear(heads * d, 2 * heads * d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        # heads first in memory (the rotary kernel's output is row-major over a slice, as eager's mul is then)
        q, k = self.qk(x).view(b, t, self.heads, 2 * self.d).transpose(1, 2).contiguous().split(self.d, -1)
        return self.form(q, cos, sin, self.r) * 2, self.form(k, cos, sin, self.r) + 1


def _run(form, dtype=torch.float32, r=16):
    torch.manual_seed(0)
    model = Attention(r=r, form=form).to(dtype).eval()
    x = torch.randn(1, 3, 256).to(dtype)
    g = torch.Generator().manual_seed(1)
    cos, sin = _tables((1, 1, 3, 64), r, dtype, g)
    with torch.no_grad():
        want = model(x, cos, sin)
        got = compile_graphex(model, pattern_fusion_pass=True)(x, cos, sin)
    return got, want, fused_ops(newest_capture().gm)


@pytest.mark.default_isa
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_neox_spelling_fuses_and_is_eagers_bit_for_bit(dtype):
    got, want, ops = _run(neox, dtype)
    assert ops["partial_rotary"] == 2 and ops["rotary"] == 0, ops
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def _tail_first(q, cos, sin, r):
    q_rot, q_pass = q[..., :r], q[..., r:]
    return torch.cat([q_pass, q_rot * cos + rotate_half(q_rot) * sin], dim=-1)


def _gap(q, cos, sin, r):
    q_rot, q_pass = q[..., :r], q[..., r + 2:]
    return torch.cat([q_rot * cos + rotate_half(q_rot) * sin, q_pass], dim=-1)


def _another_tensors_tail(q, cos, sin, r):
    q_rot = q[..., :r]
    return torch.cat([q_rot * cos + rotate_half(q_rot) * sin, (q * 2)[..., r:]], dim=-1)


def _rotary_read_twice(q, cos, sin, r):
    q_rot, q_pass = q[..., :r], q[..., r:]
    rot = q_rot * cos + rotate_half(q_rot) * sin
    return torch.cat([rot, q_pass], dim=-1) + rot.sum(-1, keepdim=True)


def _not_from_zero(q, cos, sin, r):
    q_rot, q_pass = q[..., 2:r + 2], q[..., r + 2:]
    return torch.cat([q_rot * cos + rotate_half(q_rot) * sin, q_pass], dim=-1)


@pytest.mark.parametrize("form", [_tail_first, _gap, _another_tensors_tail, _rotary_read_twice, _not_from_zero],
                         ids=lambda f: f.__name__.strip("_"))
def test_near_misses_keep_the_cat(form):
    got, want, ops = _run(form)
    assert ops["partial_rotary"] == 0 and ops["rotary"] == 2, ops
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_a_whole_width_rotary_is_the_plain_kernel():
    got, want, ops = _run(lambda q, cos, sin, r: q * cos + rotate_half(q) * sin, r=64)
    assert ops["rotary"] == 2 and ops["partial_rotary"] == 0, ops
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def _chunked_twice(x, cos, sin):
    return x * cos + torch.cat((-x.chunk(2, -1)[1], x.chunk(2, -1)[0]), -1) * sin


def _sliced_twice(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin + 0 * x[..., :h].sum()


def _returns_both_views(x, cos, sin):  # two views returned: two tensors, as eager gives (never merged into one)
    y = x * 2  # of a value the graph computes (a helper found views of it returned as one object), and of the input
    return (x * cos + torch.cat((-x.chunk(2, -1)[1], x.chunk(2, -1)[0]), -1) * sin, x.chunk(2, -1)[0],
            x.chunk(2, -1)[0], y.chunk(2, -1)[0], y.chunk(2, -1)[0], y[..., :4], y[..., :4])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", [_chunked_twice, _sliced_twice, _returns_both_views], ids=lambda f: f.__name__)
def test_a_view_written_twice_is_one_node_and_the_rotary_fuses(dtype, form):
    """Note [Arguments are matched in one spelling]: x.chunk(2, -1) (or the same slice) written twice is one node, so
    the rotary pattern traced from `x1, x2 = x.chunk(2, -1)` fires (a helper found it ran as an element-wise chain);
    the rotary is eager's bit for bit, and returned views stay distinct tensors."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 4, 3, 16, generator=g).to(dtype)
    cos, sin = _tables((1, 1, 3, 16), 16, dtype, g)
    torch._dynamo.reset()
    compiled = compile_graphex(form, pattern_fusion_pass=True)
    with torch.no_grad():
        got, want = compiled(x, cos, sin), form(x, cos, sin)
    for a, b in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, want))):
        assert torch.equal(a, b)
    if form is _returns_both_views:  # the returned views read the merged split too: the pattern cannot own it
        assert got[1] is not got[2] and got[1].data_ptr() == got[2].data_ptr() == x.data_ptr()
        for a, b in ((got[3], got[4]), (got[5], got[6])):  # two tensors: reshaping one leaves the other as eager does
            assert a is not b and a.data_ptr() == b.data_ptr()
            shape = b.shape
            a.transpose_(0, 1)
            assert b.shape == shape
    else:
        assert newest_capture().fused.get("rotary") == 1, newest_capture().fused
