"""Soak: many replays of the shipped decoder with resident memory flat, and threads sharing one compiled model.

    python -m bench.soak [--steps 100000] [--threads 4] [--json FILE]     (make soak)

Part 1 replays one decode step `--steps` times (positions cycle through the cache, so
every step writes the caches in place) and samples the process's resident set size
(RSS, /proc/self/statm) every `--every` steps after a warm-up; it fails if RSS grew by
more than `--max-growth-mib` between the first sample and the last. Part 2 runs
`--threads` threads that call the same compiled model at once, each with its own
caches, and checks every thread's logits and caches bit for bit against eager.
Exit status 0 when both hold.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import graphex  # noqa: E402,F401
from examples.models.decoder import DecoderConfig, build_decoder  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def replay_soak(steps: int, every: int, warmup: int, cfg: DecoderConfig) -> dict[str, Any]:
    model = build_decoder(cfg).eval()
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    k, v = model.new_cache()
    tokens = torch.tensor([[1]])
    samples: list[tuple[int, float]] = []
    start = time.perf_counter()
    with torch.no_grad():
        for step in range(steps):
            pos = torch.tensor([step % cfg.max_positions])
            logits = compiled(tokens, pos, k, v)
            tokens = logits[:, -1].argmax(-1, keepdim=True)
            if step + 1 >= warmup and (step + 1 - warmup) % every == 0:
                samples.append((step + 1, rss_mib()))
    samples.append((steps, rss_mib()))
    elapsed = time.perf_counter() - start
    first, last = samples[0][1], samples[-1][1]
    return {"steps": steps, "seconds": round(elapsed, 2), "us_per_step": round(elapsed / steps * 1e6, 1),
            "rss_first_mib": round(first, 2), "rss_last_mib": round(last, 2), "rss_max_mib": round(max(s for _, s in samples), 2),
            "rss_growth_mib": round(last - first, 2), "samples": [[n, round(m, 2)] for n, m in samples]}


def thread_soak(threads: int, steps: int, cfg: DecoderConfig) -> dict[str, Any]:
    model = build_decoder(cfg).eval()
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        compiled(torch.tensor([[1]]), torch.tensor([0]), *model.new_cache())  # compile once, before the threads
    failures: list[str] = []
    barrier = threading.Barrier(threads)

    def worker(index: int) -> None:
        try:
            with torch.no_grad():
                k, v = model.new_cache()
                k_ref, v_ref = model.new_cache()
                tokens = tokens_ref = torch.tensor([[index + 1]])
                barrier.wait(timeout=60)
                for step in range(steps):
                    pos = torch.tensor([step % cfg.max_positions])
                    got = compiled(tokens, pos, k, v)
                    want = model(tokens_ref, pos, k_ref, v_ref)
                    if not (torch.equal(got, want) and torch.equal(k, k_ref) and torch.equal(v, v_ref)):
                        failures.append(f"thread {index} step {step}: differs from eager")
                        return
                    tokens = got[:, -1].argmax(-1, keepdim=True)
                    tokens_ref = want[:, -1].argmax(-1, keepdim=True)
        except Exception as e:  # reported
            failures.append(f"thread {index}: {type(e).__name__}: {e}")

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=600)
    return {"threads": threads, "steps_per_thread": steps, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000, help="sample RSS every N steps")
    parser.add_argument("--warmup", type=int, default=1_000, help="steps before the first RSS sample")
    parser.add_argument("--max-growth-mib", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--thread-steps", type=int, default=50)
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (the shipped config has 4)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = DecoderConfig(layers=args.layers, max_positions=64)
    replay = replay_soak(args.steps, args.every, min(args.warmup, args.steps), cfg)
    print(f"replays: {replay['steps']} in {replay['seconds']} s ({replay['us_per_step']} us/step); RSS "
          f"{replay['rss_first_mib']} -> {replay['rss_last_mib']} MiB (growth {replay['rss_growth_mib']} MiB, "
          f"max {replay['rss_max_mib']} MiB)")
    threads = thread_soak(args.threads, args.thread_steps, cfg)
    print(f"threads: {threads['threads']} x {threads['steps_per_thread']} steps on one compiled model: "
          + ("all equal to eager" if not threads["failures"] else "; ".join(threads["failures"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"replay": replay, "threads": threads}, f, indent=2)
    ok = replay["rss_growth_mib"] <= args.max_growth_mib and not threads["failures"]
    print("soak: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
