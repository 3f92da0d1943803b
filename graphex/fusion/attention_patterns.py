"""The built-in attention patterns of fused mode: SDPA and written-out forms, generated from one table
(Note [Attention forms are generated from one table]), replaced by graphex_fused::decode_attention for one query
token and by graphex_fused::prefill_attention for many (Note [Which attention forms a prefill fuses])."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch._inductor.pattern_matcher import Match

from .. import _C  # noqa: F401  (registers the graphex_fused:: kernels used below)

from .checks import all_of, float_cpu, number, val
from .registration import register_named

fused = torch.ops.graphex_fused
aten = torch.ops.aten


# Note [Attention forms are generated from one table]
# Attention reaches the graph in many spellings that mean the same thing: SDPA or written out
# (matmul, scale, masked_fill, softmax, matmul), the scale given, divided by or SDPA's default,
# grouped-query heads repeated by repeat_kv (expand + reshape) or repeat_interleave or not at all, a
# bool mask (masked_fill(~mask, -inf) written out), an additive float mask (`scores + mask`, -inf where
# masked, what SDPA's float attn_mask means) or none. Each combination is one search function below, made from the table (_GQA and
# the flags) so that the rules are written once; all are replaced by the one kernel,
# graphex_fused::decode_attention, which reads grouped heads natively (query head h reads key/value
# head h // n, the head both repeats give it). torch's matcher retraces every match with its real
# shapes (the repeat count and dims, the scale), so a form fires only where the graph is exactly
# what the search function computes on those shapes, and _attention_check takes only a mask of the form's
# kind that broadcasts to the scores without growing them. Per form, what eager gives a row masked
# everywhere: SDPA 0 (zero_masked_rows), a written-out softmax over all -inf NaN.

def _repeat_kv(x, n_rep):  # transformers' repeat_kv (grouped-query attention)
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def _repeat_interleave(x, n_rep):
    return x.repeat_interleave(n_rep, dim=1)


def _no_repeat(x, n_rep):
    return x


_GQA = {"repeat_kv": _repeat_kv, "repeat_interleave": _repeat_interleave, "none": _no_repeat}


_MASKS = ("bool", "additive", "none")  # the mask kinds; a bool mask attends where true, an additive one is added


# Note [Which attention forms a prefill fuses]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Many query rows (a prefill, a chunked prefill) run graphex_fused::prefill_attention: ATen's tiled CPU flash kernel
# with the grouped key/value heads read as they are (Note [Prefill attention is ATen's tiled kernel, with the heads as
# they are], csrc/fused/attention.cpp). Which forms, and why:
#   - SDPA after repeat_kv or repeat_interleave, any fused dtype, any mask kind, and SDPA's is_causal=True (at any
#     query length): eager runs the same kernel on the repeated copy, so the fused result is eager's bit for bit and
#     the copy of the cache is saved. SDPA with no repeat is left as it is (the graph already runs that kernel).
#   - attention written out (matmul, scale, mask, softmax, matmul) in float32, with at least
#     _WRITTEN_PREFILL_MIN_SCORES scores per head (T * S): the tiled kernel never builds the [T, S] scores eager
#     builds, within fused mode's float32 tolerance; the edges where the kernel is not softmax are computed with
#     eager's ops (a row masked everywhere, NaN or inf inputs, overflowing scores). Below that size eager's bmm and
#     softmax are as fast (measured 2026-12-06, one thread, 8 query / 2 key-value heads of 64, causal mask, fused
#     against exact: T = S = 64 0.98x, 128 1.05x, 192 1.02x, 256 0.42x, 384 0.52x), so a short prefill keeps them.
#   - written out in bfloat16/float16: eager rounds every score to that dtype, which the tiled kernel does not, so
#     these stay eager's for more than one query row; Gemma2's capped scores, SDPA's math path (Falcon) and Bloom's
#     ALiBi form are fused for one query token only.
_PREFILL = {"sdpa": "any dtype", "written": "float32"}  # the forms that take many query rows, and in which dtypes
_WRITTEN_PREFILL_MIN_SCORES = 1 << 15  # T * S per head, about 181 x 181


def _sdpa_form(gqa: str, scaled: bool, mask_kind: str) -> Callable[..., Any]:
    """F.scaled_dot_product_attention after one GQA form, with or without scale= and a mask of one kind (or
    is_causal=True: mask_kind "causal")."""
    rep = _GQA[gqa]
    masked = mask_kind not in ("none", "causal")
    causal = mask_kind == "causal"

    def sdpa(q, k, v, **kwargs):
        # "none": the key/value heads as they are; where they are fewer than the query's, SDPA's own grouped heads
        # (enable_gqa=True: query head h reads head h // n, as both repeats give it), which reaches the ATen graph as
        # the same call on the same tensors, so it is this form, retraced on the match's shapes
        if gqa == "none" and q.shape[1] != k.shape[1]:
            kwargs["enable_gqa"] = True
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    def n(q, k):
        return q.shape[1] // k.shape[1]

    if causal and scaled:
        def search(q, k, v, scale):
            return sdpa(q, rep(k, n(q, k)), rep(v, n(q, k)), is_causal=True, scale=scale)
    elif causal:
        def search(q, k, v):
            return sdpa(q, rep(k, n(q, k)), rep(v, n(q, k)), is_causal=True)
    elif scaled and masked:
        def search(q, k, v, mask, scale):
            return sdpa(q, rep(k, n(q, k)), rep(v, n(q, k)), attn_mask=mask, scale=scale)
    elif masked:
        def search(q, k, v, mask):
            return sdpa(q, rep(k, n(q, k)), rep(v, n(q, k)), attn_mask=mask)
    elif scaled:
        def search(q, k, v, scale):
            return sdpa(q, rep(k, n(q, k)), rep(v, n(q, k)), scale=scale)
    else:
        def search(q, k, v):
            return sdpa(q, rep(k, n(q, k)), rep(v, n(q, k)))
    search.__qualname__ = search.__name__ = (f"sdpa_{gqa}_{'scale' if scaled else 'default_scale'}_"
                                             f"{mask_kind}_mask")
    return search


def _sdpa_fused_form(scaled: bool, mask_kind: str) -> Callable[..., Any]:
    """The kernel call for one SDPA form: decode_attention for one query token, prefill_attention for many (and for
    is_causal at any length), both giving a row masked everywhere 0, as SDPA does (Note [Which attention forms a prefill
    fuses]). The replacement is traced on the match's shapes, so the branch on q's length is taken once, at capture."""
    masked = mask_kind not in ("none", "causal")
    causal = mask_kind == "causal"

    def default_scale(q):
        return 1.0 / math.sqrt(q.shape[-1])  # ATen's sdpa: 1 / sqrt(E)

    def call(q, k, v, mask, scale):
        if q.shape[2] == 1 and not causal:
            return fused.decode_attention(q, k, v, _all_attended(q, k) if mask is None else mask, scale,
                                          zero_masked_rows=True)
        return fused.prefill_attention(q, k, v, mask, scale, causal, True)

    if scaled and masked:
        def replace(q, k, v, mask, scale):
            return call(q, k, v, mask, scale)
    elif masked:
        def replace(q, k, v, mask):
            return call(q, k, v, mask, default_scale(q))
    elif scaled:
        def replace(q, k, v, scale):
            return call(q, k, v, None, scale)
    else:
        def replace(q, k, v):
            return call(q, k, v, None, default_scale(q))
    replace.__qualname__ = replace.__name__ = f"sdpa_fused_{'scale' if scaled else 'default_scale'}_{mask_kind}"
    return replace


def _written_form(gqa: str, divide: bool, mask_kind: str, upcast: bool = False) -> Callable[..., Any]:
    """softmax(q k^T * scale (or / inv_scale), then masked_fill(~mask, -inf) or + mask) v, after one GQA form;
    `upcast`: the softmax in float32 and cast back to q's dtype (softmax(s.float()).to(q.dtype), or
    softmax(s, dtype=torch.float32).to(q.dtype): one graph after Note [Arguments are matched in one
    spelling]'s rewrite of _to_copy), traced per reduced dtype since the cast back names it."""
    rep = _GQA[gqa]

    def masked(scores, mask):
        if mask_kind == "none":
            return scores
        return scores.masked_fill(~mask, float("-inf")) if mask_kind == "bool" else scores + mask

    def probs(scores, q):
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) if upcast else torch.softmax(scores, dim=-1)

    def attend(q, k, v, mask, scaled):
        n = q.shape[1] // k.shape[1]
        scores = masked(scaled(torch.matmul(q, rep(k, n).transpose(2, 3))), mask)
        return torch.matmul(probs(scores, q), rep(v, n))

    if mask_kind == "none" and divide:
        def search(q, k, v, inv_scale):
            return attend(q, k, v, None, lambda s: s / inv_scale)
    elif mask_kind == "none":
        def search(q, k, v, scale):
            return attend(q, k, v, None, lambda s: s * scale)
    elif divide:
        def search(q, k, v, mask, inv_scale):  # examples/models/decoder.py's Attention
            return attend(q, k, v, mask, lambda s: s / inv_scale)
    else:
        def search(q, k, v, mask, scale):
            return attend(q, k, v, mask, lambda s: s * scale)
    search.__qualname__ = search.__name__ = (f"written_attention_{gqa}_{'div' if divide else 'mul'}_{mask_kind}_mask"
                                             f"{'_upcast' if upcast else ''}")
    return search


