"""Fused mode on code that looks like a built-in pattern but computes something else (Note [A match reads
every argument], graphex/fusion/manager.py): the pattern must not fire there, and the result stays eager's;
and on code whose inputs come late (Note [A replacement is placed where its inputs exist]): it compiles.

Each case names what fused mode may still fuse in it (a smaller pattern that is exactly what the code
computes) and what it must not.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from conftest import compile_graphex, fused_op_tol, fused_ops, newest_capture


def _rms(h, w, eps=1e-6):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w


def add_alpha_then_rms_norm(x, r, w):
    h = torch.add(x, r, alpha=0.5)
    return _rms(h, w), h


def rotary_added_with_alpha(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.add(x * cos, torch.cat((-x2, x1), dim=-1) * sin, alpha=-1.0)


def add_alpha_one_then_rms_norm(x, r, w):  # alpha=1 is x + r: the pattern may fire
    h = torch.add(x, r, alpha=1)
    return _rms(h, w), h


_W = torch.randn(64) * 0.1


def gemma_norm_weight_after_the_add(x, r):  # Gemma: (1 + w), computed after the residual add
    h = x + r
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return out * (1.0 + _W), h


def norm_weight_drawn_after_the_add(x, r):  # a random weight cannot move (it would draw in another order)
    h = x + r
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return out * torch.rand(64), h


def sdpa_with_a_row_masked_everywhere(q, k, v, mask):  # SDPA gives zeros for that row; the written-out form NaN
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)


def _one_row_masked_everywhere():
    mask = torch.ones(2, 4, 1, 6, dtype=torch.bool)
    mask[1, 2] = False
    return torch.randn(2, 4, 1, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), mask


def sdpa_gqa_tiled(q, k, v, mask):  # heads tiled (h0 h1 h0 h1), not interleaved (h0 h0 h1 h1): not GQA's mapping
    return F.scaled_dot_product_attention(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), attn_mask=mask)


def sdpa_gqa_interleaved_on_another_dim(q, k, v, mask):  # repeat_interleave over the positions, not the heads
    return F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2),
                                          attn_mask=mask)


def sdpa_gqa_default_scale(q, k, v, mask):  # GQA by repeat_interleave with SDPA's own scale: may fire
    return F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1),
                                          attn_mask=mask)


def _gqa():
    return torch.randn(1, 4, 1, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.ones(1, 1, 1, 6, dtype=torch.bool)


def _gqa_long_mask():  # as many query heads as key/value heads; the positions repeated
    _, k, v, _ = _gqa()
    return torch.randn(1, 2, 1, 8), k, v, torch.ones(1, 1, 1, 12, dtype=torch.bool)


def written_softmax_over_queries(q, k, v, mask):  # softmax over dim -2: another meaning
    scores = torch.matmul(q, k.transpose(2, 3)) * 0.25
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-2), v)


def written_additive_bias(q, k, v, bias):  # an additive float bias (ALiBi-like): an additive mask, may fire
    scores = torch.matmul(q, k.transpose(2, 3)) * 0.25 + bias
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def written_bias_before_scale(q, k, v, bias):  # the bias is scaled too: another meaning than scores * s + mask
    scores = (torch.matmul(q, k.transpose(2, 3)) + bias) * 0.25
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def written_mask_of_another_dtype(q, k, v, bias):  # a float64 mask promotes the scores: not the kernel's
    scores = torch.matmul(q, k.transpose(2, 3)) * 0.25 + bias.double()
    return torch.matmul(torch.softmax(scores, dim=-1), v.double())


def bf16_linear(x, w, b):  # one row (a decode step's projection): may fire matvec; several rows must not
    return F.linear(x, w, b)


def bf16_linear_of_a_transposed_weight(x, w, b):  # the weight stored [K, N], as GPT-2's Conv1D: matvec's columns
    return F.linear(x, w.t(), b)


def bf16_addmm_scaled(x, w, b):  # addmm with beta and alpha: not what matvec computes
    return torch.addmm(b, x, w, beta=0.5, alpha=2.0)


def bf16_addmm_row_bias(x, w, b):  # a bias of two dimensions: matvec takes [N]
    return torch.addmm(b.view(1, -1), x, w)


def bf16_mm_of_a_strided_weight(x, w):  # every other column of a weight: neither layout matvec reads
    return x @ w[:, ::2]


def written_mask_growing_the_rows(q, k, v, mask):  # a [.., 3, S] mask broadcasts one query row to three
    scores = torch.matmul(q, k.transpose(2, 3)) * 0.25 + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def written_gqa_mul(q, k, v, mask):  # written out, GQA by repeat_interleave, a given scale: may fire
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * 0.25
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def sdpa_no_mask(q, k, v):  # no mask: every position attended; may fire
    return F.scaled_dot_product_attention(q, k, v)


def causal_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)


def _gemma_norm(x, w, c=1.0, spell=lambda c, w: c + w):
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * spell(c, w.float())).type_as(x)


def gemma_norm(x, w):  # transformers' GemmaRMSNorm: (1 + w)
    return _gemma_norm(x, w)


def gemma_add_norm(x, r, w):
    h = x + r
    return _gemma_norm(h, w), h


def norm_two_plus_w(x, w):  # another offset: the plain norm, its weight the `2 + w` eager computes
    return _gemma_norm(x, w, 2.0)


def norm_one_minus_w(x, w):
    return _gemma_norm(x, w, spell=lambda c, w: c - w)


def norm_one_plus_w_alpha(x, w):  # torch.add(w, 1.0, alpha=3.0) is w + 3
    return _gemma_norm(x, w, spell=lambda c, w: torch.add(w, c, alpha=3.0))


def norm_w_plus_one_tensor(x, w):  # 1 + w written with a 0-d tensor: not the number the kernel takes
    return _gemma_norm(x, w, spell=lambda c, w: w + torch.ones((), dtype=w.dtype))


def _norm_args() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(1, 3, 64) * 2, torch.randn(64) * 0.1


CASES = {
    "gemma_norm": (gemma_norm, _norm_args, set(), {"rms_norm"}),
    "gemma_add_norm": (gemma_add_norm, lambda: (torch.randn(1, 3, 64), torch.randn(1, 3, 64), torch.randn(64) * 0.1),
                       set(), {"add_rms_norm"}),
    "norm_two_plus_w": (norm_two_plus_w, _norm_args, set(), set()),
    "norm_one_minus_w": (norm_one_minus_w, _norm_args, set(), set()),
    "norm_one_plus_w_alpha": (norm_one_plus_w_alpha, _norm_args, set(), set()),
    "norm_w_plus_one_tensor": (norm_w_plus_one_tensor, _norm_args, set(), set()),
    "add_alpha_then_rms_norm": (add_alpha_then_rms_norm, lambda: (torch.randn(2, 3, 64), torch.randn(2, 3, 64),
                                                                   torch.randn(64)), {"add_rms_norm"}, set()),
    "rotary_added_with_alpha": (rotary_added_with_alpha, lambda: (torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8),
                                                                   torch.randn(1, 1, 3, 8)), {"rotary"}, set()),
    "add_alpha_one_then_rms_norm": (add_alpha_one_then_rms_norm, lambda: (torch.randn(2, 3, 64), torch.randn(2, 3, 64),
                                                                           torch.randn(64)), set(), {"add_rms_norm"}),
    "gemma_norm_weight_after_the_add": (gemma_norm_weight_after_the_add,
                                        lambda: (torch.randn(2, 3, 64), torch.randn(2, 3, 64)), set(), {"add_rms_norm"}),
    "norm_weight_drawn_after_the_add": (norm_weight_drawn_after_the_add,
                                        lambda: (torch.randn(2, 3, 64), torch.randn(2, 3, 64)), {"add_rms_norm"}, set()),
    "sdpa_with_a_row_masked_everywhere": (sdpa_with_a_row_masked_everywhere, _one_row_masked_everywhere, set(),
                                          {"decode_attention"}),
    # tiled heads are not GQA's mapping: fusing them as GQA (kv head i // 2) would read the wrong heads; fusing the
    # MHA form over the tiled copy is exact (the result is compared either way)
    "sdpa_gqa_tiled": (sdpa_gqa_tiled, _gqa, set(), set()),
    "sdpa_gqa_interleaved_on_another_dim": (sdpa_gqa_interleaved_on_another_dim, _gqa_long_mask, set(), set()),
    "sdpa_gqa_default_scale": (sdpa_gqa_default_scale, _gqa, set(), {"decode_attention"}),
    "written_softmax_over_queries": (written_softmax_over_queries, lambda: (torch.randn(1, 2, 1, 8), *_gqa()[1:3],
                                                                            torch.ones(1, 1, 1, 6, dtype=torch.bool)),
                                     {"decode_attention"}, set()),
    "written_additive_bias": (written_additive_bias, lambda: (torch.randn(1, 2, 1, 8), *_gqa()[1:3],
                                                              torch.randn(1, 2, 1, 6)), set(), {"decode_attention"}),
    "bf16_linear_one_row": (bf16_linear, lambda: (torch.randn(1, 1, 32).bfloat16(), torch.randn(48, 32).bfloat16(),
                                                   torch.randn(48).bfloat16()), set(), {"matvec"}),
    "bf16_linear_two_rows": (bf16_linear, lambda: (torch.randn(1, 2, 32).bfloat16(), torch.randn(48, 32).bfloat16(),
                                                    torch.randn(48).bfloat16()), {"matvec"}, set()),
    # float32 runs matvec too (Note [A float32 row runs matvec too], patterns.py)
    "float32_linear_one_row": (bf16_linear, lambda: (torch.randn(1, 1, 32), torch.randn(48, 32), torch.randn(48)),
                               set(), {"matvec"}),
    "bf16_linear_transposed_weight": (bf16_linear_of_a_transposed_weight,
                                      lambda: (torch.randn(1, 1, 32).bfloat16(), torch.randn(32, 48).bfloat16(),
                                               torch.randn(48).bfloat16()), set(), {"matvec"}),
    "float32_linear_transposed_weight": (bf16_linear_of_a_transposed_weight,
                                         lambda: (torch.randn(1, 1, 32), torch.randn(32, 48), torch.randn(48)),
                                         set(), {"matvec"}),
    "float32_addmm_two_rows": (lambda x, w, b: torch.addmm(b, x, w),
                               lambda: (torch.randn(2, 32), torch.randn(32, 48), torch.randn(48)), {"matvec"}, set()),
    "bf16_addmm_scaled": (bf16_addmm_scaled, lambda: (torch.randn(1, 32).bfloat16(), torch.randn(32, 48).bfloat16(),
                                                      torch.randn(48).bfloat16()), {"matvec"}, set()),
    "bf16_addmm_row_bias": (bf16_addmm_row_bias, lambda: (torch.randn(1, 32).bfloat16(),
                                                          torch.randn(32, 48).bfloat16(), torch.randn(48).bfloat16()),
                            {"matvec"}, set()),
    "bf16_addmm_two_rows": (lambda x, w, b: torch.addmm(b, x, w),
                            lambda: (torch.randn(2, 32).bfloat16(), torch.randn(32, 48).bfloat16(),
                                     torch.randn(48).bfloat16()), {"matvec"}, set()),
    "bf16_mm_of_a_strided_weight": (bf16_mm_of_a_strided_weight, lambda: (torch.randn(1, 32).bfloat16(),
                                                                          torch.randn(32, 96).bfloat16()),
                                    {"matvec"}, set()),
    "written_bias_before_scale": (written_bias_before_scale, lambda: (torch.randn(1, 2, 1, 8), *_gqa()[1:3],
                                                                      torch.randn(1, 2, 1, 6)), {"decode_attention"}, set()),
    "written_mask_of_another_dtype": (written_mask_of_another_dtype, lambda: (torch.randn(1, 2, 1, 8), *_gqa()[1:3],
                                                                              torch.randn(1, 1, 1, 6)),
                                      {"decode_attention"}, set()),
    "written_mask_growing_the_rows": (written_mask_growing_the_rows, lambda: (torch.randn(1, 2, 1, 8), *_gqa()[1:3],
                                                                              torch.randn(1, 1, 3, 6)),
                                      {"decode_attention"}, set()),
    "written_gqa_mul": (written_gqa_mul, _gqa, set(), {"decode_attention"}),
    "sdpa_no_mask": (sdpa_no_mask, lambda: _gqa_long_mask()[:3], set(), {"decode_attention"}),
    "causal_sdpa": (causal_sdpa, lambda: (torch.randn(1, 4, 1, 8), torch.randn(1, 4, 3, 8), torch.randn(1, 4, 3, 8)),
                    {"decode_attention"}, set()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_near_miss_is_not_fused_as_the_pattern(name):
    fn, make, must_not, must = CASES[name]
    torch._dynamo.reset()
    compiled = compile_graphex(fn, pattern_fusion_pass=True)
    args = make()
    with torch.no_grad():
        torch.manual_seed(0)
        got = compiled(*args)
        torch.manual_seed(0)
        want = fn(*args)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        tol = fused_op_tol(w.dtype)
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    graph = newest_capture()  # this test's (the newest)
    fired = set(fused_ops(graph.gm))
    assert not (fired & must_not), f"{name}: fused as {fired & must_not}, which it does not compute"
    assert must <= fired, f"{name}: expected {must} to fire, got {fired}"


def _rms_plain(x, w):  # no float32 upcast: eager squares in x's dtype
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _add_rms_plain(x, r, w):
    h = x + r
    return _rms_plain(h, w), h


def _rms_upcast(x, w):  # transformers' LlamaRMSNorm: the norm in float32
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_an_rms_norm_without_the_upcast_is_fused_only_where_it_squares_as_eager(dtype):
    """_norm_checks: in float16 eager's x.pow(2) overflows past |x| = 256 (the row becomes 0) and its squares of small
    values are subnormal; the kernel squares in float32, so a float16 norm without the upcast is not rms_norm (its
    element-wise steps may still be a chain, which rounds each square as eager: the zeroed row stays 0; found by a
    helper). bfloat16 has float32's range: fused, within its tolerance. The upcast
    form squares in float32 as the kernel does: fused in both."""
    g = torch.Generator().manual_seed(5)
    x, r = (torch.randn(1, 3, 64, generator=g) * 50).to(dtype), torch.randn(1, 3, 64, generator=g).to(dtype)
    x[0, 1, 3] = 300.0  # eager float16: inf square, the row 0
    x[0, 2] = x[0, 2] * 1e-4  # eager float16: subnormal squares
    w = torch.rand(64, generator=g).to(dtype) + 0.5
    for fn, args in ((_rms_plain, (x, w)), (_add_rms_plain, (x, r, w)), (_rms_upcast, (x, w))):
        torch._dynamo.reset()
        got, want = compile_graphex(fn, pattern_fusion_pass=True)(*args), fn(*args)
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        fired = set(fused_ops(newest_capture().gm)) & {"rms_norm", "add_rms_norm"}
        if dtype == torch.float16 and fn is not _rms_upcast:
            assert not fired, f"{fn.__name__}: fused in float16 without the upcast"
            assert torch.equal(got[0][0, 1], want[0][0, 1]) and not got[0][0, 1].any()  # eager's zeroed row
        else:
            assert fired, fn.__name__
        for gg, ww in zip(got, want):  # element-wise chains may fire around eager's mean: within their tolerance
            torch.testing.assert_close(gg, ww, rtol=fused_op_tol(dtype), atol=fused_op_tol(dtype))


class _Gpt2Block(torch.nn.Module):
    """GPT-2's block as transformers writes it: LayerNorm, attention (SDPA, causal), residual, LayerNorm, and an
    MLP with the tanh GELU written out (NewGELUActivation), residual."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln_1(x)).split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        h = self.fc(self.ln_2(x))
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.out(h)


