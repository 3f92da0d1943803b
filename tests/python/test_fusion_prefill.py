"""Fused mode on attention over many query rows (a prefill, a chunked prefill): graphex_fused::prefill_attention
(Note [Which attention forms a prefill fuses], graphex/fusion/attention_patterns.py; Note [Prefill attention is
ATen's tiled kernel, with the heads as they are], csrc/fused/attention.cpp).

- SDPA after repeat_kv or repeat_interleave, every fused dtype, every mask kind and is_causal: eager's result bit
  for bit (the same kernel, the cache not copied), with non-contiguous caches and a transposed q.
- Attention written out in float32: within fused mode's tolerance, and eager's edges (a row masked everywhere, NaN
  and inf inputs, overflowing scores) computed as eager computes them.
- Near misses stay eager's: bfloat16/float16 written out, SDPA with no repeat, a mask that grows the scores.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import compile_graphex, fused_op_tol, fused_ops, newest_capture

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _repeat_kv(x, n):  # transformers' repeat_kv
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def _repeat_interleave(x, n):
    return x.repeat_interleave(n, dim=1)


REPEATS = {"repeat_kv": _repeat_kv, "repeat_interleave": _repeat_interleave}


def _inputs(dtype, t=7, s=11, h=4, hkv=2, d=16, batch=2, layout="plain", seed=0):
    """q [B, H, T, D], k and v [B, Hkv, S, D]; layout "strided": q a transpose of [B, T, H, D] (how models make it),
    k and v the first S positions of a longer cache (a StaticCache's slice); "last_strided": rows whose elements are
    not adjacent (the flash kernel reads rows as contiguous: found by a helper)."""
    g = torch.Generator().manual_seed(seed)
    if layout in ("last_strided", "cache_last_strided"):  # rows not contiguous: a cache kept [B, Hkv, D, S] and
        # transposed, and (last_strided) q made [B, H, D, T] (SDPA takes its math path for such a q: not fused)
        q = torch.randn(batch, h, d, t, generator=g).to(dtype).transpose(2, 3)
        if layout == "cache_last_strided":
            q = q.contiguous()
        k = torch.randn(batch, hkv, d, s, generator=g).to(dtype).transpose(2, 3)
        v = torch.randn(batch, hkv, d, s, generator=g).to(dtype).transpose(2, 3)
    elif layout == "strided":
        q = torch.randn(batch, t, h, d, generator=g).to(dtype).transpose(1, 2)
        k = torch.randn(batch, hkv, s + 5, d, generator=g).to(dtype)[:, :, :s]
        v = torch.randn(batch, hkv, s + 5, d, generator=g).to(dtype)[:, :, :s]
    else:
        q = torch.randn(batch, h, t, d, generator=g).to(dtype)
        k = torch.randn(batch, hkv, s, d, generator=g).to(dtype)
        v = torch.randn(batch, hkv, s, d, generator=g).to(dtype)
    return q, k, v


def _causal_bool(t, s):  # a prefill of t tokens at the end of s positions: row i attends 0 .. s - t + i
    return torch.ones(t, s, dtype=torch.bool).tril(s - t)[None, None]


def _additive(mask_bool, dtype):
    return torch.zeros(mask_bool.shape, dtype=dtype).masked_fill(~mask_bool, float("-inf"))


def _sdpa_fn(rep, mask_kind, scale):
    kw = {} if scale is None else {"scale": scale}

    def fn(q, k, v, *mask):
        n = q.shape[1] // k.shape[1]
        if mask_kind == "causal":
            return F.scaled_dot_product_attention(q, rep(k, n), rep(v, n), is_causal=True, **kw)
        return F.scaled_dot_product_attention(q, rep(k, n), rep(v, n), attn_mask=mask[0] if mask else None, **kw)

    return fn


def _run(fn, args):
    torch._dynamo.reset()
    compiled = compile_graphex(fn, pattern_fusion_pass=True, pointwise_fusion=False)
    with torch.no_grad():
        got, want = compiled(*args), fn(*args)
    return got, want, fused_ops(newest_capture().gm)


@pytest.mark.default_isa
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("repeat", list(REPEATS))
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none", "causal"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_sdpa_prefill_with_repeated_heads_is_eagers_bit_for_bit(dtype, repeat, mask_kind, scale):
    for layout, (t, s) in (("plain", (7, 11)), ("strided", (5, 5)), ("cache_last_strided", (6, 9)),
                           ("plain", (40, 70))):
        q, k, v = _inputs(dtype, t=t, s=s, layout=layout)
        mask = []
        if mask_kind in ("bool", "additive"):
            m = _causal_bool(t, s)
            mask = [m if mask_kind == "bool" else _additive(m, dtype)]
            if layout == "cache_last_strided":  # a mask whose rows are not contiguous either
                mask = [torch.stack((mask[0], mask[0]), -1).flatten(-2)[..., ::2]]
        got, want, fired = _run(_sdpa_fn(REPEATS[repeat], mask_kind, scale), (q, k, v, *mask))
        assert fired == {"prefill_attention": 1}, f"{layout} t={t}: fired {dict(fired)}"
        assert got.stride() == want.stride(), f"{layout}: layout {got.stride()} != eager's {want.stride()}"
        assert torch.equal(got, want), f"{layout} t={t}: max diff {(got.double() - want.double()).abs().max()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sdpa_prefill_edges_are_eagers(dtype):
    """Every edge is eager's, since the kernel is eager's: a row masked everywhere (0), NaN in q, inf in k, NaN in v,
    a mask of one row per batch."""
    t, s = 6, 9
    q, k, v = _inputs(dtype, t=t, s=s)
    m = _causal_bool(t, s).expand(2, 1, t, s).clone()
    m[1, 0, 2] = False  # a row masked everywhere
    q[0, 1, 3, 2] = float("nan")
    k[1, 0, 4, 0] = float("inf")
    v[0, 1, 7, 5] = float("nan")
    for mask in (m, _additive(m, dtype)):
        got, want, fired = _run(_sdpa_fn(_repeat_kv, "mask", None), (q, k, v, mask))
        assert fired == {"prefill_attention": 1}
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


def _written_fn(rep, mask_kind, divide, upcast=False):
    def fn(q, k, v, *mask):
        n = q.shape[1] // k.shape[1]
        s = torch.matmul(q, rep(k, n).transpose(2, 3))
        s = s / math.sqrt(q.shape[-1]) if divide else s * 0.3
        if mask_kind == "bool":
            s = s.masked_fill(~mask[0], float("-inf"))
        elif mask_kind == "additive":
            s = s + mask[0]
        p = torch.softmax(s.float(), dim=-1).to(q.dtype) if upcast else torch.softmax(s, dim=-1)
        return torch.matmul(p, rep(v, n))

    return fn


WRITTEN_REPEATS = {**REPEATS, "none": lambda x, n: x}


@pytest.mark.parametrize("repeat", list(WRITTEN_REPEATS))
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("divide", [True, False], ids=["div", "mul"])
def test_written_out_prefill_in_float32_is_fused_within_tolerance(repeat, mask_kind, divide):
    """Fused from _WRITTEN_PREFILL_MIN_SCORES scores per head on (T * S); below, eager's ops are as fast: not fused,
    bit for bit eager's."""
    from graphex.fusion.attention_patterns import _WRITTEN_PREFILL_MIN_SCORES

    assert 181 * 181 < _WRITTEN_PREFILL_MIN_SCORES <= 192 * 192
    tol = fused_op_tol(torch.float32)
    for layout, (t, s), fuses in (("plain", (7, 11), False), ("plain", (181, 181), False),
                                  ("plain", (192, 192), True), ("strided", (160, 210), True),
                                  ("last_strided", (170, 200), True), ("plain", (40, 900), True)):
        q, k, v = _inputs(torch.float32, t=t, s=s, layout=layout, hkv=4 if repeat == "none" else 2, d=8, batch=1 if
                          layout == "plain" else 2)
        m = _causal_bool(t, s)
        mask = {"bool": [m], "additive": [_additive(m, torch.float32)], "none": []}[mask_kind]
        if layout == "last_strided" and mask:
            mask = [torch.stack((mask[0], mask[0]), -1).flatten(-2)[..., ::2]]
        got, want, fired = _run(_written_fn(WRITTEN_REPEATS[repeat], mask_kind, divide), (q, k, v, *mask))
        assert fired == ({"prefill_attention": 1} if fuses else {}), f"{layout} {t}x{s}: fired {dict(fired)}"
        assert got.stride() == want.stride()
        if fuses:
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        else:
            assert torch.equal(got, want)


def _edge_cases():
    """(name, q, k, v, mask): inputs where the tiled kernel's edges are not softmax's."""
    t, s = 5, 8
    base = _inputs(torch.float32, t=t, s=s, batch=1)
    m = _causal_bool(t, s).clone()
    cases = []
    q, k, v = (x.clone() for x in base)
    m2 = m.clone()
    m2[..., 2, :] = False
    cases.append(("a row masked everywhere", q, k, v, m2))
    q, k, v = (x.clone() for x in base)
    q[0, 1, 3, 0] = float("nan")
    cases.append(("NaN in q", q, k, v, m))
    q, k, v = (x.clone() for x in base)
    k[0, 0, 1, 0] = float("inf")
    cases.append(("inf in k", q, k, v, m))
    q, k, v = (x.clone() for x in base)
    v[0, 1, 6, 3] = float("-inf")
    cases.append(("-inf in v", q, k, v, m))
    q, k, v = (x.clone() for x in base)
    q[0, 0, 4] *= 1e20
    k[0, 0, 2] *= 1e20
    cases.append(("scores that overflow", q, k, v, m))
    q, k, v = _inputs(torch.float32, t=t, s=64, batch=1)  # the kernel sums p * v before dividing (found by a helper)
    cases.append(("values whose unnormalized sum overflows", q * 0.01, k, torch.full_like(v, 1e37),
                  torch.ones(1, 1, t, 64, dtype=torch.bool)))
    return cases


def _written_op(q, k, v, mask, divide=True):
    """The kernel call the written-out forms make (zero_masked_rows=False), on any size."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if divide else 0.3
    return torch.ops.graphex_fused.prefill_attention(q, k, v, mask, scale, False, False)


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_written_out_prefill_edges_are_softmaxs(mask_kind):
    """The op the written-out forms call, on inputs where the tiled kernel's edges are not softmax's: eager's
    written-out result, NaN where eager's is NaN."""
    tol = fused_op_tol(torch.float32)
    for name, q, k, v, m in _edge_cases():
        mask = m if mask_kind == "bool" else _additive(m, torch.float32)
        want = _written_fn(_repeat_kv, mask_kind, divide=True)(q, k, v, mask)
        got = _written_op(q, k, v, mask)
        assert want.isnan().any() or want.isinf().any() or "overflow" in name, f"{name}: not an edge"
        assert torch.equal(got.isnan(), want.isnan()), f"{name}: NaN where eager has none, or none where eager has"
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True, msg=name)


