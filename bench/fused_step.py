"""Exact vs fused mode on the shipped decoder's one-token step: eager, graphex, graphex fused.

    python -m bench.fused_step [--rounds 10] [--round-s 0.5] [--threads 1] [--position 100] [--inductor]
                               [--dtype float32|bfloat16|float16]

One process, interleaved rounds (bench/measure.py), medians of every call. The step decodes one
token at `position` with a KV cache filled up to there (so attention reads a realistic prefix).
Prints the medians, the ratios to eager, the number of ops each captured program runs, the
weight floor (one GEMV over as many bytes as the weights, measure.gemv_floor_us), and the
fused program's max logits difference from eager.
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench import measure


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--round-s", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--position", type=int, default=100)
    ap.add_argument("--inductor", action="store_true", help="also time inductor (cold compile, not bitwise)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="the model's and the KV cache's dtype")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    import graphex
    from examples.models.decoder import build_decoder

    dtype = getattr(torch, args.dtype)
    model = build_decoder().to(dtype)
    k, v = model.new_cache(dtype=dtype)
    torch.manual_seed(1)
    k.normal_()
    v.normal_()
    tokens, pos = torch.tensor([[3]]), torch.tensor([args.position])
    fns = {
        "eager": model,
        "graphex": torch.compile(model, backend="graphex", fullgraph=True, dynamic=False),
        "graphex_fused": torch.compile(model, backend="graphex", fullgraph=True, dynamic=False,
                                       options={"pattern_fusion_pass": True}),
    }
    if args.inductor:
        measure.configure_cold_inductor()
        fns["inductor"] = torch.compile(model, backend="inductor", fullgraph=True, dynamic=False)
    ops, outs = {}, {}
    with torch.no_grad():
        for name, fn in fns.items():
            before = len(graphex.runtime.live_graphs())
            outs[name] = fn(tokens, pos, k, v)
            graphs = graphex.runtime.live_graphs()[before:]
            ops[name] = sum(g.num_ops for g in graphs) if graphs else None

        def runner(fn):
            def run(seconds: float) -> list[float]:
                import time

                out, end = [], time.perf_counter() + seconds
                with torch.no_grad():
                    while time.perf_counter() < end:
                        t0 = time.perf_counter()
                        fn(tokens, pos, k, v)
                        out.append((time.perf_counter() - t0) * 1e6)
                return out

            return run

        samples = measure.interleaved({n: runner(f) for n, f in fns.items()}, args.rounds, args.round_s)
    medians = {n: measure.summarize(s)["median_us"] for n, s in samples.items()}
    print(f"decoder one-token step ({args.dtype}) at position {args.position}, {args.threads} thread(s), "
          f"{args.rounds} interleaved rounds of {args.round_s} s")
    for name, us in medians.items():
        print(f"  {name:14s} median {us:8.1f} us  {us / medians['eager']:.2f}x eager"
              f"  ops {ops[name] if ops[name] is not None else '-'}")
    nbytes = measure.weight_bytes(model)
    floor = measure.gemv_floor_us(nbytes)  # make bench's floor (report.floor_table), at this thread count
    print(f"  weight-streaming floor: one GEMV over {nbytes / 1e6:.2f} MB (the weights' bytes) = {floor:.1f} us "
          f"({nbytes / floor / 1e3:.1f} GB/s); fused is {medians['graphex_fused'] / floor:.1f}x the floor")
    print(f"  graphex bitwise equal to eager: {torch.equal(outs['graphex'], outs['eager'])}")
    for name in ("graphex_fused", "inductor"):
        if name in outs:
            print(f"  {name} max |logits - eager|: {(outs[name] - outs['eager']).abs().max().item():.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
