"""Fused mode on a prefill, measured: attention over many query rows (graphex_fused::prefill_attention) and the
residual add + LayerNorm (graphex_fused::add_layer_norm), under eager, graphex exact, graphex fused and inductor.

    python -m bench.prefill [--rounds 6] [--round-s 0.3] [--threads 1] [--tokens 128,512,1024] [--no-inductor]

Attention: a Llama-style grouped-query block's attention alone, 8 query heads and 2 key/value heads of 64, q of
`tokens` rows over as many positions with a causal mask, three spellings: transformers' eager attention written out
(repeat_kv, matmul, scale, + mask, softmax, matmul) in float32; SDPA after repeat_kv in float32 and in bfloat16.
add + LayerNorm: GPT-2's residual stream, [1, tokens, 768]. One process, interleaved rounds (bench/measure.py),
medians of every call, each through torch.compile (Dynamo's per-call cost included).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

from bench import measure

H, HKV, D = 8, 2, 64


def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:  # transformers' repeat_kv
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def written_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = q.shape[1] // k.shape[1]
    scores = torch.matmul(q, _repeat_kv(k, n).transpose(2, 3)) * (1.0 / math.sqrt(q.shape[-1])) + mask
    return torch.matmul(torch.softmax(scores, dim=-1), _repeat_kv(v, n))


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, _repeat_kv(k, n), _repeat_kv(v, n), attn_mask=mask)


class ResidualLayerNorm(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + r
        return self.ln(h), h


def _leaves(x: Any) -> list[torch.Tensor]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _row(label: str, fn: Callable[..., Any], args: tuple[Any, ...], rounds: int, round_s: float,
         inductor: bool) -> None:
    torch._dynamo.reset()
    fns = {"eager": fn,
           "exact": torch.compile(fn, backend="graphex", fullgraph=True, dynamic=False),
           "fused": torch.compile(fn, backend="graphex", fullgraph=True, dynamic=False,
                                  options={"pattern_fusion_pass": True})}
    if inductor:
        fns["inductor"] = torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False)
    with torch.no_grad():
        outs = {n: _leaves(f(*args)) for n, f in fns.items()}
        samples = measure.interleaved({n: measure.call_runner(f, args) for n, f in fns.items()}, rounds, round_s)
    med = {n: measure.summarize(s)["median_us"] for n, s in samples.items()}
    ind = med.get("inductor")
    diff = max((a.double() - b.double()).abs().max().item() for a, b in zip(outs["fused"], outs["eager"]))
    exact_same = all(torch.equal(a, b) for a, b in zip(outs["exact"], outs["eager"]))
    print(f"  {label:34s} {med['eager']:9.1f} {med['exact']:9.1f} {med['fused']:9.1f} "
          f"{ind if ind is not None else float('nan'):9.1f} {med['fused'] / med['exact']:10.2f}x "
          f"{(med['fused'] / ind) if ind else float('nan'):12.2f}x  {diff:9.2g}  {'yes' if exact_same else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--round-s", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", default="128,512,1024")
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import graphex  # noqa: F401  (registers the backend)

    if not args.no_inductor:
        measure.configure_cold_inductor()
    print(f"prefill, {args.threads} thread(s), {args.rounds} interleaved rounds; medians, us "
          f"(attention: {H} query / {HKV} key-value heads of {D}, causal mask)")
    print(f"  {'workload':34s} {'eager':>9s} {'exact':>9s} {'fused':>9s} {'inductor':>9s} {'fused/exact':>11s} "
          f"{'fused/inductor':>13s}  {'max diff':>9s}  exact bitwise")
    for t in (int(x) for x in args.tokens.split(",")):
        g = torch.Generator().manual_seed(t)
        mask = torch.zeros(t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))[None, None]
        q = torch.randn(1, t, H, D, generator=g).transpose(1, 2)  # as models make q: a transpose
        k, v = torch.randn(1, HKV, t, D, generator=g), torch.randn(1, HKV, t, D, generator=g)
        _row(f"written attention f32, {t} tokens", written_attention, (q, k, v, mask), args.rounds, args.round_s,
             not args.no_inductor)
        _row(f"SDPA + repeat_kv f32, {t} tokens", sdpa_attention, (q, k, v, mask), args.rounds, args.round_s,
             not args.no_inductor)
        bf = tuple(x.bfloat16() for x in (q, k, v, mask))
        _row(f"SDPA + repeat_kv bf16, {t} tokens", sdpa_attention, bf, args.rounds, args.round_s, not args.no_inductor)
        block = ResidualLayerNorm(768).eval()
        x, r = torch.randn(1, t, 768, generator=g), torch.randn(1, t, 768, generator=g)
        _row(f"add + LayerNorm f32, {t} x 768", block, (x, r), args.rounds, args.round_s, not args.no_inductor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
