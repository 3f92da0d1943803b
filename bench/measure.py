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
import atexit
import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.utils._pytree as pytree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BACKENDS = ("eager", "torchscript", "torchscript_ofi", "onnxruntime", "inductor", "aot_eager", "graphex", "graphex_fused",
            "graphex_cached", "graphex_cached_fused")

# The options of the graphex_fused row (docs/benchmarks.md, The peers).
FUSED_OPTIONS = {"pattern_fusion_pass": True, "frozen_parameter": True}
# The options of the graphex_cached_fused row: fused mode behind cache_compile, which binds parameters by name on every
# call (frozen_parameter has no effect there: docs/cache-compile.md), so the same kernels without the frozen folds.
CACHED_FUSED_OPTIONS = {"pattern_fusion_pass": True}

# First call and memory in a fresh process each (first_call_isolated): the two of the first-call target. The
# others are measured in the bench process when they are prepared (compile + first call, Dynamo reset before):
# no compile cache applies to them, and a fresh process each would cost minutes of imports on 2 cores.
ISOLATED = ("inductor", "graphex")

# How each backend gets its program, for models whose Python takes another path when traced
# (Case.reference_path): eager is compared on the same path. None: eager itself.
TRACER = {"eager": None, "torchscript": "jit", "torchscript_ofi": "jit", "onnxruntime": "export", "inductor": "dynamo",
          "aot_eager": "dynamo", "graphex": "dynamo", "graphex_fused": "dynamo", "graphex_cached": "dynamo",
          "graphex_cached_fused": "dynamo"}

# A runner takes a time budget in seconds and returns per-call latencies in microseconds.
Runner = Callable[[float], list[float]]


class Unavailable(RuntimeError):
    """This backend cannot run this case here (a missing option or package, an export that fails):
    the message says why, and the report shows it in the backend's row instead of failing."""


