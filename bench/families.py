"""One-token decode steps of nine transformers families: eager, graphex exact and fused, inductor (issue 21 point 7).

    python -m bench.families [--arch llama,qwen2,...] [--dtype float32,bfloat16] [--threads 1] [--rounds 5]
                             [--round-s 0.4] [--position 100] [--json P]

Each family is built from a config with random weights at one size (bench/models.py: `hf_family`, hidden 256,
4 layers, 4 query heads of 64, 2 key/value heads where the family has them), runs an eager prefill of 8 tokens
into a `StaticCache` of 256 positions (filled with random keys and values), then times the step that decodes
one token at `--position` (`FamilyStep`: the cache's length is set first, so every call rewrites the same
slot). Per family and dtype: medians of interleaved rounds (bench/measure.py), the ratios fused / inductor and
fused / eager, which fused kernels fired, and the largest logit difference from eager. Inductor compiles cold.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from typing import Any

import torch

from bench import measure

BACKENDS = ("eager", "graphex", "graphex_fused", "inductor")


def measure_family(arch: str, dtype: torch.dtype, backends: list[str], position: int, rounds: int,
                   round_s: float) -> dict[str, Any]:
    from graphex.compile import on_capture

    from . import models

    tokens = torch.tensor([[7]])
    pos = torch.tensor(position)
    steps = {b: models.FamilyStep(models.hf_family(arch, "bench", dtype), models.CACHE_LEN["bench"], position) for b in backends}
    fns, first_s, outs, fired = {}, {}, {}, {}
    # One reset per family, not per backend: a reset drops every compiled frame, and the backends compiled before it
    # would compile again inside the timed rounds (each backend has its own module, so their entries coexist).
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for b in backends:
            captured: list[Any] = []
            fns[b] = measure.compile_for(b, steps[b])  # the one backend table of the benchmarks
            t0 = time.perf_counter()
            with on_capture(lambda dynamo_graph, compiled: captured.append(compiled)):
                outs[b] = fns[b](tokens, pos).float().clone()
            first_s[b] = time.perf_counter() - t0
            fired[b] = {}
            for c in captured:
                for k, v in c.fused.items():
                    fired[b][k] = fired[b].get(k, 0) + v

        def runner(fn: Any) -> Any:
            def run(seconds: float) -> list[float]:
                out, end = [], time.perf_counter() + seconds
                with torch.no_grad():
                    while time.perf_counter() < end:
                        t0 = time.perf_counter()
                        fn(tokens, pos)
                        out.append((time.perf_counter() - t0) * 1e6)
                return out

            return run

        samples = measure.interleaved({b: runner(f) for b, f in fns.items()}, rounds, round_s)
    med = {b: measure.summarize(s)["median_us"] for b, s in samples.items()}
    row: dict[str, Any] = {"arch": arch, "dtype": str(dtype).replace("torch.", ""), "median_us": med,
                           "first_call_s": first_s, "fired": fired.get("graphex_fused", {}),
                           "max_diff": {b: (outs[b] - outs["eager"]).abs().max().item() for b in backends},
                           "exact_bitwise": torch.equal(outs.get("graphex", outs["eager"]), outs["eager"])}
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| family | dtype | eager | graphex exact | graphex fused | inductor | fused / inductor | fused / eager "
             "| fused kernels | max logit diff (fused) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        m = r["median_us"]
        ratio = m["graphex_fused"] / m["inductor"] if "inductor" in m and "graphex_fused" in m else float("nan")
        fired = ", ".join(f"{k} x{v}" for k, v in sorted(r["fired"].items())) or "-"
        cols = " | ".join(f"{m[b]:.0f}" if b in m else "-" for b in BACKENDS)
        lines.append(f"| {r['arch']} | {r['dtype']} | {cols} | {ratio:.2f}x | "
                     f"{m.get('graphex_fused', float('nan')) / m['eager']:.2f}x | {fired} | "
                     f"{r['max_diff'].get('graphex_fused', float('nan')):.2g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from . import models

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default=",".join(models.HF_FAMILIES))
    ap.add_argument("--dtype", default="float32,bfloat16")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--round-s", type=float, default=0.4)
    ap.add_argument("--position", type=int, default=100)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    measure.configure_cold_inductor()
    backends = args.backends.split(",")
    if "eager" not in backends:
        backends.insert(0, "eager")
    rows = []
    for dtype in args.dtype.split(","):
        for arch in args.arch.split(","):
            t0 = time.perf_counter()
            row = measure_family(arch, getattr(torch, dtype), backends, args.position, args.rounds, args.round_s)
            rows.append(row)
            m = row["median_us"]
            print(f"{arch:9s} {dtype:9s} " + "  ".join(f"{b} {m[b]:7.0f}" for b in backends)
                  + f"  fused/inductor {m.get('graphex_fused', 0) / m.get('inductor', float('nan')):.2f}x"
                  + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"\none-token decode step, {args.threads} thread(s), position {args.position}, medians in us, "
          f"torch {torch.__version__}")
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
