"""Per-call cost of cache_compile over the bare engine, on the shipped decoder or a decode step of bench/cases.py
(issue 18 and 22: target <= 10 us).

    python -m bench.cache_call_cost [--rounds N] [--case decoder|llama_decode|gpt2_decode|llama_keywords|gpt2_keywords]

The *_keywords cases make transformers' own call, `model.forward(input_ids=..., past_key_values=StaticCache(...),
cache_position=..., use_cache=True)` (bench-size models, the cache's positions reset before each call on both sides).

Prints medians over N rounds of 2000 calls each: the engine's executor called on a prepared input list, the
generated guard + binding function alone (Note [One function checks the guards and binds the inputs]), the
cache_compile call (its C++ fast path, Note [A plain call's fast path is one C++ call]), and its Python path
(the fast path off) with the engine replaced by a stub that returns the same outputs at once; one thread.

Those rows are warm: nothing evicts the caches between calls. A real step streams its weights through them first
(Note [Per-call costs are measured after a real engine run], bench/per_call.py), so the last two rows are measured
as a call runs: each cache_compile call is paired with a bare engine call, the pair preceded by an engine run and
timed in both orders (Note [A pairing times each side first as often]), and (cache_compile call - engine call) is
what cache_compile adds after a real step, through its fast path and through its Python path.
"""
import argparse
import contextlib
import statistics
import time

import torch

import graphex
from examples.models.decoder import build_decoder

from .measure import scratch_dir


def per_call_us(fn, calls=2000):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cache_call_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=2000, help="calls per round and row (pairs: a quarter of it)")
    p.add_argument("--case", default="decoder", help="decoder (the shipped one), or a case of bench/cases.py called "
                   "positionally, e.g. llama_decode, gpt2_decode (transformers, a StaticCache held by the module)")
    args = p.parse_args(argv)
    medians, guard_count, inputs = measure(args.rounds, args.calls, args.case)
    name = "shipped decoder" if args.case == "decoder" else args.case
    print(f"{name}, {guard_count} guard records, {inputs} inputs, 1 thread, "
          f"median of {args.rounds} rounds x {args.calls} calls")
    for name, us in medians.items():
        print(f"  {name:52s} {us:8.1f} us")


