"""What graphex's DirectCall saves per call over AOTAutograd's runtime wrapper, per workload (issue 22).

    python -m bench.direct_call_cost [--only NAME[,NAME]] [--rounds 11] [--pairs 60]

Note [A plain inference graph skips AOTAutograd's wrapper] (csrc/python/call_slots.cpp): where the wrapper would
only bump version counters and turn grad mode off, the backend hands Dynamo a DirectCall instead. This bench compiles
each workload twice, with and without option `direct_call`, keeps what the backend handed Dynamo each time and the
arguments Dynamo passes it, and times each callable against the bare engine right after an engine run
(bench/cache_call_cost.py's pairing, Note [A pairing times each side first as often]): the callable's cost over the
engine as a real step leaves the caches. Rounds alternate the two; one thread; medians over the rounds. Both
callables' outputs are checked equal to each other (bitwise) before timing.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

DEFAULT = ("decoder_step", "llama_decode", "gpt2_decode", "bert_encoder", "convnet", "mha_block")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.direct_call_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(DEFAULT))
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--pairs", type=int, default=60, help="pairs per round and callable")
    args = p.parse_args(argv)
    print(f"per call over the bare engine, after an engine run; 1 thread; median of {args.rounds} rounds x "
          f"{args.pairs} pairs (python -m bench.direct_call_cost)")
    print("| workload | AOTAutograd's wrapper | DirectCall | saved |")
    print("|---|---:|---:|---:|")
    for name in [n for n in args.only.split(",") if n]:
        row = measure(name, args.rounds, args.pairs)
        if row is None:
            print(f"| {name} | n/a | n/a | n/a |")
            continue
        print(f"| {name} | {row['wrapper']:.1f} us | {row['direct']:.1f} us | {row['saved']:.1f} us |")


def _handed(case: Any, direct: bool) -> tuple[Any, list[Any], Any]:
    """(what the backend handed Dynamo, the arguments Dynamo passed it, the CompiledGraph) for one compile."""
    from graphex.compile import compile_dynamo_graph, on_capture
    from graphex.options import Options

    handed: dict[str, Any] = {}

    def backend(gm: Any, example_inputs: list[Any]) -> Any:
        fn = compile_dynamo_graph(gm, example_inputs, Options.from_user({"direct_call": direct}))
        handed["fn"], handed["inputs"] = fn, list(example_inputs)
        return fn

    backend._graphex_backend = True  # type: ignore[attr-defined]
    built = case.build()
    args = case.inputs(built)
    graphs: list[Any] = []
    torch._dynamo.reset()
    with torch.no_grad(), on_capture(lambda _g, graph: graphs.append(graph)):
        torch.compile(built, backend=backend, fullgraph=True, dynamic=False)(*args)
    return handed["fn"], handed["inputs"], graphs[-1]


def measure(name: str, rounds: int, pairs: int) -> dict[str, float] | None:
    from graphex import _C

    from . import cases as cases_mod
    from .cache_call_cost import _paired_after_engine

    case = cases_mod.find(name)
    if case.unavailable is not None and case.unavailable():
        return None
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        direct, direct_args, graph = _handed(case, True)
        wrapper, wrapper_args, _ = _handed(case, False)
        if not isinstance(direct, _C.DirectCall) or isinstance(wrapper, _C.DirectCall):
            raise RuntimeError(f"{name}: expected a DirectCall with direct_call=True and the wrapper without")
        with torch.no_grad():
            for fn, a in ((direct, direct_args), (wrapper, wrapper_args)):
                fn(*a)  # the first call of each goes through AOTAutograd's callable
            outs = [fn(*a) for fn, a in ((direct, direct_args), (wrapper, wrapper_args))]
            for x, y in zip(*outs):
                if isinstance(x, torch.Tensor) and not torch.equal(x, y):
                    raise RuntimeError(f"{name}: the DirectCall's output differs from the wrapper's")
            engine = lambda: graph.executor(list(direct_args))  # noqa: E731
            rows: dict[str, list[float]] = {"direct": [], "wrapper": []}
            for r in range(rounds):
                order = ("direct", "wrapper") if r % 2 == 0 else ("wrapper", "direct")
                for which in order:
                    fn, a = (direct, direct_args) if which == "direct" else (wrapper, wrapper_args)
                    rows[which].append(_paired_after_engine(lambda: fn(*a), engine, pairs))
    finally:
        torch.set_num_threads(saved_threads)
    med = {k: statistics.median(v) for k, v in rows.items()}
    med["saved"] = statistics.median(w - d for w, d in zip(rows["wrapper"], rows["direct"]))
    return med


if __name__ == "__main__":
    main()
