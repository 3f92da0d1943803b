"""Where one torch.compile call's time goes, layer by layer, outside graphex's engine.

    python -m bench.per_call [--only NAME[,NAME]] [--threads N] [--rounds N] [--json PATH]

Note [Per-call costs are measured after a real engine run]
A call's cost outside the engine depends on what the engine left in the CPU's caches. A step of milliseconds
streams its weights through them, so Dynamo's guards, its frame evaluation and the wrappers then run on cold
memory: on the shipped decoder Dynamo's guard check takes 11 us hot and 95 us right after the engine ran.
Timing the layers around a stubbed engine (the first method below, and this bench's only one before
2026-12-03) measures them warm and understated the real cost 4-10 times. So each layer is measured twice:

  after a real run   the headline: the layer called with the real engine, which is timed inside the call
                     (graph.runner wrapped by this bench); per call, the layer's time minus the engine's time
                     inside it; the median of those differences. The guard check alone is timed right after
                     an engine run.
  warm               each layer timed alone around a stubbed engine (`stub`: the graph's runner returns the
                     outputs of one real run), so nothing evicts the caches between calls: what the layers cost
                     when nothing else runs, the floor of the figures above; outside the engine = call - stub.

The layers, innermost first:

  engine   CompiledGraph.executor(args)   the bare C++ engine on the flat arguments AOTAutograd passes it
  runner   CompiledGraph(args)            graphex's Python runner around it (phase, options, watchers)
  aot      the backend's callable         what graphex's backend handed Dynamo: its DirectCall where AOTAutograd's
                                          runtime wrapper has nothing to do but bump versions and turn grad off
                                          (Note [A plain inference graph skips AOTAutograd's wrapper]), else the
                                          wrapper itself
  call     compiled(*inputs)              the user's call: Dynamo's frame evaluation and guards, then `aot`
  guards   Dynamo's guard check alone     the frame's GuardManager (`check` on the frame's locals), with the
                                          number of leaf guards and their kinds

so graphex Python = runner, AOTAutograd wrapper = aot - runner (the DirectCall's own cost where there is one),
Dynamo = call - aot (of which `guards` is the guard evaluation), outside the engine = call (each counted outside
the engine). The guard manager and the frame's locals come from Dynamo's own testing hook
(torch._dynamo.guards.guard_manager_testing_hook_fn, set for the compile only): bench code, never the library's.
The call's outputs are compared with eager's (bitwise), so a layer that would skip work is caught.

With each of torch's guard filters (GUARD_FILTERS: `torch.compile(..., options={"guard_filter_fn": f})`) the
workload is compiled again and its call timed the same way: what dropping those guards would buy, and what
it would give up (docs/exact-mode.md, "Guard filters", says which are safe when).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import time
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as pytree

from . import cases as cases_mod
from . import measure

LAYERS = ("engine", "stub", "runner", "aot", "call", "guards")  # warm: around the stubbed engine
REAL_LAYERS = ("runner", "aot", "call", "guards")  # after a real engine run (Note [Per-call costs are measured after a real engine run])
# torch.compiler's guard filters (2.11-2.15), weakest first; each trades re-checks for speed (docs/exact-mode.md, Guard filters).
GUARD_FILTERS = ("skip_guard_on_all_nn_modules_unsafe", "keep_tensor_guards_unsafe", "skip_all_guards_unsafe")


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


def measure_case(case: cases_mod.Case, rounds: int, round_s: float, options: dict[str, Any] | None = None,
                 guard_filter: str | None = None) -> dict[str, Any]:
    """The layers of one workload's call (module docstring), medians in microseconds; `guard_filter`: the name of
    one of torch.compiler's guard filters to compile with."""
    from graphex.backend import graphex_backend

    built = case.build()
    args = case.inputs(built)
    handed: dict[str, Any] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        fn = graphex_backend(gm, example_inputs, options=options, **kwargs)
        handed["fn"], handed["inputs"] = fn, list(example_inputs)
        return fn

    backend._graphex_backend = True  # type: ignore[attr-defined]  (what graphex's own backends carry)
    dynamo_options = {"guard_filter_fn": getattr(torch.compiler, guard_filter)} if guard_filter else None
    compiled = torch.compile(built, backend=backend, fullgraph=True, dynamic=False, options=dynamo_options)
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

    root = manager.root
    real_runner = graph.runner
    with torch.no_grad():
        outs = real_runner(list(engine_args))
    compiles = len(measure.graphex_graphs())

    def stub(_args: list[Any]) -> list[Any]:
        return list(outs)

    # Every layer under no_grad, as the capture was: the engine writing a KV cache with grad on would make it
    # require grad, and Dynamo would recompile the next call for that.
    layers: dict[str, Callable[[], Any]] = {
        "engine": lambda: graph.executor(list(engine_args)),
        "stub": lambda: stub(list(engine_args)),
        "runner": lambda: graph(list(engine_args)),
        "aot": lambda: aot_fn(list(aot_inputs)) if getattr(aot_fn, "_boxed_call", False) else aot_fn(*aot_inputs),
        "call": lambda: compiled(*args),
        "guards": lambda: root.check(scope),
    }
    runners = {name: measure.call_runner(layer, ()) for name, layer in layers.items()}
    # After a real engine run (Note [Per-call costs are measured after a real engine run]): the real runner, timed
    # inside each call; a sample is the layer's time minus the engine's time inside it, in the same call.
    inside: list[float] = []

    def timed_engine(a: list[Any]) -> list[Any]:
        t0 = time.perf_counter_ns()
        try:
            return real_runner(a)
        finally:
            inside.append((time.perf_counter_ns() - t0) / 1e3)

    def outside_of(layer: Callable[[], Any]) -> measure.Runner:
        def run(seconds: float) -> list[float]:
            samples: list[float] = []
            deadline = time.perf_counter_ns() + int(seconds * 1e9)
            while len(samples) < 5 or time.perf_counter_ns() < deadline:
                inside.clear()
                t0 = time.perf_counter_ns()
                layer()
                total = (time.perf_counter_ns() - t0) / 1e3
                if len(inside) != 1:
                    raise RuntimeError(f"{case.name}: the engine ran {len(inside)} times in one call")
                samples.append(total - inside[0])
            return samples

        return run

    def guards_after_engine(seconds: float) -> list[float]:
        samples: list[float] = []
        deadline = time.perf_counter_ns() + int(seconds * 1e9)
        while len(samples) < 5 or time.perf_counter_ns() < deadline:
            graph.executor(list(engine_args))
            t0 = time.perf_counter_ns()
            root.check(scope)
            samples.append((time.perf_counter_ns() - t0) / 1e3)
        return samples

    real_runners = {**{name: outside_of(layers[name]) for name in ("runner", "aot", "call")},
                    "guards": guards_after_engine}
    with torch.no_grad():
        engine_samples = measure.interleaved({"engine": runners.pop("engine")}, rounds, round_s / 2)
        graph.runner = stub  # every warm layer runs around the stubbed engine
        try:
            for run in runners.values():  # warm up each layer
                run(0.02)
            samples = measure.interleaved(runners, rounds, round_s)
            graph.runner = timed_engine
            real_samples = measure.interleaved(real_runners, rounds, round_s)
        finally:
            graph.runner = real_runner
    if len(measure.graphex_graphs()) != compiles:  # a layer's call recompiled: its figure is not this graph's
        raise RuntimeError(f"{case.name}: Dynamo compiled again while the layers were timed")
    med = {name: measure.summarize(s)["median_us"] for name, s in {**engine_samples, **samples}.items()}
    real = {name: measure.summarize(s)["median_us"] for name, s in real_samples.items()}
    return {
        "case": case.name, "guard_filter": guard_filter, "threads": torch.get_num_threads(),
        "bitwise_equal_eager": _equal(got, expected),
        "median_us": med,  # warm, around the stubbed engine
        "graphex_python_us": med["runner"] - med["stub"],
        "aot_wrapper_us": med["aot"] - med["runner"],
        "dynamo_us": med["call"] - med["aot"],
        "outside_engine_us": med["call"] - med["stub"],
        # after a real engine run: each layer's time outside the engine, and the guard check alone
        "real_us": real,
        "real_graphex_python_us": real["runner"],
        "real_aot_wrapper_us": real["aot"] - real["runner"],
        "real_dynamo_us": real["call"] - real["aot"],
        "real_outside_engine_us": real["call"],
        "guards": {"count": sum(kinds.values()), "kinds": dict(kinds.most_common())},
    }