def scratch_dir(prefix: str) -> str:
    """A temporary directory removed when this process exits: a bench run leaves nothing behind (an ONNX export is
    tens of MB; 425 directories, 4 GB, had piled up in /tmp before 2026-12-07)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


def canonical(name: str) -> str:
    """Backend names as the command line may spell them (torchscript-ofi, graphex-fused)."""
    return name.strip().replace("-", "_")


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
    # Inductor writes `#pragma omp parallel num_threads(N)` with the thread count at code generation unless it
    # equals the core count; with dynamic_threads its parallel regions follow torch.set_num_threads instead, so
    # one compile (at the largest thread count, bench/run.py) serves every thread count the bench times.
    if hasattr(inductor_config.cpp, "dynamic_threads"):
        inductor_config.cpp.dynamic_threads = True


def compile_for(backend: str, fn: Callable[..., Any], args: tuple[Any, ...] | None = None,
                case: Any = None) -> Callable[..., Any]:
    """`fn` as `backend` runs it: eager is fn itself; torch.compile'd backends compile lazily (on the first
    call); torchscript and onnxruntime trace / export here, on `args` (one step's arguments, not written:
    they run on copies). Raises Unavailable when the backend cannot run here."""
    if backend == "eager":
        return fn
    if backend in ("torchscript", "torchscript_ofi"):
        return torchscript(fn, _copies(args), optimize=backend == "torchscript_ofi")
    if backend == "onnxruntime":
        return onnxruntime_step(fn, args, case)
    if backend in ("graphex_cached", "graphex_cached_fused"):
        # graphex behind cache_compile: the same program, called without Dynamo (a fresh, empty cache); fused mode's
        # kernels too for graphex_cached_fused
        import graphex

        target = fn.forward if isinstance(fn, torch.nn.Module) else fn
        options = CACHED_FUSED_OPTIONS if backend == "graphex_cached_fused" else None
        return graphex.inference.cache_compile(target, cache_dir=scratch_dir("graphex-bench-cache-"), options=options)
    if backend == "graphex_fused":
        import graphex
        from graphex.options import Options

        if "pattern_fusion_pass" not in {f.name for f in dataclasses.fields(Options)}:
            raise Unavailable("not available in this build (graphex.options.Options has no pattern_fusion_pass)")
        del graphex
        # fused mode as an inference user runs it: parameters frozen (as TorchScript freeze and ONNX Runtime hold
        # them), which lets convolutions read their weights reordered once (Note [A frozen convolution weight is
        # prepacked once])
        return torch.compile(fn, backend="graphex", options=FUSED_OPTIONS, fullgraph=True, dynamic=False)
    if backend == "inductor":
        configure_cold_inductor()
    elif backend == "graphex":
        import graphex  # noqa: F401  (registers the backend)
    elif backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)


def backend_note(backend: str, fn: Any) -> str | None:
    """What a row should say about how the backend ran this case (None: nothing to add)."""
    module = isinstance(fn, torch.nn.Module)
    if backend == "torchscript":
        return "torch.jit.trace + torch.jit.freeze" if module else \
            "torch.jit.trace of a plain function (torch.jit.freeze applies to modules only, so it is not frozen)"
    if backend == "torchscript_ofi":
        return "torch.jit.optimize_for_inference(torch.jit.trace(...))" + (
            "" if module else " on the function wrapped in an nn.Module (optimize_for_inference takes modules only)")
    return None


def _copies(args: tuple[Any, ...] | None) -> tuple[Any, ...]:
    if args is None:
        raise ValueError("this backend traces on example arguments: pass args")
    return tuple(pytree.tree_map_only(torch.Tensor, torch.clone, args))


class _FunctionModule(torch.nn.Module):
    """A plain function as an nn.Module (for tools that take modules only)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def torchscript(fn: Callable[..., Any], args: tuple[Any, ...], *, optimize: bool) -> Callable[..., Any]:
    """torch.jit.trace, then torch.jit.freeze (modules) or torch.jit.optimize_for_inference (which freezes too)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings for Python values the trace bakes in: shapes are static here
        if not isinstance(fn, torch.nn.Module):
            if not optimize:
                return torch.jit.trace(fn, args, check_trace=False)
            fn = _FunctionModule(fn).eval()
        traced = torch.jit.trace(fn.eval(), args, check_trace=False)
        return torch.jit.optimize_for_inference(traced) if optimize else torch.jit.freeze(traced)


class _StateAsOutputs(torch.nn.Module):
    """fn with the tensor inputs it writes in place made explicit outputs, for ONNX (no in-place inputs):
    each such input is copied, the copy updated, and returned after fn's own outputs."""

    def __init__(self, fn: Callable[..., Any], written: list[int]) -> None:
        super().__init__()
        self.fn = fn
        self.written = written

    def forward(self, *args: Any) -> tuple[Any, ...]:
        args_l = list(args)
        for i in self.written:
            args_l[i] = args_l[i].clone()
        out = self.fn(*args_l)
        return (*pytree.tree_leaves(out), *[args_l[i] for i in self.written])


class OrtStep:
    """One step on ONNX Runtime (CPUExecutionProvider): numpy views of the arguments in, torch views of the
    outputs back, in eager's output structure. One InferenceSession per torch thread count (created on
    first use), intra_op_num_threads = torch.get_num_threads(), inter_op_num_threads = 1.

    `extra`: state fed after the arguments (a cache the step keeps in its module); the session also
    returns the updated state, which the step computes and drops (timed: ONNX has no in-place update)."""

    def __init__(self, path: str, spec: Any, visible: int, extra: tuple[torch.Tensor, ...], note: str) -> None:
        self.path = path
        self.spec = spec
        self.visible = visible
        self.extra = extra
        self.note = note
        self.sessions: dict[int, Any] = {}
        self.session()  # fail here (in setup) rather than in the timed loop

    def session(self) -> Any:
        import onnxruntime as ort

        threads = torch.get_num_threads()
        sess = self.sessions.get(threads)
        if sess is None:
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            so.log_severity_level = 3
            sess = ort.InferenceSession(self.path, so, providers=["CPUExecutionProvider"])
            self.names = [i.name for i in sess.get_inputs()]
            self.sessions[threads] = sess
        return sess

    def __call__(self, *args: Any) -> Any:
        sess = self.sessions.get(torch.get_num_threads()) or self.session()
        tensors = [a for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)] + list(self.extra)
        outs = sess.run(None, {name: t.numpy() for name, t in zip(self.names, tensors)})
        return pytree.tree_unflatten([torch.from_numpy(o) for o in outs[:self.visible]], self.spec)


