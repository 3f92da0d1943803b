"""`python -m sweeps.opinfo`: every OpInfo through graphex, classified, as a table (`make opinfo`).

    python -m sweeps.opinfo                        # the full sweep: 4 dtypes, static + dynamic, 3 samples
    python -m sweeps.opinfo --subset               # what `make test` runs: every op, one sample, float32, static
    python -m sweeps.opinfo --case add/float32/static/0     # one case again
    python -m sweeps.opinfo --ops add,mul --dtypes float16

Writes OUT.md and OUT.json (default sweeps/results/opinfo.*): counts per category (Note [How a sweep failure is
classified]) and one row per case that is not bitwise. Exit status 1 when a graphex-only failure is not in
KNOWN_FAILURES.
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
from typing import Any, Sequence

from . import opinfo_cases
from .opinfo_classify import CATEGORIES, FAILURES, Result, classify

# Note [Known OpInfo failures]
# Graphex-only failures we know of and have not fixed, by case id ("op/dtype/mode/sample"), each with why.
# The sweep (and the test that runs its subset) fails on any graphex-only failure not listed here. Keep it empty.
KNOWN_FAILURES: dict[str, str] = {}

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweeps.opinfo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subset", action="store_true", help="every op, one sample, float32, static (make test)")
    p.add_argument("--dtypes", default="float32,float16,bfloat16,int64")
    p.add_argument("--modes", default="static,dynamic")
    p.add_argument("--samples", type=int, default=3, help="samples per op and dtype")
    p.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    p.add_argument("--shard", default="", help="I/N: only every N-th op starting at I (a deterministic fraction)")
    p.add_argument("--case", default="", help="one case id, e.g. add/float32/static/0")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per case before it counts as timeout")
    p.add_argument("--out", default=os.path.join(HERE, "results", "opinfo"), help="writes OUT.md and OUT.json")
    p.add_argument("--quiet", action="store_true", help="print failures and the summary only")
    args = p.parse_args(argv)

    dtypes, modes, samples, names = args.dtypes.split(","), args.modes.split(","), args.samples, None
    if args.subset:
        dtypes, modes, samples = ["float32"], ["static"], 1
    if args.ops:
        names = args.ops.split(",")
    only = None
    if args.case:
        name, dtype, mode, index = args.case.rsplit("/", 3)
        names, dtypes, modes, samples, only = [name], [dtype], [mode], int(index) + 1, args.case
    shard = tuple(int(v) for v in args.shard.split("/")) if args.shard else None

    _quiet_torch()
    ops = opinfo_cases.select(opinfo_cases.op_db(), names, shard)  # type: ignore[arg-type]
    start = time.perf_counter()
    results: list[Result] = []
    for case in opinfo_cases.cases(ops, dtypes, [m == "dynamic" for m in modes], samples):
        if only and case.id != only:
            continue
        result = classify(case, args.time_limit)
        results.append(result)
        if len(results) % 100 == 0:
            _reset()
        failing = result.category in FAILURES and result.id not in KNOWN_FAILURES
        if not args.quiet or failing:
            print(f"[{len(results):5d} {time.perf_counter() - start:7.1f}s] {result.category:13s} {result.id}"
                  + (f"  {result.detail}" if result.detail else ""), flush=True)
    elapsed = time.perf_counter() - start
    report = _report(results, elapsed, vars(args))
    _write(args.out, report)
    print(_summary(report), flush=True)
    print(f"table: {args.out}.md, {args.out}.json")
    return 1 if report["new_failures"] else 0


def _quiet_torch() -> None:
    warnings.simplefilter("ignore")
    for name in ("torch._dynamo", "torch._inductor", "torch.fx", "torch._functorch", "torch._subclasses"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    import torch._dynamo.config as dynamo_config

    dynamo_config.suppress_errors = False


def _reset() -> None:
    import graphex.custom_ops

    graphex.custom_ops.reset_dynamo()


def _report(results: list[Result], elapsed: float, settings: dict[str, Any]) -> dict[str, Any]:
    counts = Counter(r.category for r in results)
    ops = {r.id.rsplit("/", 3)[0] for r in results}
    new = [r.id for r in results if r.category in FAILURES and r.id not in KNOWN_FAILURES]
    return {
        "settings": {k: v for k, v in settings.items() if k != "out"},
        "seconds": round(elapsed, 1),
        "cases": len(results),
        "ops": len(ops),
        "counts": {c: counts.get(c, 0) for c in CATEGORIES},
        "no_engine_run": sum(1 for r in results if r.category == "bitwise" and not r.engine),
        "new_failures": new,
        "known_failures": {k: v for k, v in KNOWN_FAILURES.items()},
        "rows": [{"id": r.id, "category": r.category, "detail": r.detail, "engine": r.engine,
                  "seconds": round(r.seconds, 2)} for r in results if r.category != "bitwise"],
        "slowest": sorted(([r.id, round(r.seconds, 2)] for r in results), key=lambda x: -x[1])[:10],
    }


def _summary(report: dict[str, Any]) -> str:
    counts = ", ".join(f"{c} {n}" for c, n in report["counts"].items())
    return (f"opinfo sweep: {report['cases']} cases over {report['ops']} ops in {report['seconds']} s: {counts}; "
            f"graphex-only failures not known: {len(report['new_failures'])}")


def _write(out: str, report: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    lines = ["# OpInfo sweep: graphex vs eager", "", _summary(report), "",
             f"settings: {json.dumps(report['settings'])}", "",
             "| category | cases | meaning |", "|---|---:|---|"]
    meaning = {"bitwise": "outputs and input writes equal to eager, byte for byte, on capture and replay",
               "as_aot_eager": "differs from eager as aot_eager does (decompositions, nondeterminism)",
               "graphex_diff": "differs from eager, aot_eager does not: graphex's fault",
               "graphex_error": "graphex raises, aot_eager does not: graphex's fault",
               "not_graphex": "eager, Dynamo or aot_eager fails too",
               "timeout": "ran past the time bound"}
    for c, n in report["counts"].items():
        lines.append(f"| {c} | {n} | {meaning[c]} |")
    lines += ["", f"bitwise cases where Dynamo made no graph for the engine: {report['no_engine_run']}", "",
              "| case | category | detail |", "|---|---|---|"]
    for row in sorted(report["rows"], key=lambda r: (CATEGORIES.index(r["category"]), r["id"])):
        detail = row["detail"].replace("|", "\\|").replace("\n", " ")[:240]
        lines.append(f"| `{row['id']}` | {row['category']} | {detail} |")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
