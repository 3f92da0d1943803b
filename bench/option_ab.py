"""One graphex option on and off, on the engine of a transformers family's one-token step, paired in one process.

    python -m bench.option_ab --option index_as_view [--arch falcon] [--fused] [--rounds 30]

Compiles bench.models.FamilyStep (bench/families.py's step: hidden 256, 4 layers, a static cache of 256 filled to
position 100) twice, with the option True and False, takes each captured program and the arguments it received, and
times the bare engine (CompiledGraph.executor) of both in interleaved rounds: an option that changes the program is
measured without Dynamo's per-call noise. Prints both medians and the median of the per-round ratios (on / off), and
checks that both programs give the same logits (bitwise in exact mode). One thread.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.option_ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--option", required=True, help="a boolean graphex option, e.g. index_as_view")
    p.add_argument("--arch", default="falcon")
    p.add_argument("--fused", action="store_true", help="with pattern_fusion_pass=True")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=40, help="engine calls per round and side")
    args = p.parse_args(argv)
    on, off, ratio = measure(args.option, args.arch, args.fused, args.rounds, args.calls)
    mode = "fused" if args.fused else "exact"
    print(f"{args.arch} one-token step, engine, {mode}, 1 thread, {args.rounds} rounds x {args.calls} calls: "
          f"{args.option}=True {on:.0f} us, False {off:.0f} us, per-round ratio (True / False) {ratio:.3f}")


def measure(option: str, arch: str, fused: bool, rounds: int, calls: int) -> tuple[float, float, float]:
    from graphex.compile import on_capture

    from . import models
    from .breakdown import capture_args

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base = models.hf_family(arch, "bench", torch.float32)
        tokens, position = torch.tensor([[7]]), torch.tensor(100)
        runs, logits = {}, {}
        for value in (True, False):
            step = models.FamilyStep(copy.deepcopy(base), models.CACHE_LEN["bench"], 100)
            options = {option: value, **({"pattern_fusion_pass": True} if fused else {})}
            torch._dynamo.reset()
            compiled = torch.compile(step, backend="graphex", fullgraph=True, dynamic=False, options=options)
            graphs: list = []
            with torch.no_grad(), on_capture(lambda _g, graph: graphs.append(graph)):
                logits[value] = compiled(tokens, position).clone()
            with torch.no_grad():
                runs[value] = (graphs[-1], capture_args(graphs[-1], lambda: compiled(tokens, position)))
        if not torch.equal(logits[True], logits[False]) and not fused:
            raise RuntimeError(f"{option}: the two programs' logits differ in exact mode")
        times: dict[bool, list[float]] = {True: [], False: []}
        with torch.no_grad():
            for r in range(rounds):
                for value in ((True, False) if r % 2 == 0 else (False, True)):
                    graph, inputs = runs[value]
                    start = time.perf_counter()
                    for _ in range(calls):
                        graph.executor(list(inputs))
                    times[value].append((time.perf_counter() - start) / calls * 1e6)
    finally:
        torch.set_num_threads(saved)
    ratio = statistics.median(a / b for a, b in zip(times[True], times[False]))
    return statistics.median(times[True]), statistics.median(times[False]), ratio


if __name__ == "__main__":
    main()
