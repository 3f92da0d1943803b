"""The C++ runner next to the Python engine: each decoder case exported (graphex.export) and run by
graphex-run (C++, no Python), its median step and its load-to-first-output time.

    python -m bench.cpp_runner [--runs N]     # the decoder cases alone, as JSON

For each case: graphex.export(case.build(), case.inputs(...)) into a scratch directory, the inputs
written as safetensors, then `graphex-run ART --inputs IN --output OUT --bench N` (with
--load-library when the program calls the example operators): the output is compared with eager
bit for bit, and graphex-run's own clock gives the median step (p10, p90) and the time from the
start of Module::load to the first output. "process" is the wall time of a second graphex-run that
runs once (exec, libtorch loading, load, one run, output written), as a deployment starts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from .cases import Case

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRAPHEX_RUN = os.path.join(os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py"), "graphex-run")
CASE_NAMES = ("decoder_step", "decoder_ops_step")
_MEDIAN = re.compile(r"median run time: ([\d.]+) us over (\d+) runs \(p10 ([\d.]+) us, p90 ([\d.]+) us\)")
_LOAD = re.compile(r"load: ([\d.]+) ms, first output after ([\d.]+) ms")


def measure_case(case: Case, runs: int, scratch: str, graphex_run: str = GRAPHEX_RUN) -> dict[str, Any]:
    import graphex
    from graphex.exporting import PROGRAM_FILE, load_safetensors, program_operators, safetensors_bytes

    built = case.build()
    args = case.inputs(built)
    with torch.no_grad():
        expected = pytree.tree_leaves(built(*pytree.tree_map_only(torch.Tensor, torch.clone, args)))
        art = graphex.export(built, pytree.tree_map_only(torch.Tensor, torch.clone, args),
                             os.path.join(scratch, case.name + ".graphex"))
    inputs, output = os.path.join(scratch, case.name + ".in"), os.path.join(scratch, case.name + ".out")
    with open(inputs, "wb") as f:
        f.write(safetensors_bytes({str(i): a for i, a in enumerate(pytree.tree_leaves(args))}))
    with open(os.path.join(art, PROGRAM_FILE), "rb") as f:
        custom = any(op.startswith("graphex_examples::") for op in program_operators(f.read()))
    libs: list[str] = []
    if custom:
        from examples import ops

        libs = ["--load-library", os.fspath(ops.library_path())]
    base = [graphex_run, art, "--inputs", inputs, *libs]
    started = time.perf_counter()
    once = subprocess.run([*base, "--output", output], capture_output=True, text=True, timeout=300)
    process_s = time.perf_counter() - started
    if once.returncode != 0:
        raise RuntimeError(f"graphex-run failed on {case.name}: {once.stderr[-2000:]}")
    got = load_safetensors(output)
    equal = len(got) == len(expected) and all(torch.equal(got[str(i)], e) for i, e in enumerate(expected))
    proc = subprocess.run([*base, "--bench", str(runs)], capture_output=True, text=True, timeout=600)
    median, load = _MEDIAN.search(proc.stdout), _LOAD.search(proc.stdout)
    if proc.returncode != 0 or not median or not load:
        raise RuntimeError(f"graphex-run --bench failed on {case.name}: {proc.stdout[-1000:]} {proc.stderr[-2000:]}")
    return {"median_us": float(median[1]), "runs": int(median[2]), "p10_us": float(median[3]),
            "p90_us": float(median[4]), "load_ms": float(load[1]), "first_output_ms": float(load[2]),
            "process_s": process_s, "equal": equal, "custom_ops_library": bool(custom)}


def measure(cases: list[Case], log: Callable[[str], None] = lambda m: None, runs: int = 1000,
            graphex_run: str = GRAPHEX_RUN) -> dict[str, Any]:
    """{case name: figures or {"error": ...}}; {"error": ...} alone when graphex-run is not built."""
    if not os.access(graphex_run, os.X_OK):
        return {"error": f"{graphex_run} not found (it is built by `make build`)"}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="graphex-cpp-runner-") as scratch:
        for case in cases:
            log(f"{case.name}: export, then graphex-run --bench {runs}")
            try:
                out[case.name] = measure_case(case, runs, scratch, graphex_run)
            except Exception as e:  # noqa: BLE001  (one failing case must not sink the run)
                out[case.name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def markdown_lines(cpp: dict[str, Any] | None, cases: list[dict[str, Any]]) -> list[str]:
    """The report's table for results["cpp_runner"] (bench/report.py), the Python engine's step beside it."""
    if cpp is None:
        return []
    if "error" in cpp and isinstance(cpp["error"], str):
        return ["", f"C++ runner (graphex-run): not measured ({' '.join(cpp['error'].split())[:300]})"]
    python = {c["name"]: c["results"].get("graphex", {}).get("median_us") for c in cases}
    lines = ["", "| C++ runner (graphex-run) | median step | p10 - p90 | Python engine (graphex) | load | "
             "load to first output | process, one run | == eager |", "|---|---:|---:|---:|---:|---:|---:|:---:|"]
    for name, r in cpp.items():
        if "error" in r:
            lines.append(f"| {name} | not measured: {' '.join(r['error'].split())[:200]} | | | | | | |")
            continue
        py = python.get(name)
        lines.append(f"| {name} | {r['median_us']:,.0f} us | {r['p10_us']:,.0f} - {r['p90_us']:,.0f} us "
                     f"| {'-' if py is None else f'{py:,.0f} us'} | {r['load_ms']:.1f} ms | {r['first_output_ms']:.1f} ms "
                     f"| {r['process_s'] * 1000:.0f} ms | {'yes' if r['equal'] else 'NO'} |")
    lines += ["", "- C++ runner: the case exported with graphex.export and run by build/py/graphex-run (no Python); "
              "median of its --bench runs on its own clock, in its own process (not interleaved with the Python "
              "backends). Load: Module::load (program verified, weights memory-mapped and checked); load to first "
              "output: from the start of loading to the first result; process: exec to exit of a run-once "
              "graphex-run (libtorch loading included)."]
    return lines


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    from .cases import CASES

    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 1000
    print(json.dumps(measure([c for c in CASES if c.name in CASE_NAMES], lambda m: print(m, file=sys.stderr), runs),
                     indent=1))
