"""Where one torch.compile call's time goes, layer by layer, outside graphex's engine.

    python -m bench.per_call [--only NAME[,NAME]] [--threads N] [--rounds N] [--json PATH]

Each layer is timed alone on the same arguments, innermost first, in interleaved rounds (bench/measure.py),
so one layer's median minus the next one's is what that layer adds per call:

  engine   CompiledGraph.executor(args)   the bare C++ engine on the flat arguments AOTAutograd passes it
  runner   CompiledGraph(args)            graphex's Python runner around it (phase, options, watchers)
  aot      the backend's callable         what graphex's backend handed Dynamo: AOTAutograd's runtime wrapper
  call     compiled(*inputs)              the user's call: Dynamo's frame evaluation and guards, then `aot`
  guards   Dynamo's guard check alone     the frame's GuardManager (`check` on the frame's locals), with the
                                          number of leaf guards and their kinds

so graphex Python = runner - engine, AOTAutograd wrapper = aot - runner, Dynamo = call - aot (of which
`guards` is the guard evaluation). The guard manager and the frame's locals come from Dynamo's own testing
hook (torch._dynamo.guards.guard_manager_testing_hook_fn, set for the compile only): bench code, never the
library's. The call's outputs are compared with eager's (bitwise), so a layer that would skip work is caught.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree

from . import cases as cases_mod
from . import measure

LAYERS = ("engine", "runner", "aot", "call", "guards")


@contextlib.contextmanager
def _guard_manager_hook(seen: list[tuple[Any, dict[str, Any]]]) -> Iterator[None]:
    import torch._dynamo.guards as dynamo_guards

    before = getattr(dynamo_guards, "guard_manager_testing_hook_fn", None)
    dynamo_guards.guard_manager_testing_hook_fn = lambda manager, scope, _builder: seen.append((manager, scope))
    try:
        yield
    finally:
        dynamo_guards.guard_manager_testing_hook_fn = before


def _leaf_guards(manager: Any) -> collections.Counter[str]:
    kinds: collections.Counter[str] = collections.Counter(type(g).__name__ for g in manager.get_leaf_guards())
    for child in manager.get_child_managers():
        kinds.update(_leaf_guards(child))
    return kinds


def _equal(a: Any, b: Any) -> bool:
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    return len(la) == len(lb) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(la, lb))


def measure_case(case: cases_mod.Case, rounds: int, round_s: float, options: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The layers of one workload's call (module docstring), medians in microseconds."""
    from graphex.backend import graphex_backend

    built = case.build()
    args = case.inputs(built)
    handed: dict[str, Any] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        fn = graphex_backend(gm, example_inputs, options=options, **kwargs)
        handed["fn"], handed["inputs"] = fn, list(example_inputs)
        return fn

    backend._graphex_backend = True  # type: ignore[attr-defined]  (what graphex's own backends carry)
    compiled = torch.compile(built, backend=backend, fullgraph=True, dynamic=False)
    seen: list[tuple[Any, dict[str, Any]]] = []
    with torch.no_grad():
        with _guard_manager_hook(seen):
            compiled(*args)
        graphs = measure.graphex_graphs()
        graph = graphs[-1]
        from bench.breakdown import capture_args

        engine_args = capture_args(graph, lambda: compiled(*args))
        with case.reference_context("dynamo"):
            expected = built(*args)
        got = compiled(*args)
    if not seen or "fn" not in handed:
        raise RuntimeError(f"{case.name}: no guard manager or backend callable was seen")
    manager, scope = seen[-1]
    aot_fn, aot_inputs = handed["fn"], handed["inputs"]
    kinds = _leaf_guards(manager.root)

    def timed(fn: Any, *fn_args: Any) -> measure.Runner:
        def call() -> None:
            with torch.no_grad():
                fn(*fn_args)
        return measure.call_runner(lambda: call(), ())

    root = manager.root
    runners = {
        "engine": measure.call_runner(lambda: graph.executor(list(engine_args)), ()),
        "runner": measure.call_runner(lambda: graph(list(engine_args)), ()),
        "aot": timed(lambda: aot_fn(*aot_inputs)) if not getattr(aot_fn, "_boxed_call", False)
        else timed(lambda: aot_fn(list(aot_inputs))),
        "call": timed(lambda: compiled(*args)),
        "guards": measure.call_runner(lambda: root.check(scope), ()),
    }
    for run in runners.values():  # warm up each layer
        run(0.02)
    samples = measure.interleaved(runners, rounds, round_s)
    med = {name: measure.summarize(s)["median_us"] for name, s in samples.items()}
    return {
        "case": case.name, "threads": torch.get_num_threads(), "bitwise_equal_eager": _equal(got, expected),
        "median_us": med,
        "graphex_python_us": med["runner"] - med["engine"],
        "aot_wrapper_us": med["aot"] - med["runner"],
        "dynamo_us": med["call"] - med["aot"],
        "outside_engine_us": med["call"] - med["engine"],
        "guards": {"count": sum(kinds.values()), "kinds": dict(kinds.most_common())},
    }


