"""`python -m sweeps.fuzz`: the differential fuzzer (`make fuzz`).

    python -m sweeps.fuzz --seed 0 --count 10000      # programs seed .. seed+count-1
    python -m sweeps.fuzz --count 150 --quick          # what `make test` runs

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
    p.add_argument("--max-statements", type=int, default=8)
    p.add_argument("--time-limit", type=float, default=30.0, help="seconds per program before it counts as timeout")
    p.add_argument("--out", default=os.path.join(HERE, "results", "fuzz"), help="where reproducers and summary.json go")
    p.add_argument("--quick", action="store_true", help="print failures and the summary only")
    args = p.parse_args(argv)

    warnings.simplefilter("ignore")
    for name in ("torch._dynamo", "torch._inductor", "torch.fx", "torch._functorch"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    import graphex.custom_ops

    from .fuzz_gen import generate
    from .fuzz_run import FAILURES, check, shrink, write_reproducer

    counts: Counter[str] = Counter()
    failures = []
    start = time.perf_counter()
    for n, seed in enumerate(range(args.seed, args.seed + args.count), 1):
        program = generate(seed, args.max_statements)
        outcome = check(program, seed, args.time_limit)
        counts[outcome.kind] += 1
        if outcome.kind in FAILURES:
            small = shrink(program, seed, outcome, args.time_limit)
            path = write_reproducer(args.out, small, seed, outcome)
            failures.append({"seed": seed, "kind": outcome.kind, "detail": outcome.detail, "reproducer": path})
            print(f"seed {seed}: {outcome.kind}: {outcome.detail}\n  shrunk to {len(small.statements)} statements: "
                  f"python {path}", flush=True)
        if n % 200 == 0:
            graphex.custom_ops.reset_dynamo()  # drop Dynamo's caches of finished programs
        if not args.quick and (n % 100 == 0 or n == args.count):
            print(f"[{n:6d}/{args.count} {time.perf_counter() - start:7.1f}s] {dict(counts)}", flush=True)
    elapsed = time.perf_counter() - start
    summary = {"seed": args.seed, "count": args.count, "seconds": round(elapsed, 1), "counts": dict(counts),
               "failures": failures}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"fuzz: {args.count} programs from seed {args.seed} in {elapsed:.1f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f"; graphex failures: {len(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
