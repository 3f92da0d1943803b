"""What a compiled graph's call costs over its engine, with its C++ call slot and with a Python `__call__` (issue 22).

    python -m bench.runner_call_cost [--rounds 30] [--pairs 100]

Note [A compiled graph's call enters its runner at once] (csrc/python/module.cpp): AOTAutograd calls the graph once
per step, and the graph's call slot hands the arguments to its runner (the executor) from C++. This bench compiles
the shipped decoder with torch.compile, then times `graph(args)` against the bare executor, each right after an
engine run (bench/cache_call_cost.py's pairing), alternating rounds with the graph's class switched to one that
adds the Python `__call__` it had before (`return self.runner(args)`). One thread; medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics

import torch


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.runner_call_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--pairs", type=int, default=100, help="pairs per round and row")
    args = p.parse_args(argv)
    rows = measure(args.rounds, args.pairs)
    print(f"shipped decoder's compiled graph, 1 thread, median of {args.rounds} rounds x {args.pairs} pairs, after an "
          "engine run each")
    for name, us in rows.items():
        print(f"  {name:58s} {us:7.1f} us")


def measure(rounds: int, pairs: int) -> dict[str, float]:
    from examples.models.decoder import build_decoder
    from graphex.compile import on_capture
    from graphex.runtime.compiled_graph import CompiledGraph

    from .breakdown import capture_args
    from .cache_call_cost import _paired_after_engine

    class WithPythonCall(CompiledGraph):  # what CompiledGraph was before its call moved to C++
        def __call__(self, a):
            return self.runner(a)

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_decoder()
        compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
        k, v = model.new_cache()
        call = [torch.ones(1, 1, dtype=torch.long), torch.tensor([3]), k, v]
        graphs: list = []
        with torch.no_grad():
            with on_capture(lambda _dynamo_graph, graph: graphs.append(graph)):
                compiled(*call)
            graph = graphs[-1]
            inputs = capture_args(graph, lambda: compiled(*call))
            engine = lambda: graph.executor(list(inputs))  # noqa: E731
            slot, python, floor = [], [], []
            for _ in range(rounds):
                slot.append(_paired_after_engine(lambda: graph(list(inputs)), engine, pairs))
                graph.__class__ = WithPythonCall
                try:
                    python.append(_paired_after_engine(lambda: graph(list(inputs)), engine, pairs))
                finally:
                    graph.__class__ = CompiledGraph
                floor.append(_paired_after_engine(engine, engine, pairs))
    finally:
        torch.set_num_threads(saved)
    return {"graph(args) over the engine, C++ call slot": statistics.median(slot),
            "graph(args) over the engine, Python __call__": statistics.median(python),
            "Python __call__ - C++ slot, per round": statistics.median(p - s for p, s in zip(python, slot)),
            "engine over the engine (the pairing's own floor)": statistics.median(floor)}


if __name__ == "__main__":
    main()
