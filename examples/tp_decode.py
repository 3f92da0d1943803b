"""Tensor-parallel decoding with graphex: one graph per rank, bitwise equal to eager.

    torchrun --nproc-per-node 2 examples/tp_decode.py [--steps 16] [--timeout 60] [--cache-dir DIR]

Every rank builds the shipped decoder (examples/models/decoder.py, same seed), keeps its shard
(examples/models/tp_decoder.py: column-parallel q/k/v and gate/up, row-parallel o/down with
all_reduce, KV cache sharded by heads, vocab-parallel head with all_gather) and decodes greedily:

1. the TP model in eager mode;
2. the same TP model through graphex (torch.compile, or cache_compile with --cache-dir): the
   logits of every step and the KV-cache shards must be bitwise equal to 1., every step must run
   on the engine (graphex._C.total_run_count);
3. the single-process model in eager mode: the tokens must be the same as 1. (the logits differ
   in the last bits: a row-parallel matmul adds its partial sums in another order).

Exit status 0 when all hold on this rank, 1 otherwise. A rank that dies or never arrives makes the
others fail within --timeout seconds (the process group's timeout) with graphex's error naming the
collective, never a hang. --json prints one line per rank: TP_DECODE {...}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import graphex  # noqa: E402
from examples.models.decoder import build_decoder, decode  # noqa: E402
from examples.models.tp_decoder import TPDecoder  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--timeout", type=float, default=float(os.environ.get("GRAPHEX_TP_TIMEOUT", 60)),
                   help="seconds a collective may wait for the other ranks (process group timeout; "
                        "default 60, or $GRAPHEX_TP_TIMEOUT)")
    p.add_argument("--cache-dir", default=None, help="use graphex.inference.cache_compile with this directory")
    p.add_argument("--exit-at-step", type=int, default=None, help=argparse.SUPPRESS)  # fault test: rank 1 exits
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    full = build_decoder()
    tp = TPDecoder(full)

    with torch.no_grad():
        eager_cache = tp.new_cache()
        eager = decode(tp, args.steps, cache=eager_cache)

        if args.cache_dir:
            compiled = graphex.inference.cache_compile(tp.forward, cache_dir=args.cache_dir)
        else:
            compiled = torch.compile(tp, backend="graphex", fullgraph=True, dynamic=False)
        graph_cache = tp.new_cache()
        runs_before = graphex._C.total_run_count()
        step_ms: list[float] = []
        last = [time.perf_counter()]

        def on_step(step, logits, k, v):
            now = time.perf_counter()
            step_ms.append((now - last[0]) * 1e3)
            last[0] = now
            if args.exit_at_step is not None and rank == 1 and step + 1 == args.exit_at_step:
                os._exit(3)  # a rank dying mid-run (tests/python/test_distributed_tp.py)

        graph = decode(compiled, args.steps, cache=graph_cache, on_step=on_step)
        engine_runs = graphex._C.total_run_count() - runs_before
        single = decode(full, args.steps)

    tokens = [int(l[0, -1].argmax()) for l in eager]
    report = {
        "rank": rank, "world": world, "steps": args.steps,
        "logits_equal": all(torch.equal(a, b) for a, b in zip(graph, eager)),
        "cache_equal": torch.equal(graph_cache[0], eager_cache[0]) and torch.equal(graph_cache[1], eager_cache[1]),
        "tokens": tokens,
        "tokens_graphex": [int(l[0, -1].argmax()) for l in graph],
        "tokens_single_process": [int(l[0, -1].argmax()) for l in single],
        "max_abs_diff_vs_single_process": max(float((a - b).abs().max()) for a, b in zip(eager, single)),
        "engine_runs": engine_runs,
        "first_step_ms": round(step_ms[0], 1),
        "median_step_ms": round(sorted(step_ms[1:])[len(step_ms[1:]) // 2], 2) if len(step_ms) > 1 else None,
    }
    if args.cache_dir:
        report["cache"] = dict(compiled.stats)
    ok = (report["logits_equal"] and report["cache_equal"] and report["tokens_graphex"] == tokens
          and report["tokens_single_process"] == tokens and engine_runs == args.steps)
    report["ok"] = ok
    if args.json:
        print("TP_DECODE " + json.dumps(report), flush=True)
    elif rank == 0 or not ok:
        print(f"rank {rank} of {world}: {args.steps} steps, tokens {tokens}\n"
              f"  graphex == TP eager, bitwise: logits {report['logits_equal']}, KV cache {report['cache_equal']}; "
              f"{engine_runs} of {args.steps} steps on the engine\n"
              f"  tokens == single-process model: {report['tokens_single_process'] == tokens} "
              f"(logits max abs diff {report['max_abs_diff_vs_single_process']:.2e})\n"
              f"  graphex step: first {report['first_step_ms']} ms (capture), then median "
              f"{report['median_step_ms']} ms" + (f"; cache {report['cache']}" if args.cache_dir else ""))
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