def measure_all(cases: list[cases_mod.Case], log: Any, rounds: int = 8, round_s: float = 0.15,
                threads: int = 1) -> dict[str, Any]:
    """Every available case's layers at `threads` threads (the thread count is restored after)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows, skipped = [], {}
    try:
        for case in cases:
            why = case.unavailable() if case.unavailable else None
            if why:
                skipped[case.name] = why
                continue
            torch._dynamo.reset()
            try:
                rows.append(measure_case(case, rounds, round_s))
            except Exception as e:  # noqa: BLE001  one case failing is a row saying so, not a lost run
                skipped[case.name] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"per-call layers: {case.name} done")
    finally:
        torch.set_num_threads(saved)
    return {"rows": rows, "skipped": skipped, "threads": threads}


def markdown_lines(section: dict[str, Any] | None) -> list[str]:
    """The bench report's section (bench/report.py)."""
    if not section:
        return []
    lines = ["", f"Per call, outside the engine (medians in us, {section['threads']} thread; bench/per_call.py: "
             "each layer timed alone, innermost first; a difference is what that layer adds):", "",
             markdown(section["rows"])]
    lines += [f"- {name}: not measured ({why})" for name, why in section.get("skipped", {}).items()]
    return lines


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | threads | call | engine | outside engine | Dynamo (guards) | AOTAutograd wrapper "
             "| graphex Python | guards: count, top kinds | == eager |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        m = r["median_us"]
        top = ", ".join(f"{k.removesuffix('_GUARD').lower()} {n}" for k, n in list(r["guards"]["kinds"].items())[:3])
        lines.append(f"| {r['case']} | {r['threads']} | {m['call']:.1f} | {m['engine']:.1f} | "
                     f"{r['outside_engine_us']:.1f} | {r['dynamo_us']:.1f} ({m['guards']:.1f}) | "
                     f"{r['aot_wrapper_us']:.1f} | {r['graphex_python_us']:.1f} | {r['guards']['count']}: {top} | "
                     f"{'bitwise' if r['bitwise_equal_eager'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.per_call", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated workload names (default: every case)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--round-s", type=float, default=0.15)
    parser.add_argument("--json", default="", help="also write the rows as JSON to this path")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    section = measure_all([cases_mod.find(n) for n in names] if names else cases_mod.CASES,
                          lambda m: print(f"per_call: {m}", file=sys.stderr, flush=True),
                          rounds=args.rounds, round_s=args.round_s, threads=args.threads)
    print("\n".join(markdown_lines(section)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(section, f, indent=1)
    return 0 if all(r["bitwise_equal_eager"] for r in section["rows"]) and not section["skipped"] else 1


if __name__ == "__main__":
    sys.exit(main())
