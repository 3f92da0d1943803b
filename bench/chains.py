"""Fused mode's rules (graphex/fusion/chains.py, pooling.py), measured: GPT-2's written-out tanh GELU, eight ATen calls,
under eager, graphex exact, graphex fused (one graphex_fused::pointwise) and inductor; then max pooling, eager's
max_pool2d_with_indices against graphex_fused::max_pool2d (the kernels alone, called directly).

    python -m bench.chains [--rounds 8] [--round-s 0.3] [--threads 1] [--no-inductor]

Shapes: one decode token of a 4 x 768 MLP ([1, 1, 3072]) and a 128-token prefill ([1, 128, 2048]); float32 and
bfloat16. One process, interleaved rounds (bench/measure.py), medians of every call. Each call goes through
torch.compile (Dynamo's guards included), so on one token most of each median is the per-call cost; the
`fused / exact` column is what the chain saves there.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from bench import measure


def gelu_new(x: torch.Tensor) -> torch.Tensor:  # transformers' NewGELUActivation (GPT-2)
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--round-s", type=float, default=0.3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import graphex  # noqa: F401  (registers the backend)

    print(f"GPT-2's tanh GELU (8 ATen calls), {args.threads} thread(s), {args.rounds} interleaved rounds; medians, us")
    print(f"  {'shape':16s} {'dtype':9s} {'eager':>8s} {'exact':>8s} {'fused':>8s} {'inductor':>9s} "
          f"{'fused/exact':>12s} {'fused/inductor':>15s}  max |fused - eager|")
    if not args.no_inductor:
        measure.configure_cold_inductor()
    for shape in ((1, 1, 3072), (1, 128, 2048)):
        for dtype in (torch.float32, torch.bfloat16):
            torch._dynamo.reset()
            torch.manual_seed(0)
            x = torch.randn(shape).to(dtype)
            fns = {
                "eager": gelu_new,
                "exact": torch.compile(gelu_new, backend="graphex", fullgraph=True, dynamic=False),
                "fused": torch.compile(gelu_new, backend="graphex", fullgraph=True, dynamic=False,
                                       options={"pattern_fusion_pass": True}),
            }
            if not args.no_inductor:
                fns["inductor"] = torch.compile(gelu_new, backend="inductor", fullgraph=True, dynamic=False)
            outs = {n: f(x) for n, f in fns.items()}
            samples = measure.interleaved({n: measure.call_runner(f, (x,)) for n, f in fns.items()}, args.rounds,
                                          args.round_s)
            med = {n: measure.summarize(s)["median_us"] for n, s in samples.items()}
            ind = med.get("inductor")
            diff = (outs["fused"].double() - outs["eager"].double()).abs().max().item()
            print(f"  {str(list(shape)):16s} {str(dtype)[6:]:9s} {med['eager']:8.1f} {med['exact']:8.1f} "
                  f"{med['fused']:8.1f} {ind if ind is not None else float('nan'):9.1f} "
                  f"{med['fused'] / med['exact']:11.2f}x "
                  f"{(med['fused'] / ind) if ind else float('nan'):14.2f}x  {diff:.3g}")
    print("max pooling, the kernels alone: eager's max_pool2d_with_indices, graphex_fused::max_pool2d; medians, us")
    for shape, k, st, p in (((1, 32, 64, 64), [2, 2], [2, 2], [0, 0]), ((1, 64, 112, 112), [3, 3], [2, 2], [1, 1])):
        x = torch.randn(shape)
        pools = {"eager": lambda x: torch.ops.aten.max_pool2d_with_indices(x, k, st, p),
                 "graphex": lambda x: torch.ops.graphex_fused.max_pool2d(x, k, st, p, [1, 1], False)}
        samples = measure.interleaved({n: measure.call_runner(f, (x,)) for n, f in pools.items()}, args.rounds,
                                      args.round_s)
        med = {n: measure.summarize(s)["median_us"] for n, s in samples.items()}
        same = torch.equal(pools["eager"](x)[0], pools["graphex"](x))
        print(f"  {str(list(shape)):18s} kernel {k} stride {st} padding {p}: eager {med['eager']:8.1f}  "
              f"graphex {med['graphex']:8.1f}  ({med['graphex'] / med['eager']:.2f}x)  bit for bit: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