def measure(rounds: int, calls: int, case: str = "decoder") -> tuple[dict[str, float], int, int]:
    """The rows' medians in us, the entry's guard record count and its program's input count (one thread)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(rounds, calls, case)
    finally:
        torch.set_num_threads(saved)


def _workload(case: str) -> tuple[object, list[object], dict[str, object], object]:
    """The function cache_compile wraps, its positional and keyword arguments, and what runs before each call."""
    if case == "decoder":
        model = build_decoder()
        k, v = model.new_cache()
        return model.forward, [torch.ones(1, 1, dtype=torch.long), torch.tensor([3]), k, v], {}, lambda: None
    from . import cases

    if case.endswith("_keywords"):
        import transformers

        from . import models

        model = models.build_hf_decoder(case.removesuffix("_keywords")).model
        cache = transformers.StaticCache(config=model.config, max_cache_len=models.CACHE_LEN["bench"])
        with torch.no_grad():  # the first step initializes the cache's layers, a side effect: eager
            model(input_ids=torch.tensor([[3]]), past_key_values=cache, cache_position=torch.tensor([0]),
                  use_cache=True)
        lengths = [t for layer in cache.layers
                   if isinstance(t := getattr(layer, "cumulative_length", None), torch.Tensor)]
        kwargs = {"input_ids": torch.tensor([[5]]), "past_key_values": cache, "cache_position": torch.tensor([1]),
                  "use_cache": True}
        return model.forward, [], kwargs, lambda: [t.fill_(1) for t in lengths]  # each step writes one position
    found = [c for c in cases.USER_CASES if c.name == case]
    if not found:
        raise SystemExit(f"bench.cache_call_cost: no case {case!r}; try decoder, llama_decode, gpt2_decode, "
                         "llama_keywords or gpt2_keywords")
    built = found[0].build()
    return built.forward, list(found[0].inputs(built)), {}, lambda: None


def _measure(rounds: int, calls: int, case: str) -> tuple[dict[str, float], int, int]:
    forward, args, kwargs, before = _workload(case)
    flat = [*args, *kwargs.values()]  # every argument a leaf: the call flattens to them
    cached = graphex.inference.cache_compile(forward, cache_dir=scratch_dir("graphex-cost-"))

    def call():
        before()
        return cached(*args, **kwargs)

    with torch.inference_mode():
        call()
        call()
        (loaded,) = [e for entries in cached._by_call.values() for e in entries]
        held = loaded.bind(flat, cached._func)  # the tensors the guards' function reads (parameters, buffers)
        inputs = loaded.program.bind(flat, held)  # the program's inputs, as cache_compile hands them to the engine
        if held is None or inputs is None or loaded.executor.try_run(inputs) is None:
            raise RuntimeError("the cache entry does not fit its own call: the rows below would time a refusal")
        rows = {"engine (executor.try_run)": lambda: (before(), loaded.executor.try_run(inputs)),
                "guards + bindings": lambda: loaded.program.bind(flat, loaded.bind(flat, cached._func)),
                "cache_compile call": call}
        if cached._fast is None:
            raise RuntimeError("the second plain call left no fast path (Note [A plain call's fast path is one C++ "
                               "call]): the rows below would time the Python path twice")
        leaves = loaded.program.try_run(flat, held)
        results = {name: [] for name in rows}
        results["cache_compile, Python path, engine stubbed"] = []
        engine = lambda: (before(), loaded.executor.try_run(inputs))  # noqa: E731
        after = "cache_compile over the engine, after an engine run"
        python_after = "cache_compile's Python path over the engine, after an engine run"
        floor = "engine over the engine (the pairing's own floor)"
        results[after], results[python_after], results[floor] = [], [], []
        for _ in range(rounds):
            for name, fn in rows.items():
                results[name].append(per_call_us(fn, calls))
            results[after].append(_paired_after_engine(call, engine, max(calls // 4, 5)))
            results[floor].append(_paired_after_engine(engine, engine, max(calls // 4, 5)))
            with _python_path(cached, loaded):
                results[python_after].append(_paired_after_engine(call, engine, max(calls // 4, 5)))
                real, loaded.program = loaded.program, _StubProgram(leaves)  # what the Python path adds, no engine
                try:
                    results["cache_compile, Python path, engine stubbed"].append(
                        per_call_us(call, calls))
                finally:
                    loaded.program = real
    medians = {name: statistics.median(r) for name, r in results.items()}
    return medians, loaded.guard_set.count, len(inputs)


def _paired_after_engine(call, engine, pairs=500):
    """(call - engine) in us, each timed right after an engine run: the call's cost over the engine with the caches
    as a real step leaves them.

    Note [A pairing times each side first as often]: whatever is timed first after an engine run pays something the
    second does not (measured: a bare engine call first was 5-11 us slower than the same call second). So the pairs
    alternate which side goes first, and the result is the mean of the two orders' medians: the position's own cost
    cancels, and the floor row (the engine paired with itself) reads ~0 instead of that cost."""
    first, second = [], []
    for i in range(pairs):
        engine()
        if i % 2 == 0:
            t0 = time.perf_counter_ns()
            call()
            t1 = time.perf_counter_ns()
            engine()
            t2 = time.perf_counter_ns()
            first.append(((t1 - t0) - (t2 - t1)) / 1e3)
        else:
            t0 = time.perf_counter_ns()
            engine()
            t1 = time.perf_counter_ns()
            call()
            t2 = time.perf_counter_ns()
            second.append(((t2 - t1) - (t1 - t0)) / 1e3)
    return (statistics.median(first) + statistics.median(second)) / 2


@contextlib.contextmanager
def _python_path(cached, loaded):
    """cache_compile with its C++ fast path off (the path every call took before it): the generated guard function,
    then BoundProgram.try_run."""
    cached._fast = None
    loaded.fast_call = lambda *args: None
    try:
        yield
    finally:
        del loaded.fast_call


class _StubProgram:
    """A bound program whose run returns the same results at once: what remains of a call is cache_compile's own."""

    def __init__(self, leaves):
        self.leaves = leaves

    def try_run(self, flat, held):
        return list(self.leaves)


if __name__ == "__main__":
    main()
