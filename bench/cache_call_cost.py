"""Per-call cost of cache_compile over the bare engine, on the shipped decoder (issue 18: target <= 10 us).

    python -m bench.cache_call_cost [--rounds N]

Prints medians over N rounds of 2000 calls each: the engine's executor called on a prepared input list, the
generated guard + binding function alone (Note [One function checks the guards and binds the inputs]), the
cache_compile call, and the cache_compile call with the engine replaced by a stub that returns the same
outputs at once (what cache_compile adds per call, measured directly); one thread.
"""
import argparse
import statistics
import tempfile
import time

import torch

import graphex
from examples.models.decoder import build_decoder


def per_call_us(fn, calls=2000):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = build_decoder()
    cached = graphex.inference.cache_compile(model.forward, cache_dir=tempfile.mkdtemp(prefix="graphex-cost-"))
    k, v = model.new_cache()
    tokens, pos = torch.ones(1, 1, dtype=torch.long), torch.tensor([3])
    flat = [tokens, pos, k, v]
    with torch.inference_mode():
        cached(*flat)
        cached(*flat)
        (loaded,) = [e for entries in cached._by_call.values() for e in entries]
        inputs = loaded.bind(flat, cached._func)
        rows = {"engine (executor.try_run)": lambda: loaded.executor.try_run(inputs),
                "guards + bindings": lambda: loaded.bind(flat, cached._func),
                "cache_compile call": lambda: cached(*flat)}
        outs = loaded.executor.try_run(inputs)
        results = {name: [] for name in rows}
        results["cache_compile, engine stubbed"] = []
        for _ in range(args.rounds):
            for name, fn in rows.items():
                results[name].append(per_call_us(fn))
            real, loaded.executor = loaded.executor, _Stub(outs)  # what cache_compile adds, without the engine
            results["cache_compile, engine stubbed"].append(per_call_us(lambda: cached(*flat)))
            loaded.executor = real
    medians = {name: statistics.median(r) for name, r in results.items()}
    print(f"shipped decoder, {loaded.guard_set.count} guard records, {len(inputs)} inputs, 1 thread, "
          f"median of {args.rounds} rounds x 2000 calls")
    for name, us in medians.items():
        print(f"  {name:28s} {us:8.1f} us")
    print(f"  {'cache_compile over engine':28s} {medians['cache_compile call'] - medians['engine (executor.try_run)']:8.1f} us"
          "  (difference of two medians; the stubbed row is the direct measure)")


class _Stub:
    """An executor that returns the same outputs at once: what remains of a call is cache_compile's own."""

    def __init__(self, outs):
        self.outs = outs

    def try_run(self, inputs):
        return list(self.outs)


if __name__ == "__main__":
    main()
