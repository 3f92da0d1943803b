"""How a backend is measured on a case.

- `compile_for`: the backends, all with fullgraph=True, dynamic=False (inductor made cold).
- `interleaved`: steady-state latency. This VM's speed drifts over minutes, so the
  backends take turns in short rounds (who goes first rotates) and we keep every
  sample; medians over the pooled samples make the ratios fair.
- `first_call`: compile + first run, and the peak memory of one steady-state step. Run
  in a fresh process per backend per case (`python -m bench.measure CASE BACKEND`,
  see `first_call_isolated`), so no compile cache or Dynamo state leaks between them.
- `binary_runner`: the hand-written C++ limit, run as a subprocess in the same rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BACKENDS = ("eager", "inductor", "aot_eager", "graphex", "graphex_cached")

# A runner takes a time budget in seconds and returns per-call latencies in microseconds.
Runner = Callable[[float], list[float]]


# -- backends --------------------------------------------------------------------------
def configure_cold_inductor() -> None:
    """Turn off inductor's FX graph cache and the AOTAutograd cache, local and remote.

    With TORCHINDUCTOR_CACHE_DIR pointing at a fresh directory (the caller's job,
    before the compile) inductor then compiles from scratch, as on a new machine.
    """
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    for module, name in ((inductor_config, "fx_graph_cache"), (inductor_config, "fx_graph_remote_cache"),
                         (inductor_config, "autograd_cache"), (functorch_config, "enable_autograd_cache"),
                         (functorch_config, "enable_remote_autograd_cache")):
        if hasattr(module, name):
            setattr(module, name, False)


def compile_for(backend: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as `backend` runs it: eager is fn itself; the others are torch.compile'd (lazily)."""
    if backend == "eager":
        return fn
    if backend == "graphex_cached":
        # graphex behind cache_compile: the same program, called without Dynamo (a fresh, empty cache).
        import tempfile

        import graphex

        target = fn.forward if isinstance(fn, torch.nn.Module) else fn
        return graphex.inference.cache_compile(target, cache_dir=tempfile.mkdtemp(prefix="graphex-bench-cache-"))
    if backend == "inductor":
        configure_cold_inductor()
    elif backend == "graphex":
        import graphex  # noqa: F401  (registers the backend)
    elif backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)


def graphex_graphs() -> list[Any]:
    """graphex's live captured graphs (empty when graphex is not imported)."""
    if "graphex" not in sys.modules:
        return []
    from graphex.runtime import live_graphs

    gc.collect()
    return live_graphs()


def engine_runs(graphs: list[Any]) -> int:
    """Calls the C++ executors of `graphs` have served (0 means a fallback ran, not the engine)."""
    return sum(g.executor.run_count for g in graphs if g.executor is not None)


# -- steady-state latency ------------------------------------------------------------------
def call_runner(fn: Callable[..., Any], args: tuple[Any, ...], min_calls: int = 5) -> Runner:
    """Time each call of fn(*args) for about `seconds` (at least min_calls calls)."""
    def run(seconds: float) -> list[float]:
        clock = time.perf_counter_ns
        samples: list[float] = []
        deadline = clock() + int(seconds * 1e9)
        while len(samples) < min_calls or clock() < deadline:
            t0 = clock()
            fn(*args)
            samples.append((clock() - t0) / 1e3)
        return samples

    return run


def binary_runner(path: str, args: tuple[str, ...], warmup: int) -> Runner:
    """Run the hand-written binary for about `seconds`; its own warmup is excluded from the samples."""
    def run(seconds: float) -> list[float]:
        return run_binary(path, (*args, "--warmup", str(warmup), "--iters", "5", "--seconds", repr(seconds)))["samples_us"]

    return run


def run_binary(path: str, args: tuple[str, ...]) -> dict[str, Any]:
    proc = subprocess.run([path, *args], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{path} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def interleaved(runners: dict[str, Runner], rounds: int, round_s: float) -> dict[str, list[float]]:
    """All samples per runner, the runners alternating in `rounds` rounds of `round_s` seconds each."""
    names = list(runners)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds if names else 0):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            gc.disable()  # no collection pause inside a timed call
            try:
                samples[name].extend(runners[name](round_s))
            finally:
                gc.enable()
    return samples