def _export_failure(e: BaseException) -> str:
    """The reason in torch.onnx's error: its "Exception summary" (e.g. "DispatchError: No ONNX function found for
    <OpOverload(op='...')>. ..."), else the first line; terminal colours dropped."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "## Exception summary" in lines:
        for line in lines[lines.index("## Exception summary") + 1:]:
            m = re.match(r"<class '(?:[\w.]+\.)?(\w+)'>: (.*)", line)
            if m:
                return f"{m.group(1)}: {m.group(2)}"[:300]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def onnxruntime_step(fn: Callable[..., Any], args: tuple[Any, ...] | None, case: Any = None) -> OrtStep:
    """Export with torch.onnx.export(dynamo=True) and run with ONNX Runtime; Unavailable says why it cannot."""
    import contextlib
    import io
    import warnings

    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise Unavailable(f"onnxruntime / onnxscript not installed ({e}); `make bench` installs bench/requirements.txt")
    copies = _copies(args)
    with torch.no_grad():
        reference = fn(*copies)
    leaves, spec = pytree.tree_flatten(reference)
    if not all(isinstance(t, torch.Tensor) for t in leaves):
        raise Unavailable("the step returns non-tensor values")
    if case is not None and case.onnx_adapter is not None:
        module, extra = case.onnx_adapter(fn, _copies(args))
        note = "state kept in the module (KV cache) as explicit inputs and outputs: fed in, the updated copy returned"
    else:
        written = [i for i, a in enumerate(copies) if isinstance(a, torch.Tensor) and a._version > 0]
        module, extra = _StateAsOutputs(fn, written).eval(), ()
        note = ("inputs written in place (" + ", ".join(f"arg {i}" for i in written) + ") as explicit inputs and "
                "outputs: fed in, the updated copy returned") if written else ""
    if not isinstance(module, torch.nn.Module):
        module = _FunctionModule(module)
    path = os.path.join(scratch_dir("graphex-bench-onnx-"), "model.onnx")
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, (*_copies(args), *extra), path, dynamo=True, verbose=False)
    except Exception as e:  # noqa: BLE001  (the row says why)
        raise Unavailable(f"torch.onnx.export(dynamo=True) failed: {_export_failure(e)}") from e
    try:
        return OrtStep(path, spec, len(leaves), extra, note)
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"onnxruntime could not load the exported model: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:300] if str(e) else ''}") from e


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


def engine_runner(graph: Any, engine_args: list[Any]) -> Runner:
    """The bare C++ engine of a graphex graph (CompiledGraph.executor) on the flat arguments it received in a
    real call (CompiledGraph.watch): no Dynamo guards, no AOTAutograd wrapper, no Python around it. Timed in
    the same rounds, so graphex's median minus this one is the per-call cost outside the engine."""
    executor = graph.executor
    if executor is None:
        raise RuntimeError("the graph has no engine (force_eager or not built)")
    return call_runner(executor, (list(engine_args),))


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
    # Everything alive now (torch, transformers, Dynamo's caches, the models) goes to the permanent generation,
    # so the collection before each turn walks only what the calls made: a full collection of a heap with
    # transformers and Dynamo in it takes a good part of a second on 2 cores, every turn.
    gc.collect()
    gc.freeze()
    try:
        for r in range(rounds if names else 0):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                gc.collect()
                gc.disable()  # no collection pause inside a timed call
                try:
                    samples[name].extend(runners[name](round_s))
                finally:
                    gc.enable()
    finally:
        gc.unfreeze()
    return samples