def test_a_fused_written_out_prefill_keeps_softmaxs_edges():
    """The same through torch.compile, on a prefill large enough to fuse: a row masked everywhere and a NaN in q."""
    t = s = 192
    q, k, v = _inputs(torch.float32, t=t, s=s, batch=1, d=8)
    q[0, 1, 3, 0] = float("nan")
    m = _causal_bool(t, s).clone()
    m[..., 7, :] = False
    got, want, fired = _run(_written_fn(_repeat_kv, "bool", divide=True), (q, k, v, m))
    assert fired == {"prefill_attention": 1}
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    tol = fused_op_tol(torch.float32)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


def test_written_out_prefill_with_a_nan_in_the_mask_is_softmaxs():
    q, k, v = _inputs(torch.float32, t=4, s=6, batch=1)
    mask = _additive(_causal_bool(4, 6), torch.float32)
    mask[..., 1, 0] = float("nan")
    mask[..., 3, 2] = float("inf")
    want = _written_fn(_repeat_kv, "additive", divide=False)(q, k, v, mask)
    got = _written_op(q, k, v, mask, divide=False)
    assert torch.equal(got.isnan(), want.isnan())
    tol = fused_op_tol(torch.float32)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("upcast", [False, True], ids=["softmax_in_dtype", "softmax_in_float32"])
