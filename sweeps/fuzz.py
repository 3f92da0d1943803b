"""`python -m sweeps.fuzz`: the differential fuzzer (`make fuzz`).

    python -m sweeps.fuzz --seed 0 --count 10000 --batch 4   # programs seed .. seed+count-1 (make fuzz)
    python -m sweeps.fuzz --count 160 --batch 4 --quick      # what `make test` runs

With --batch K, K programs are merged into one (side by side, fuzz_gen.merge) and compiled once: bigger graphs
for the passes, and fewer Dynamo compiles (about 1.5-2x faster here at K=4..8). A failing batch is shrunk as one
program, so its reproducer keeps only what the failure needs.

Each program (sweeps/fuzz_gen.py) runs in eager and under graphex (Note [What a fuzzed program must match]);
each graphex-only failure is shrunk and written as OUT/repro_SEED.py, a script that re-runs it. Prints
progress, then the counts; OUT/summary.json holds them. Exit status 1 when graphex failed any program.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from collections import Counter
from typing import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweeps.fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="first program's seed")
    p.add_argument("--count", type=int, default=10000, help="programs to run")
    p.add_argument("--batch", type=int, default=1, help="programs merged into one compiled graph")
    p.add_argument("--max-statements", type=int, default=8)
    p.add_argument("--time-limit", type=float, default=30.0, help="seconds per program before it counts as timeout")
    p.add_argument("--out", default=os.path.join(HERE, "results", "fuzz"), help="where reproducers and summary.json go")
    p.add_argument("--quick", action="store_true", help="print failures and the summary only")
    args = p.parse_args(argv)

    warnings.simplefilter("ignore")
    for name in ("torch._dynamo", "torch._inductor", "torch.fx", "torch._functorch", "torch._subclasses"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    import graphex.custom_ops

    from .fuzz_gen import generate, merge
    from .fuzz_run import FAILURES, check, shrink, write_reproducer

    counts: Counter[str] = Counter()
    failures = []
    examples: dict[str, list[dict[str, object]]] = {}  # a few programs per other outcome (invalid, not_graphex, ...)
    start = time.perf_counter()
    done = 0
    for first in range(args.seed, args.seed + args.count, args.batch):
        seeds = range(first, min(first + args.batch, args.seed + args.count))
        programs = [generate(seed, args.max_statements) for seed in seeds]
        program = programs[0] if len(programs) == 1 else merge(programs)
        outcome = check(program, first, args.time_limit)
        counts[outcome.kind] += len(programs)
        if outcome.kind not in ("ok", *FAILURES) and len(examples.setdefault(outcome.kind, [])) < 5:
            examples[outcome.kind].append({"seed": first, "detail": outcome.detail})
        if outcome.kind in FAILURES:
            small = shrink(program, first, outcome, args.time_limit)
            path = write_reproducer(args.out, small, first, outcome)
            failures.append({"seed": first, "programs": len(programs), "kind": outcome.kind, "detail": outcome.detail,
                             "reproducer": path})
            print(f"seed {first}: {outcome.kind}: {outcome.detail}\n  shrunk to {len(small.statements)} statements: "
                  f"python {path}", flush=True)
        before, done = done, done + len(programs)
        if done // 200 != before // 200:
            graphex.custom_ops.reset_dynamo()  # drop Dynamo's caches of finished programs
        if done // 100 != before // 100 or done == args.count:
            _write_summary(args, done, time.perf_counter() - start, counts, failures, examples)  # kept if stopped
            if not args.quick:
                print(f"[{done:6d}/{args.count} {time.perf_counter() - start:7.1f}s] {dict(counts)}", flush=True)
    elapsed = time.perf_counter() - start
    print(f"fuzz: {args.count} programs from seed {args.seed} (batches of {args.batch}) in {elapsed:.1f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f"; graphex failures: {len(failures)}")
    return 1 if failures else 0


def _write_summary(args: argparse.Namespace, done: int, elapsed: float, counts: Counter[str],
                   failures: list[dict[str, object]], examples: dict[str, list[dict[str, object]]]) -> None:
    os.makedirs(args.out, exist_ok=True)
    summary = {"seed": args.seed, "count": args.count, "done": done, "batch": args.batch,
               "seconds": round(elapsed, 1), "counts": dict(counts), "failures": failures, "examples": examples}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