def summarize(samples_us: list[float]) -> dict[str, float]:
    """Median, p10, p90 (microseconds) and the sample count."""
    a = np.asarray(samples_us, dtype=np.float64)
    p10, median, p90 = np.percentile(a, [10, 50, 90])
    return {"median_us": float(median), "p10_us": float(p10), "p90_us": float(p90), "samples": int(a.size)}


# -- first call and memory -------------------------------------------------------------------
def step_peak_bytes(fn: Callable[..., Any], args: tuple[Any, ...]) -> dict[str, int]:
    """Peak bytes live at once among the CPU allocations made during ONE call of fn(*args).

    From torch.profiler's memory events (profile_memory=True), which see every
    allocation of c10's CPU allocator, whoever makes it (Python, ATen, the graphex
    executor, inductor's generated code). An allocation counts from its event until
    its free in the same call; the outputs stay live to the end. Memory allocated
    before the call and kept (weights, the KV cache, constants) is not counted, so
    the figure is what one step costs on top of the model: intermediates + outputs.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(*args)
    del out
    allocations = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            allocations.append(event)
    allocations.sort(key=lambda e: e.start_time_ns)
    live: dict[int, int] = {}
    current = peak = count = 0
    for event in allocations:
        fields = event.extra_fields
        if fields.alloc_size > 0:
            live[fields.ptr] = fields.alloc_size
            current += fields.alloc_size
            count += 1
            peak = max(peak, current)
        elif fields.ptr in live:  # frees of memory allocated before the call are not ours
            current -= live.pop(fields.ptr)
    return {"peak_step_bytes": peak, "allocations_per_step": count}


def first_call(case: Any, backend: str, steady_calls: int = 3) -> dict[str, Any]:
    """Compile + first call (seconds), a later call, and the peak memory of one steady-state step."""
    torch._dynamo.reset()  # a no-op in a fresh process; keeps in-process runs honest
    before = {id(g) for g in graphex_graphs()}
    built = case.build()
    args = case.inputs(built)
    with torch.no_grad():
        fn = compile_for(backend, built)
        t0 = time.perf_counter()
        fn(*args)
        first = time.perf_counter() - t0
        for _ in range(steady_calls):
            fn(*args)
        t0 = time.perf_counter()
        fn(*args)
        later = time.perf_counter() - t0
        result: dict[str, Any] = {"first_call_s": first, "later_call_s": later, **step_peak_bytes(fn, args)}
    if backend == "graphex":
        graphs = [g for g in graphex_graphs() if id(g) not in before]
        result["graphex_graphs"] = len(graphs)
        result["graphex_ops"] = sum(g.num_ops for g in graphs)
        result["engine_runs"] = engine_runs(graphs)
    return result


def first_call_isolated(case_name: str, backend: str, cache_dir: str, timeout_s: float = 900) -> dict[str, Any]:
    """`first_call` in a fresh Python process, with TORCHINDUCTOR_CACHE_DIR=cache_dir (a new, empty dir)."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-m", "bench.measure", case_name, backend], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        stderr = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("USDT:")]
        raise ChildError(f"the fresh process exited with {proc.returncode}: {stderr[-1] if stderr else '(no output)'}",
                         "\n".join(stderr[-40:]))
    return json.loads(lines[-1])


class ChildError(RuntimeError):
    """A first-call process failed: the message is its last line, `log` the end of its stderr."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


def main(argv: list[str] | None = None) -> None:
    """The fresh process of `first_call_isolated`: prints the result as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("case")
    parser.add_argument("backend", choices=BACKENDS)
    ns = parser.parse_args(argv)
    # Module imports are not the first call: load every backend's modules before the clock starts
    # (graphex only where it can load, so a broken graphex does not stop the other rows).
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401

    try:
        import graphex  # noqa: F401
    except ImportError:
        if ns.backend == "graphex":
            raise

    from . import cases

    print(json.dumps(first_call(cases.find(ns.case), ns.backend)), flush=True)


if __name__ == "__main__":
    main()
