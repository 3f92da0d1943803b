"""`make demo`: compile the shipped decoder with graphex, check it against eager, time both.

    python examples/demo.py [--steps N] [--repeat N]

Greedy-decodes N tokens with the eager model and with the graphex-compiled one,
checks that logits and KV caches are bit-for-bit equal at every step, then
prints median decode-step latency. Done for the plain-PyTorch decoder and for the
same decoder built on the C++ example operators (examples/ops), which must give
the very same bits.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import graphex  # noqa: E402,F401  (registers the backend; the entry point would too)
from examples.models.decoder import DecoderConfig, build_decoder  # noqa: E402


def decode_and_compare(model, compiled, steps: int) -> float:
    """Run both side by side; returns graphex's first-call time in seconds."""
    k_ref, v_ref = model.new_cache()
    k, v = model.new_cache()
    tokens_ref = tokens = torch.tensor([[1]])
    first_call = 0.0
    for step in range(steps):
        pos = torch.tensor([step])
        expected = model(tokens_ref, pos, k_ref, v_ref)
        start = time.perf_counter()
        actual = compiled(tokens, pos, k, v)
        if step == 0:
            first_call = time.perf_counter() - start
        for name, a, b in (("logits", actual, expected), ("k cache", k, k_ref), ("v cache", v, v_ref)):
            if not torch.equal(a, b):
                raise SystemExit(f"demo: {name} differ from eager at step {step}")
        tokens_ref = expected[:, -1].argmax(-1, keepdim=True)
        tokens = actual[:, -1].argmax(-1, keepdim=True)
    return first_call


def median_step_us(fn, model, repeat: int) -> float:
    k, v = model.new_cache()
    tokens, pos = torch.tensor([[1]]), torch.tensor([7])
    for _ in range(10):
        fn(tokens, pos, k, v)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(tokens, pos, k, v)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16, help="tokens to decode for the equality check")
    parser.add_argument("--repeat", type=int, default=300, help="timed decode steps per backend")
    args = parser.parse_args()

    model = build_decoder()
    with_ops = build_decoder(DecoderConfig(custom_ops=True))  # same seed: same weights
    cfg = model.cfg
    print(f"decoder: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, "
          f"KV cache of {cfg.max_positions} positions, batch 1, one token per step")
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    compiled_ops = torch.compile(with_ops, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        first = decode_and_compare(model, compiled, args.steps)
        print(f"graphex == eager, bit for bit: logits and KV caches at all {args.steps} steps")
        first_ops = decode_and_compare(model, compiled_ops, args.steps)
        print("graphex with the C++ custom ops (rms_norm, rotary_embedding, kv_cache_update_) == eager, "
              "bit for bit")
        # Interleave the runs so that drift in machine speed affects all alike.
        runs: dict[str, list[float]] = {"eager": [], "graphex": [], "graphex + custom ops": []}
        per_round = max(1, args.repeat // 5)  # --repeat below 5 still times one step per round
        for _ in range(5):
            runs["eager"].append(median_step_us(model, model, per_round))
            runs["graphex"].append(median_step_us(compiled, model, per_round))
            runs["graphex + custom ops"].append(median_step_us(compiled_ops, model, per_round))
    medians = {name: statistics.median(times) for name, times in runs.items()}
    e = medians["eager"]
    print()
    print("| backend | median decode step | vs eager |")
    print("|---|---:|---:|")
    for name, m in medians.items():
        print(f"| {name:20s} | {m:8.1f} us | {m / e:.2f}x |")
    print()
    print(f"graphex first call (trace + capture + first step): {first * 1000:.0f} ms; "
          f"with custom ops: {first_ops * 1000:.0f} ms")


if __name__ == "__main__":
    main()