def _softcapped_form(gqa: str, mask_kind: str, upcast: bool) -> Callable[..., Any]:
    """Gemma2's attention as transformers writes it (eager_attention_forward): the scaled scores capped,
    tanh(s / softcap) * softcap, before the mask; the softmax in float32 in a bfloat16/float16 model (`upcast`)."""
    rep = _GQA[gqa]

    def attend(q, k, v, mask, scale, softcap):
        n = q.shape[1] // k.shape[1]
        scores = torch.matmul(q, rep(k, n).transpose(2, 3)) * scale
        scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            scores = scores + mask
        # softmax(s, dtype=torch.float32) is this graph after Note [Arguments are matched in one spelling]
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype) if upcast else torch.softmax(scores, dim=-1)
        return torch.matmul(probs, rep(v, n))

    if mask_kind == "none":
        def search(q, k, v, scale, softcap):
            return attend(q, k, v, None, scale, softcap)
    else:
        def search(q, k, v, mask, scale, softcap):
            return attend(q, k, v, mask, scale, softcap)
    search.__qualname__ = search.__name__ = f"softcapped_attention_{gqa}_{mask_kind}_mask{'_upcast' if upcast else ''}"
    return search


def softcapped_attention_fused(q, k, v, mask, scale, softcap):
    return _written(q, k, v, mask, scale, softcap)