def test_written_out_prefill_in_reduced_precision_stays_eagers(dtype, upcast):
    """Eager rounds each score to the dtype; the tiled kernel does not: more than one query row stays exact."""
    q, k, v = _inputs(dtype, t=192, s=192, d=8)
    mask = _additive(_causal_bool(192, 192), dtype)
    got, want, fired = _run(_written_fn(_repeat_kv, "additive", divide=True, upcast=upcast), (q, k, v, mask))
    assert "prefill_attention" not in fired and "decode_attention" not in fired, dict(fired)
    assert torch.equal(got, want)


def test_sdpa_prefill_without_a_repeat_is_left_as_it_is():
    q, k, v = _inputs(torch.float32, t=6, s=9, hkv=4)
    got, want, fired = _run(_sdpa_fn(lambda x, n: x, "bool", None), (q, k, v, _causal_bool(6, 9)))
    assert not fired, dict(fired)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_sdpas_own_grouped_heads_decode_as_decode_attention(dtype, mask_kind, scale):
    """F.scaled_dot_product_attention(..., enable_gqa=True) reaches the graph as the no-repeat form's call on fewer
    key/value heads: one query row runs decode_attention (a helper found it missed), within fused mode's tolerance,
    a row masked everywhere 0 as SDPA gives; many rows stay eager's (the graph runs the tiled kernel already)."""
    kw = {} if scale is None else {"scale": scale}

    def fn(q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0] if mask else None, enable_gqa=True, **kw)

    for t, want_fired in ((1, {"decode_attention": 1}), (6, {})):
        q, k, v = _inputs(dtype, t=t, s=9, h=8, hkv=2)
        mask = _causal_bool(t, 9).expand(2, 1, t, 9).clone()
        mask[1, 0, 0] = False  # a row masked everywhere
        masks = {"bool": [mask], "additive": [_additive(mask, dtype)], "none": []}[mask_kind]
        got, want, fired = _run(fn, (q, k, v, *masks))
        assert dict(fired) == want_fired, dict(fired)
        if not want_fired:
            assert torch.equal(got, want)
            continue
        assert torch.equal(got.isnan(), want.isnan())
        tol = 4 * fused_op_tol(dtype)
        torch.testing.assert_close(got.float().nan_to_num(), want.float().nan_to_num(), rtol=tol, atol=tol)


