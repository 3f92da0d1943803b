"""`make bench`: eager, TorchScript, ONNX Runtime, inductor, aot_eager and graphex side by side on every workload.

    python -m bench.run [--quick] [--only NAME] [--out DIR] [--backends a,b] [--threads 1,2] [--bin-dir DIR]
                        [--no-tp-decode] [--no-cpp-runner] [--no-per-call] [--no-device-graph-cost] [--no-variants]

For each case (bench/cases.py):
  1. first call (compile + first run) and the peak memory of one steady-state step,
     in a fresh process per backend (measure.ISOLATED; inductor with a new cache directory),
     at the largest thread count; TorchScript, ONNX Runtime and graphex-fused in this process;
  2. for each thread count, steady-state latency in this process, the backends taking turns in
     short rounds (graphex's bare C++ engine too, for the cost outside it), plus the hand-written
     C++ limit where the case has one (built by CMake into build/py/bench/; the row is skipped,
     with a note, when the binary is missing);
  3. the 2-rank tensor-parallel decode step, eager vs graphex (bench/tp_decode.py, torchrun on
     127.0.0.1; --no-tp-decode skips it);
  4. the C++ runner: each decoder case exported and run by graphex-run, its median step next to the
     Python engine's and its load-to-first-output time (bench/cpp_runner.py; --no-cpp-runner skips it);
  5. where one torch.compile call's time goes outside the engine, layer by layer (Dynamo and its guards,
     AOTAutograd's runtime wrapper, graphex's Python), per workload at 1 thread (bench/per_call.py;
     --no-per-call skips it);
  6. device graphs' host cost on the simulated accelerator gxsim: graphex's runner around a replay, part by part,
     next to the CPU engine's per-call cost for the same program (bench/device_graph_cost.py;
     --no-device-graph-cost skips it);
  7. the generated decoder variants (sweeps/coverage_decoder.py spelled the ways model code spells its parts) at the
     bench's Llama size: graphex fused against inductor and ONNX Runtime per variant, and the medians over them
     (bench/variants.py; --no-variants skips it, and so does --only).
Writes results.json, results.md and latency.png under --out and prints the Markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from . import cases as cases_mod
from . import measure, report
from .cases import Case

ROOT = measure.ROOT
DEFAULT_OUT = os.path.join(ROOT, "bench", "results")
DEFAULT_BIN_DIR = os.path.join(os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py"), "bench")


@dataclasses.dataclass(frozen=True)
class Settings:
    """How long to time: `rounds` turns of `round_s` seconds per backend, after `warmup` calls."""

    rounds: int = 12
    round_s: float = 0.25
    warmup: int = 20
    binary_warmup: int = 50

    def describe(self) -> str:
        return (f"median / p10 / p90 of every call in {self.rounds} interleaved rounds of {self.round_s} s per "
                f"backend per thread count, after {self.warmup} warm-up calls; first call and memory once per "
                "workload (inductor and graphex in a fresh process each)")


FULL = Settings(rounds=8, round_s=0.15)  # per thread count; ~35 min in all on 2 cores (bench/README.md)
QUICK = Settings(rounds=3, round_s=0.05, warmup=3, binary_warmup=20)


_START = time.monotonic()


def _log(message: str) -> None:
    print(f"bench [{time.monotonic() - _START:5.0f} s]: {message}", file=sys.stderr, flush=True)


# -- one case ------------------------------------------------------------------------------
def _max_abs_diff(actual: Any, expected: Any) -> float:
    diffs = [(a.double() - e.double()).abs().max().item()
             for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected))
             if isinstance(a, torch.Tensor) and a.numel() > 0]
    return max(diffs, default=0.0)


def prepare(case: Case, backend: str, warmup: int, *, in_process_first_call: bool = False,
            with_breakdown: bool = True) -> tuple[dict[str, measure.Runner], dict[str, Any]]:
    """Compile `case` for `backend`, check its first output against eager's on a copy of the inputs, warm it up.

    Returns the runners to time (the backend's own under its name; for graphex also `NAME:engine`, its bare
    C++ engine on the arguments of a real call) and what was learned. Eager is run on the code path the
    backend traced (Case.reference_path, for transformers); `max_abs_diff_vs_eager` is against that run.
    in_process_first_call: also record compile + first call and the peak step memory here (backends not
    measured in a fresh process, measure.ISOLATED)."""
    built = case.build()
    args = case.inputs(built)
    graphs_before = {id(g) for g in measure.graphex_graphs()}
    info: dict[str, Any] = {}
    note = measure.backend_note(backend, built)
    if note:
        info["how"] = note
    tracer = measure.TRACER.get(backend)
    with torch.no_grad():
        plain = built(*pytree.tree_map_only(torch.Tensor, torch.clone, args))
        reference = plain
        if tracer is not None and case.reference_path is not None:
            with case.reference_context(tracer):
                reference = built(*pytree.tree_map_only(torch.Tensor, torch.clone, args))
            info["reference"] = f"eager on the {tracer} code path"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            fn = measure.compile_for(backend, built, args, case)
            out = fn(*args)
            first_s = time.perf_counter() - t0
        said = list(dict.fromkeys(str(w.message).splitlines()[0] for w in caught
                                  if backend.startswith("graphex") and "graphex" in str(w.message)))
        if said:  # e.g. cache_compile saying why a program cannot be cached
            info["warnings"] = said
        info["max_abs_diff_vs_eager"] = _max_abs_diff(out, reference)
        if reference is not plain:
            info["max_abs_diff_vs_plain_eager"] = _max_abs_diff(out, plain)
        if getattr(fn, "note", None):
            info["how"] = fn.note
        for _ in range(warmup):
            fn(*args)
        if in_process_first_call:
            info["first_call_s"] = first_s
            info["first_call_in_process"] = True
            if backend == "onnxruntime":
                info["peak_step_bytes"] = None
                info["peak_step_note"] = ("not seen: ONNX Runtime allocates from its own arena, which torch.profiler "
                                          "does not see")
            else:
                info.update(measure.step_peak_bytes(fn, args))
    runners: dict[str, measure.Runner] = {}
    if backend in ("graphex_cached", "graphex_cached_fused"):
        info["engine_ran"] = fn.stats["compiles"] == 1  # every later call replayed the program
        info["cached"] = fn.stats["writes"] >= 1
        if not info["cached"]:
            info["how"] = ("cache_compile could not cache this program (the note says why), so it runs through "
                           "torch.compile with graphex: Dynamo's guards on every call, not the guard-free path")
    if backend in ("graphex", "graphex_fused"):
        graphs = [g for g in measure.graphex_graphs() if id(g) not in graphs_before]
        info["engine_ran"] = measure.engine_runs(graphs) >= warmup + 1
        info["graphex_ops"] = sum(g.num_ops for g in graphs)
        if len(graphs) == 1 and graphs[0].executor is not None:
            from .breakdown import breakdown, capture_args

            with torch.no_grad():
                engine_args = capture_args(graphs[0], lambda: fn(*args))
                if with_breakdown and backend == "graphex":
                    info["breakdown"] = breakdown(graphs[0], engine_args)
                    info["breakdown"]["threads"] = torch.get_num_threads()
            engine = measure.engine_runner(graphs[0], engine_args)

            def run_engine(seconds: float) -> list[float]:
                with torch.no_grad():
                    return engine(seconds)

            runners[f"{backend}:engine"] = run_engine
        else:
            info["engine_note"] = f"{len(graphs)} graphs captured: the engine alone is timed for exactly one"

    runner = measure.call_runner(fn, args)

    def run(seconds: float) -> list[float]:
        with torch.no_grad():
            return runner(seconds)

    runners[backend] = run
    return runners, info


def handwritten_runner(case: Case, bin_dir: str, settings: Settings, entry: dict[str, Any]) -> measure.Runner | None:
    """The C++ limit for `case`, after checking it computes what the Python case does; None (with a note) if not."""
    hw = case.handwritten
    if hw is None:
        return None
    path = os.path.join(bin_dir, hw.binary)
    if not os.access(path, os.X_OK):
        entry["notes"].append(f"hand-written C++ row skipped: {path} not found (it is built by `make build` "
                              "once the root CMakeLists.txt has add_subdirectory(bench)).")
        return None
    try:
        got = measure.run_binary(path, (*hw.args, "--warmup", "0", "--iters", "1"))["check"]
    except Exception as e:  # noqa: BLE001
        entry["notes"].append(f"hand-written C++ row skipped: {path} failed: {e}")
        return None
    expected = hw.check()
    if not math.isclose(got, expected, rel_tol=1e-9):
        entry["notes"].append(f"hand-written C++ row skipped: {hw.binary} computes {got!r}, the Python case "
                              f"{expected!r}; the mirror has drifted from bench/cases.py.")
        return None
    entry["results"]["handwritten"] = {"binary": path, "check": got}
    return measure.binary_runner(path, hw.args, settings.binary_warmup)


def run_case(case: Case, backends: list[str], settings: Settings, *, isolate: bool, bin_dir: str, scratch: str,
             log: Callable[[str], None], threads: list[int] | None = None) -> list[dict[str, Any]]:
    """At the largest thread count: first calls (one process each for measure.ISOLATED), then every backend
    compiled here. Then for each thread count, the backends timed in interleaved rounds: one entry each."""
    threads = threads or [torch.get_num_threads()]
    base = {"name": case.name, "description": case.description, "ops": case.ops}
    why = case.unavailable() if case.unavailable is not None else None
    if why:
        log(f"{case.name}: skipped ({why})")
        return [{**base, "threads": n, "results": {}, "notes": [f"skipped: {why}"], "skipped": why} for n in threads]
    built = case.build()  # the weights a step reads (report.floor_table)
    base["weight_bytes"] = measure.weight_bytes(built) if isinstance(built, torch.nn.Module) else 0
    del built
    saved_threads = torch.get_num_threads()
    results: dict[str, dict[str, Any]] = {b: {} for b in backends}
    notes: list[str] = []
    inductor_dir = None
    # Compile at the largest thread count: inductor decides which loops run in parallel at code generation.
    torch.set_num_threads(max(threads))
    try:
        for backend in [b for b in backends if b in measure.ISOLATED]:
            cache_dir = tempfile.mkdtemp(prefix=f"{case.name}-{backend}-", dir=scratch)
            log(f"{case.name}: first call and memory, {backend}" + (" (fresh process)" if isolate else ""))
            try:
                if isolate:
                    result = measure.first_call_isolated(case.name, backend, cache_dir, threads=max(threads))
                else:
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
                    result = measure.first_call(case, backend)
            except Exception as e:  # noqa: BLE001  (one failing backend must not sink the run)
                notes.append(f"{backend}: first-call measurement failed: {e}")
                results[backend]["first_call_error"] = getattr(e, "log", None) or repr(e)
                continue
            results[backend].update(result)
            if backend == "inductor":
                inductor_dir = cache_dir
        # Only the isolated compile above is timed; here inductor may reuse the C++ kernels it built.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_dir or tempfile.mkdtemp(dir=scratch)

        torch._dynamo.reset()
        runners: dict[str, measure.Runner] = {}
        for backend in backends:
            log(f"{case.name}: compiling and warming up {backend}")
            try:
                got, info = prepare(case, backend, settings.warmup, in_process_first_call=backend not in measure.ISOLATED)
                runners.update(got)
            except measure.Unavailable as e:
                info = {"unavailable": str(e)}
            except Exception as e:  # noqa: BLE001
                info = {"steady_state_error": traceback.format_exc(limit=-8),
                        "unavailable": f"setup failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
                notes.append(f"{backend}: steady-state setup failed: {type(e).__name__}: {e}")
            results[backend].update(info)
            if info.get("engine_ran") is False:
                notes.append(f"{backend}: the C++ engine did not serve the calls (a fallback ran).")
            if "unavailable" in info and "steady_state_error" not in info:
                notes.append(f"{backend}: {info['unavailable']}")
            notes += [f"{backend}: {w}" for w in info.get("warnings", [])]

        entries = []
        for n in threads:
            torch.set_num_threads(n)
            entry: dict[str, Any] = {**base, "threads": n, "notes": list(notes),
                                     "results": {b: dict(r) for b, r in results.items()}}
            timed = dict(runners)
            hand = handwritten_runner(case, bin_dir, settings, entry)
            if hand is not None:
                timed["handwritten"] = hand
            for runner in timed.values():  # at the new thread count: thread pools, ONNX Runtime's session
                runner(0.0)
            if base["weight_bytes"]:  # the floor at this thread count (report.floor_table)
                entry["weight_floor_us"] = measure.gemv_floor_us(base["weight_bytes"])
            log(f"{case.name}: timing {', '.join(timed)} at {n} thread{'s' if n > 1 else ''} "
                f"in {settings.rounds} interleaved rounds")
            for name, samples in measure.interleaved(timed, settings.rounds, settings.round_s).items():
                backend, _, part = name.partition(":")
                stats = measure.summarize(samples)
                r = entry["results"].setdefault(backend, {})
                if part == "engine":
                    r["engine_median_us"] = stats["median_us"]
                    r["engine_samples"] = stats["samples"]
                else:
                    r.update(stats)
            for r in entry["results"].values():
                if "engine_median_us" in r and "median_us" in r:
                    r["outside_engine_us"] = r["median_us"] - r["engine_median_us"]
            entries.append(entry)
    finally:
        torch.set_num_threads(saved_threads)
    torch._dynamo.reset()
    return entries


# -- the suite -----------------------------------------------------------------------------
def machine_info(settings: Settings, backends: list[str]) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
            "backends": backends, "settings": settings.describe(), "quick": settings == QUICK}


def run_suite(cases: list[Case], backends: list[str], settings: Settings, *, isolate: bool = True,
              bin_dir: str = DEFAULT_BIN_DIR, log: Callable[[str], None] = _log,
              warm_start: bool = False, tp_decode: bool = False, cpp_runner: list[Case] | None = None,
              cpp_runs: int = 1000, threads: list[int] | None = None, per_call: bool = False,
              device_graph_cost: bool = False, variants: bool = False) -> dict[str, Any]:
    """Measure every case on every backend; the results dict of bench/report.py, targets included.

    isolate=False measures the first call in this process (for tests: cases need not be importable).
    threads: the torch thread counts each case is timed at (default: torch's current one); one entry per
    case per thread count in results["cases"].
    cpp_runner: the cases graphex-run also runs (exported; bench/cpp_runner.py), `cpp_runs` timed runs each.
    variants: also time the generated decoder variants (bench/variants.py) at the same thread counts.
    """
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    scratch = tempfile.mkdtemp(prefix="graphex-bench-")
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        entries = [entry for case in cases
                   for entry in run_case(case, backends, settings, isolate=isolate, bin_dir=bin_dir, scratch=scratch,
                                         log=log, threads=threads)]
    finally:
        if saved is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
        shutil.rmtree(scratch, ignore_errors=True)
    results = {"meta": {**machine_info(settings, backends), "load_before": load_before,
                        "threads": threads or [torch.get_num_threads()]}, "cases": entries}
    if warm_start:
        from . import warm_start as warm_start_mod

        try:
            results["warm_start"] = warm_start_mod.measure(log)
        except Exception as e:  # noqa: BLE001
            results["warm_start"] = {"error": str(e)}
    if tp_decode:  # the 2-rank tensor-parallel decode step (bench/tp_decode.py), eager vs graphex
        from . import tp_decode as tp_decode_mod

        try:
            results["tp_decode"] = tp_decode_mod.measure(log, rounds=settings.rounds, round_s=settings.round_s,
                                                         warmup=settings.warmup)
        except Exception as e:  # noqa: BLE001
            results["tp_decode"] = {"error": str(e)}
    if cpp_runner:
        from . import cpp_runner as cpp_runner_mod

        results["cpp_runner"] = cpp_runner_mod.measure(cpp_runner, log, cpp_runs)
    if per_call:  # the layers of one call outside the engine (bench/per_call.py), at 1 thread
        from . import per_call as per_call_mod

        results["per_call"] = per_call_mod.measure_all(cases, log, rounds=settings.rounds, round_s=settings.round_s)
    if device_graph_cost:  # the device-graph runner's host cost on gxsim (bench/device_graph_cost.py)
        from . import device_graph_cost as device_graph_cost_mod

        try:
            results["device_graph_cost"] = device_graph_cost_mod.measure(
                log, rounds=settings.rounds, calls=300 if settings == FULL else 30)
        except Exception as e:  # noqa: BLE001  one section failing does not lose the others
            results["device_graph_cost"] = {"error": f"{type(e).__name__}: {e}"}
    if variants:  # the generated decoder variants' decode steps (bench/variants.py): fused against inductor and ORT
        from . import variants as variants_mod

        saved_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="graphex-bench-variants-")
        try:
            results["variants"] = variants_mod.measure_all(
                log, threads, rounds=settings.rounds, round_s=settings.round_s, warmup=settings.warmup,
                which="bench" if settings == FULL else "quick", backends=backends)
        except Exception as e:  # noqa: BLE001  one section failing does not lose the others
            results["variants"] = {"error": f"{type(e).__name__}: {e}"}
        finally:
            shutil.rmtree(os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
            if saved_dir is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved_dir
    results["targets"] = report.derive(results)
    return results


def cpp_runner_cases(selected: list[Case]) -> list[Case]:
    """The selected decoder cases (bench/cpp_runner.py CASE_NAMES), which graphex-run runs too."""
    from .cpp_runner import CASE_NAMES

    return [c for c in selected if c.name in CASE_NAMES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few, short rounds: a smoke test, not a measurement")
    parser.add_argument("--only", metavar="NAME", help="one workload (comma-separate several): "
                        + ", ".join(c.name for c in cases_mod.CASES))
    parser.add_argument("--out", metavar="DIR", default=DEFAULT_OUT, help="where the results go (default bench/results)")
    parser.add_argument("--backends", default=",".join(measure.BACKENDS), help="comma-separated subset of "
                        + ", ".join(measure.BACKENDS) + " (- or _ alike: torchscript-ofi, graphex-fused)")
    parser.add_argument("--threads", default="1,2", help="torch thread counts to time each workload at, comma-separated "
                        "(default 1,2; ONNX Runtime's intra-op threads the same, inter-op 1)")
    parser.add_argument("--no-warm-start", action="store_true",
                        help="skip cache_compile's cold-vs-warm fresh-process measurement")
    parser.add_argument("--no-tp-decode", action="store_true",
                        help="skip the 2-rank tensor-parallel decode step (eager vs graphex, torchrun on 127.0.0.1)")
    parser.add_argument("--no-cpp-runner", action="store_true",
                        help="skip the C++ runner (graphex-run on the exported decoder cases)")
    parser.add_argument("--no-device-graph-cost", action="store_true",
                        help="skip device graphs' host cost on the simulated accelerator (bench/device_graph_cost.py)")
    parser.add_argument("--no-per-call", action="store_true",
                        help="skip the per-call layers outside the engine (Dynamo, guards, AOTAutograd, graphex's Python)")
    parser.add_argument("--no-variants", action="store_true",
                        help="skip the generated decoder variants' decode steps (bench/variants.py: fused against "
                        "inductor and ONNX Runtime)")
    parser.add_argument("--bin-dir", default=DEFAULT_BIN_DIR, help="where the hand-written C++ binaries are "
                        "(default build/py/bench)")
    ns = parser.parse_args(argv)

    try:
        selected = [cases_mod.find(n.strip()) for n in ns.only.split(",")] if ns.only else list(cases_mod.CASES)
    except ValueError as e:
        parser.error(str(e))
    backends = [measure.canonical(b) for b in ns.backends.split(",") if b.strip()]
    try:
        threads = [int(t) for t in ns.threads.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--threads: expected comma-separated integers, got {ns.threads!r}")
    if not threads or min(threads) < 1:
        parser.error("--threads: at least one thread count, each >= 1")
    unknown = [b for b in backends if b not in measure.BACKENDS]
    if unknown:
        parser.error(f"unknown backends {unknown}; known: {', '.join(measure.BACKENDS)}")

    results = run_suite(selected, backends, QUICK if ns.quick else FULL, bin_dir=ns.bin_dir,
                        warm_start=not ns.no_warm_start and "graphex" in backends,
                        tp_decode=not ns.no_tp_decode and {"eager", "graphex"} <= set(backends),
                        cpp_runner=None if ns.no_cpp_runner else cpp_runner_cases(selected),
                        cpp_runs=100 if ns.quick else 1000, threads=threads,
                        per_call=not ns.no_per_call and "graphex" in backends,
                        device_graph_cost=not ns.no_device_graph_cost and "graphex" in backends,
                        variants=not ns.no_variants and not ns.only and "graphex_fused" in backends)
    paths = report.write(results, ns.out)
    _log("wrote " + ", ".join(paths.values()))
    print(report.markdown(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