@pytest.mark.parametrize("dtype,tokens", [(torch.float32, 1), (torch.float32, 8), (torch.bfloat16, 8),
                                          (torch.bfloat16, 1)])
def test_a_gpt2_blocks_residual_layernorm_and_written_gelu_fuse(dtype, tokens):
    """A GPT-2 block: the residual add and the LayerNorm after it run add_layer_norm (the first LayerNorm, with no add
    before it, keeps eager's kernel); the written-out tanh GELU is one element-wise chain (graphex_fused::pointwise); its
    causal SDPA with no repeated heads stays eager's at every length. In a bfloat16 one-token step the linear layers run
    matvec as well. Within the tolerance of the kernels that fired; with the element-wise chains switched off, only
    add_layer_norm fires."""
    torch.manual_seed(0)
    block = _Gpt2Block().to(dtype).eval()
    x = torch.randn(1, tokens, 32).to(dtype)
    torch._dynamo.reset()
    with torch.no_grad():
        got = compile_graphex(block, pattern_fusion_pass=True)(x)
        want = block(x)
    fired = set(fused_ops(newest_capture().gm))
    matvec = tokens == 1  # one row: the four linears run matvec, float32 too (Note [A float32 row runs matvec too])
    assert fired == ({"add_layer_norm", "matvec", "pointwise"} if matvec else {"add_layer_norm", "pointwise"}), fired
    n = 6 if matvec else 2  # four matvecs, the norm and the chain in a row, or the norm and the chain
    tol = n * fused_op_tol(dtype)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    if not matvec:
        torch._dynamo.reset()
        with torch.no_grad():
            got = compile_graphex(block, pattern_fusion_pass=True, pointwise_fusion=False)(x)
        assert set(fused_ops(newest_capture().gm)) == {"add_layer_norm"}
        tol = 2 * fused_op_tol(dtype)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