def weight_bytes(module: torch.nn.Module) -> int:
    """The bytes of `module`'s parameters that a decode step reads whole (each counted once): an embedding table's
    weight is left out, since a step reads one row of it, unless another module (a tied output head) uses it too."""
    embedding_only = {id(p) for m in module.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    embedding_only -= {id(p) for m in module.modules() if not isinstance(m, torch.nn.Embedding)
                       for p in m.parameters(recurse=False)}
    return sum(p.numel() * p.element_size() for p in module.parameters() if id(p) not in embedding_only)


def gemv_floor_us(nbytes: int, calls: int = 20) -> float:
    """The median time of one float32 matrix-vector product (ATen's torch.mv, at the current thread count) over a
    matrix of `nbytes`: what reading that many weight bytes costs on this machine, in whatever cache they fit, with
    the fastest product ATen has. A decode step's matrix products read at least its weights once, so it is the
    floor a step is measured against (its other work comes on top)."""
    cols = 1024
    w = torch.randn(max(nbytes // 4 // cols, 1), cols)
    x = torch.randn(cols)
    for _ in range(3):
        torch.mv(w, x)
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        torch.mv(w, x)
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return float(np.median(samples))


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
        t0 = time.perf_counter()
        fn = compile_for(backend, built, args, case)  # traces / exports here for torchscript, onnxruntime
        fn(*args)
        first = time.perf_counter() - t0
        for _ in range(steady_calls):
            fn(*args)
        t0 = time.perf_counter()
        fn(*args)
        later = time.perf_counter() - t0
        result: dict[str, Any] = {"first_call_s": first, "later_call_s": later, **step_peak_bytes(fn, args)}
    if backend == "onnxruntime":  # its arena is not c10's allocator: the profiler would see only the wrapping
        result["peak_step_bytes"] = None
        result["peak_step_note"] = "not seen: ONNX Runtime allocates from its own arena, which torch.profiler does not see"
    if backend in ("graphex", "graphex_fused"):
        graphs = [g for g in graphex_graphs() if id(g) not in before]
        result["graphex_graphs"] = len(graphs)
        result["graphex_ops"] = sum(g.num_ops for g in graphs)
        result["engine_runs"] = engine_runs(graphs)
    return result


def first_call_isolated(case_name: str, backend: str, cache_dir: str, timeout_s: float = 900,
                        threads: int | None = None) -> dict[str, Any]:
    """`first_call` in a fresh Python process, with TORCHINDUCTOR_CACHE_DIR=cache_dir (a new, empty dir),
    at `threads` torch threads (default: torch's default)."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    command = [sys.executable, "-m", "bench.measure", case_name, backend]
    if threads is not None:
        command += ["--threads", str(threads)]
    proc = subprocess.run(command, cwd=ROOT, env=env,
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
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    ns = parser.parse_args(argv)
    # Module imports are not the first call: load every backend's modules before the clock starts
    # (graphex only where it can load, so a broken graphex does not stop the other rows).
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401

    if ns.threads is not None:
        torch.set_num_threads(ns.threads)

    try:
        import graphex
    except ImportError:
        if ns.backend == "graphex":
            raise
    else:
        # graphex's modules byte-compiled, as an installed package's are (pip compiles them at install, as it did
        # torch's): this checkout's editable install, under PYTHONDONTWRITEBYTECODE=1, would otherwise compile the
        # modules the first fused call imports (the shipped patterns' 373 KB among them) inside the clock, 0.05-0.1 s.
        import compileall

        compileall.compile_dir(os.path.dirname(graphex.__file__), quiet=2)

    from . import cases

    print(json.dumps(first_call(cases.find(ns.case), ns.backend)), flush=True)


if __name__ == "__main__":
    main()