def test_a_mask_that_grows_the_scores_stays_eagers():
    """A mask with more batches than q: eager broadcasts the scores to it; not the kernel's."""
    q, k, v = _inputs(torch.float32, t=192, s=192, batch=1, d=8)
    mask = torch.ones(3, 1, 192, 192, dtype=torch.bool)
    got, want, fired = _run(_written_fn(_repeat_kv, "bool", divide=True), (q, k, v, mask))
    assert "prefill_attention" not in fired, dict(fired)
    assert torch.equal(got, want)


def test_sdpa_is_causal_with_one_query_row_is_eagers():
    """SDPA's is_causal aligns to the top left: one query row attends the first position only. The kernel is eager's."""
    q, k, v = _inputs(torch.float32, t=1, s=9)
    got, want, fired = _run(_sdpa_fn(_repeat_kv, "causal", None), (q, k, v))
    assert fired == {"prefill_attention": 1}
    assert torch.equal(got, want)


def test_prefill_attention_op_refuses_a_mask_with_is_causal():
    q, k, v = _inputs(torch.float32, t=3, s=4)
    with pytest.raises(RuntimeError, match="is_causal and a mask"):
        torch.ops.graphex_fused.prefill_attention(q, k, v, torch.ones(1, 1, 3, 4, dtype=torch.bool), 0.5, True, True)