def unmasked_softcapped_attention_fused(q, k, v, scale, softcap):
    return _written(q, k, v, _all_attended(q, k), scale, softcap)


def _a_cap(match: Match) -> bool:  # softcap 0 (or inf, NaN) is not a cap: eager's 0 / 0 and inf / inf give NaN
    cap = match.kwargs.get("softcap")
    return type(cap) in (float, int) and cap != 0 and math.isfinite(cap)


def _math_form(mask_kind: str, upcast: bool) -> Callable[..., Any]:
    """SDPA's math path as ATen writes it (at::_scaled_dot_product_attention_math), which torch takes where no fused
    CPU kernel applies (Falcon's multi-query attention: one key/value head broadcast to every query head): q and
    k^T each scaled by sqrt(scale) (sq, sk), a bool mask turned additive (where(mask, 0, -inf): the mask input),
    _safe_softmax (a row masked everywhere gives 0), and for a bfloat16/float16 model q, k and v in float32 and the
    result cast back (`upcast`). The key/value heads broadcast by matmul, so one form serves any kv head count
    that matmul broadcasts (1 or all)."""
    def attend(q, k, v, mask, sq, sk):
        qq, kk, vv = (q.float(), k.float(), v.float()) if upcast else (q, k, v)
        scores = torch.matmul(aten.mul.Scalar(qq, sq), aten.mul.Scalar(kk.transpose(2, 3), sk))
        if mask is not None:
            scores = scores + mask
        out = torch.matmul(aten._safe_softmax(scores, -1), vv)
        return out.to(q.dtype) if upcast else out

    if mask_kind == "none":
        def search(q, k, v, sq, sk):
            return attend(q, k, v, None, sq, sk)
    else:
        def search(q, k, v, mask, sq, sk):
            return attend(q, k, v, mask, sq, sk)
    search.__qualname__ = search.__name__ = f"sdpa_math_{mask_kind}_mask{'_upcast' if upcast else ''}"
    return search


def _sdpa_scales(match: Match) -> bool:
    """SDPA's math path scales q and k^T by the same sqrt(|scale|) (q's negated for a negative scale); another pair,
    written by hand, may overflow one side where the kernel's product k . (q * sq) * sk does not (sq 1e-40 and sk
    1e40: eager's k * 1e40 is inf), so it stays eager's (found by a helper)."""
    sq, sk = match.kwargs.get("sq"), match.kwargs.get("sk")
    return type(sq) in (float, int) and type(sk) in (float, int) and abs(sq) == abs(sk) and math.isfinite(sq)