def measure_all(cases: list[cases_mod.Case], log: Any, rounds: int = 8, round_s: float = 0.15,
                threads: int = 1, guard_filters: bool = True, options: dict[str, Any] | None = None) -> dict[str, Any]:
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
            for guard_filter in (None, *(GUARD_FILTERS if guard_filters else ())):
                torch._dynamo.reset()
                label = case.name + (f" with {guard_filter}" if guard_filter else "")
                try:
                    rows.append(measure_case(case, rounds, round_s, options=options, guard_filter=guard_filter))
                except Exception as e:  # noqa: BLE001  one case failing is a line saying so, not a lost run
                    skipped[label] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"per-call layers: {case.name} done")
    finally:
        torch.set_num_threads(saved)
    return {"rows": rows, "skipped": skipped, "threads": threads}


def markdown_lines(section: dict[str, Any] | None) -> list[str]:
    """The bench report's section (bench/report.py)."""
    if not section:
        return []
    lines = ["", f"Per call, outside the engine (medians in us, {section['threads']} thread; bench/per_call.py): each "
             "layer timed after a real engine run, as a call runs (a difference is what that layer adds), and the "
             "whole outside warm, around a stubbed engine (Note [Per-call costs are measured after a real engine "
             "run]):", "",
             markdown([r for r in section["rows"] if not r.get("guard_filter")])]
    filtered = [r for r in section["rows"] if r.get("guard_filter")]
    if filtered:
        base = {r["case"]: r for r in section["rows"] if not r.get("guard_filter")}
        lines += ["", "With torch's guard filters (`options={\"guard_filter_fn\": torch.compiler.<filter>}`; what each "
                  "gives up: docs/exact-mode.md, Guard filters), after a real engine run:", "",
                  "| workload | guard filter | guards | Dynamo guard check | outside engine | vs no filter "
                  "| outside engine, warm | == eager |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
        for r in filtered:
            b = base.get(r["case"])
            delta = f"{r['real_outside_engine_us'] - b['real_outside_engine_us']:+.1f}" if b else "-"
            lines.append(f"| {r['case']} | {r['guard_filter']} | {r['guards']['count']} | "
                         f"{r['real_us']['guards']:.1f} | {r['real_outside_engine_us']:.1f} | {delta} | "
                         f"{r['outside_engine_us']:.1f} | {'bitwise' if r['bitwise_equal_eager'] else 'NO'} |")
    lines += [f"- {name}: not measured ({why})" for name, why in section.get("skipped", {}).items()]
    return lines


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | threads | engine | outside engine | Dynamo (guards) | AOTAutograd wrapper "
             "| graphex Python | outside engine, warm | guards: count, top kinds | == eager |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        m, real = r["median_us"], r["real_us"]
        top = ", ".join(f"{k.removesuffix('_GUARD').lower()} {n}" for k, n in list(r["guards"]["kinds"].items())[:3])
        lines.append(f"| {r['case']} | {r['threads']} | {m['engine']:.1f} | "
                     f"{r['real_outside_engine_us']:.1f} | {r['real_dynamo_us']:.1f} ({real['guards']:.1f}) | "
                     f"{r['real_aot_wrapper_us']:.1f} | {r['real_graphex_python_us']:.1f} | "
                     f"{r['outside_engine_us']:.1f} | {r['guards']['count']}: {top} | "
                     f"{'bitwise' if r['bitwise_equal_eager'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.per_call", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated workload names (default: every case)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--round-s", type=float, default=0.15)
    parser.add_argument("--no-guard-filters", action="store_true", help="skip the runs with torch's guard filters")
    parser.add_argument("--json", default="", help="also write the rows as JSON to this path")
    parser.add_argument("--graphex-options", default="", metavar="JSON",
                        help='graphex options for every compile, e.g. \'{"direct_call": false}\' (AOTAutograd\'s wrapper)')
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    section = measure_all([cases_mod.find(n) for n in names] if names else cases_mod.CASES,
                          lambda m: print(f"per_call: {m}", file=sys.stderr, flush=True),
                          rounds=args.rounds, round_s=args.round_s, threads=args.threads,
                          guard_filters=not args.no_guard_filters,
                          options=json.loads(args.graphex_options) if args.graphex_options else None)
    print("\n".join(markdown_lines(section)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(section, f, indent=1)
    return 0 if all(r["bitwise_equal_eager"] for r in section["rows"]) and not section["skipped"] else 1


if __name__ == "__main__":
    sys.exit(main())