def math_attention_fused(q, k, v, mask, sq, sk):  # q scaled first, as the math path scales it (Note in attention.cpp)
    return fused.one_token_attention(q, k, v, mask, sq, sk, 0.0, True, False)


def unmasked_math_attention_fused(q, k, v, sq, sk):
    return fused.one_token_attention(q, k, v, _all_attended(q, k), sq, sk, 0.0, True, False)


def _written(q, k, v, mask, scale, softcap=0.0):
    """A written-out form's kernel call: a row masked everywhere is NaN, as softmax gives; in bfloat16/float16 the
    scores and probabilities are rounded as eager computes them, in that dtype (round_scores, attention.cpp)."""
    if q.shape[2] > 1:  # float32, no cap (Note [Which attention forms a prefill fuses])
        return fused.prefill_attention(q, k, v, mask, scale, False, False)
    if q.dtype == torch.float32 and softcap == 0.0:
        return fused.decode_attention(q, k, v, mask, scale)  # nothing to round: the op float32 programs always had
    return fused.one_token_attention(q, k, v, mask, 1.0, scale, softcap, False, q.dtype != torch.float32)


def decode_attention_fused(q, k, v, mask, inv_scale):
    return _written(q, k, v, mask, 1.0 / inv_scale)


def written_attention_fused(q, k, v, mask, scale):
    return _written(q, k, v, mask, scale)


def _all_attended(q, k):  # no mask: every cached position is attended (as SDPA without attn_mask does)
    return torch.ones((1, 1, 1, k.shape[2]), dtype=torch.bool, device=q.device)


def _no_mask(q, k):  # a written-out form without a mask: every position attended (prefill_attention takes None)
    return _all_attended(q, k) if q.shape[2] == 1 else None


def unmasked_attention_fused_div(q, k, v, inv_scale):
    return _written(q, k, v, _no_mask(q, k), 1.0 / inv_scale)


def unmasked_attention_fused(q, k, v, scale):
    return _written(q, k, v, _no_mask(q, k), scale)


def _attention_check(mask_kind: str, prefill: str | None = None) -> Callable[[Match], bool]:
    """The check of an attention form: one query token, or many where `prefill` (a key of _PREFILL) admits them."""
    def check(match: Match) -> bool:
        return _attention_with(match, mask_kind, _PREFILL[prefill] if prefill else None)

    return check


def _attention_with(match: Match, mask_kind: str, prefill: str | None) -> bool:
    q, k, v = (val(match, n) for n in ("q", "k", "v"))
    mask = val(match, "mask") if "mask" in match.kwargs else None
    if q.dim() != 4 or k.dim() != 4 or tuple(k.shape) != tuple(v.shape):
        return False
    if (mask is None) != (mask_kind in ("none", "causal")):
        return False
    if mask is not None:
        want = torch.bool if mask_kind == "bool" else q.dtype
        if not isinstance(mask, torch.Tensor) or mask.dtype != want or mask.dim() > 4:
            return False
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return False
    t = q.shape[2]
    one_token = t == 1 and mask_kind != "causal"
    if not one_token:  # Note [Which attention forms a prefill fuses]
        if prefill is None or t == 0:
            return False
        if prefill == "float32" and (q.dtype != torch.float32 or t * k.shape[2] < _WRITTEN_PREFILL_MIN_SCORES):
            return False
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] or k.shape[2] == 0:  # no heads, or an empty cache: left to eager
        return False
    if mask is not None:  # a mask that grows the scores (more rows, batches or heads) is not the kernel's
        scores = (q.shape[0], q.shape[1], t, k.shape[2])
        try:
            if tuple(torch.broadcast_shapes(mask.shape, scores)) != scores:
                return False
        except RuntimeError:
            return False
    return True


def _kernel_by_length(match: Match) -> str:
    """The name a fired attention form is counted under (GRAPHEX_LOG, CompiledGraph.report): the kernel it runs."""
    return "decode_attention" if val(match, "q").shape[2] == 1 else "prefill_attention"


def _prefill_kernel(match: Match) -> str:  # SDPA's is_causal forms run prefill_attention at every length
    return "prefill_attention"


def _attention_examples() -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, list[torch.Tensor]]]:
    """q, the keys per GQA form (2 heads repeated, 4 heads as q has; "broadcast": one key/value head that matmul or
    SDPA's math path broadcasts to every query head, Falcon's multi-query attention), the masks per kind."""
    t = torch.randn
    masks = {"bool": [torch.ones(1, 1, 1, 6, dtype=torch.bool)], "additive": [torch.zeros(1, 1, 1, 6)], "none": []}
    kv = t(1, 2, 6, 8)
    keys = {"repeat_kv": kv, "repeat_interleave": kv, "broadcast": t(1, 1, 6, 8), "none": t(1, 4, 6, 8)}
    return t(1, 4, 1, 8), keys, masks


def _register_written_attention(dtype: torch.dtype | None) -> None:
    """The written-out attention forms: float32 ones (dtype None; where softmax(s.float()).to(q.dtype) is
    softmax(s)), or the float32 softmax of a `dtype` model (transformers' eager attention, this repo's decoder)."""
    q, keys, masks = _attention_examples()

    def cast(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return [x.to(dtype) if dtype is not None and x.is_floating_point() else x for x in ts]

    # Note [A prefill's query is a transpose]: models make q as proj(x).view(B, T, H, D).transpose(1, 2). For one token,
    # or one sequence, matmul folds that into its batch as a view; for many tokens of more than one sequence it copies
    # q first (expand, clone, _unsafe_view): another graph. So in the float32 group (the one whose written forms fuse a
    # prefill) each form is traced once more on such a q, two sequences of three tokens.
    examples = [(q, keys, masks)]
    if dtype is None:
        q_rows = torch.randn(2, 3, 4, 8).transpose(1, 2)
        examples.append((q_rows, {g: torch.cat([x, x]) for g, x in keys.items()},
                         {"bool": [torch.ones(1, 1, 3, 6, dtype=torch.bool)], "additive": [torch.zeros(1, 1, 3, 6)],
                          "none": []}))
    for q_example, keys_example, masks_example in examples:
        for gqa in _GQA:  # "none" also matches a broadcast key/value head: matmul expands both sides
            k = keys_example[gqa]
            for kind in _MASKS:
                written_ok = all_of(float_cpu("q", "k", "v"), _attention_check(kind, prefill="written"))
                unmasked, upcast = kind == "none", dtype is not None
                inputs = cast([q_example, k, k.clone(), *masks_example[kind]])
                register_named("decode_attention", _written_form(gqa, True, kind, upcast),
                               unmasked_attention_fused_div if unmasked else decode_attention_fused,
                               inputs, extra_check=all_of(written_ok, number("inv_scale")),
                               scalar_workaround={"inv_scale": 7.25}, builtin=True, count_as=_kernel_by_length)
                register_named("decode_attention", _written_form(gqa, False, kind, upcast),
                               unmasked_attention_fused if unmasked else written_attention_fused,
                               inputs, extra_check=all_of(written_ok, number("scale")),
                               scalar_workaround={"scale": 0.3125}, builtin=True, count_as=_kernel_by_length)
    for gqa in ("repeat_kv", "none"):
        for kind in ("additive", "none"):  # Gemma2's capped scores
            register_named("decode_attention", _softcapped_form(gqa, kind, dtype is not None),
                           unmasked_softcapped_attention_fused if kind == "none" else softcapped_attention_fused,
                           cast([q, keys[gqa], keys[gqa].clone(), *masks[kind]]),
                           extra_check=all_of(float_cpu("q", "k", "v"), _attention_check(kind), number("scale"), _a_cap),
                           scalar_workaround={"scale": 0.3125, "softcap": 7.5}, builtin=True)
    for kind in ("additive", "none"):  # SDPA's math path: a bool mask reaches it as an additive one
        unmasked = kind == "none"
        k = keys["broadcast"]
        register_named("decode_attention", _math_form(kind, dtype is not None),
                       unmasked_math_attention_fused if unmasked else math_attention_fused,
                       cast([q, k, k.clone(), *masks[kind]]),
                       extra_check=all_of(float_cpu("q", "k", "v"), _attention_check(kind), _sdpa_scales),
                       scalar_workaround={"sq": 0.3125, "sk": 0.4375}, builtin=True)


# Bloom's attention (transformers' BloomAttention): the ALiBi bias added by baddbmm(alibi, q, k^T, beta=1, alpha=scale) on
# heads folded into the batch, then the causal mask, a float32 softmax and bmm with v. One kernel call: the bias is the
# ALiBi row plus the mask, added to the scaled score (decode_attention's additive mask). float32 only: in bfloat16 eager
# rounds baddbmm's fused sum once and the mask's add again, an order of roundings the kernel's round_scores does not
# follow, so those graphs keep eager's kernels.

def alibi_attention(q, k, v, alibi, mask, inv_norm):
    bh = q.shape[0] * q.shape[1]
    q3 = q.reshape(bh, -1, q.shape[-1])
    k3 = k.reshape(bh, -1, k.shape[-1]).transpose(1, 2)  # Note [Arguments are matched in one spelling]
    scores = alibi.baddbmm(batch1=q3, batch2=k3, beta=1.0, alpha=inv_norm)
    weights = scores.view(q.shape[0], q.shape[1], q.shape[2], -1) + mask
    probs = torch.softmax(weights, dim=-1)  # Bloom's softmax(..., dtype=float32) on float32 scores
    return torch.bmm(probs.view(bh, q.shape[2], -1), v.reshape(bh, -1, v.shape[-1]))


def alibi_attention_fused(q, k, v, alibi, mask, inv_norm):
    b, h, t, d = q.shape
    bias = alibi.view(b, h, 1, k.shape[2]) + mask  # the ALiBi row and the mask, added to each scaled score
    return fused.decode_attention(q, k, v, bias, inv_norm).view(b * h, t, d)


def _alibi_one_token(match: Match) -> bool:
    """One query token over a cache of as many heads (Bloom has no grouped heads), float32; the ALiBi bias one row per
    head [B * H, 1, S] and the mask of q's dtype broadcasting to the scores [B, H, 1, S] without growing them."""
    q, k, v, alibi, mask = (val(match, n) for n in ("q", "k", "v", "alibi", "mask"))
    if not all(isinstance(x, torch.Tensor) for x in (q, k, v, alibi, mask)) or q.dtype != torch.float32:
        return False
    if q.dim() != 4 or k.dim() != 4 or tuple(k.shape) != tuple(v.shape) or q.shape[2] != 1:
        return False
    b, h, _, d = q.shape
    s = k.shape[2]
    if tuple(k.shape) != (b, h, s, d) or s == 0 or h == 0:
        return False
    if tuple(alibi.shape) != (b * h, 1, s) or alibi.dtype != q.dtype or mask.dtype != q.dtype or mask.dim() > 4:
        return False
    try:
        return tuple(torch.broadcast_shapes(mask.shape, (b, h, 1, s))) == (b, h, 1, s)
    except RuntimeError:
        return False


def _register_alibi_attention() -> None:
    t = torch.randn
    q, k = t(1, 4, 1, 8), t(1, 4, 6, 8)
    register_named("decode_attention", alibi_attention, alibi_attention_fused,
                   [q, k, k.clone(), t(4, 1, 6), torch.zeros(1, 1, 1, 6)],
                   extra_check=all_of(float_cpu("q", "k", "v", "alibi", "mask"), _alibi_one_token, number("inv_norm")),
                   scalar_workaround={"inv_norm": 0.3125}, builtin=True)


def register_attention(dtype: torch.dtype | None) -> None:
    """The attention forms of one group: the written-out ones of `dtype` (None: the common group, whose ops name no
    dtype) and, in the common group, the SDPA forms. The GQA forms before the plain one (a GQA match contains the
    plain form's), written-out forms anchored at their last matmul, SDPA at its call."""
    _register_written_attention(dtype)
    if dtype is not None:
        return
    _register_alibi_attention()
    q, keys, masks = _attention_examples()
    for gqa in _GQA:
        k = keys[gqa]
        for scaled in (True, False):
            for kind in (*_MASKS, "causal"):
                if kind == "causal" and gqa == "none":  # the graph already runs the kernel prefill_attention would
                    continue
                # many query rows: only where the repeat's copy is saved (Note [Which attention forms a prefill fuses])
                prefill = "sdpa" if gqa != "none" else None
                inputs = [q, k, k.clone(), *masks.get(kind, [])]
                checks = [float_cpu("q", "k", "v"), _attention_check(kind, prefill)] + ([number("scale")] if scaled else [])
                register_named("decode_attention", _sdpa_form(gqa, scaled, kind), _sdpa_fused_form(scaled, kind),
                               inputs, extra_check=all_of(*checks),
                               scalar_workaround={"scale": 0.3125} if scaled else None, builtin=True,
                               count_as=_prefill_kernel if kind == "causal" else _kernel_by_length)
