"""The results: derived figures checked against the project's targets, then
results.json, results.md (tables ready for docs/benchmarks.md) and latency.png.

The results dict (what bench/run.py builds) looks like:
    {"meta": {...machine, torch, date, settings...},
     "cases": [{"name", "description", "ops", "notes": [...],
                "results": {backend: {"median_us", "p10_us", "p90_us", "first_call_s",
                                      "peak_step_bytes", ...}}}],
     "targets": [...]}     # added by `derive`
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

from .cases import CHAIN, DECODER

DECODE_CASES = (DECODER.name, "llama_decode", "gpt2_decode")

ORDER = ("eager", "torchscript", "torchscript_ofi", "onnxruntime", "inductor", "aot_eager", "graphex", "graphex_fused",
         "graphex_cached", "graphex_cached_fused", "handwritten")
LABELS = {"eager": "eager", "torchscript": "TorchScript (trace + freeze)",
          "torchscript_ofi": "TorchScript optimize_for_inference", "onnxruntime": "ONNX Runtime (CPU EP)",
          "inductor": "inductor (torch.compile default)", "aot_eager": "aot_eager",
          "graphex": "graphex", "graphex_fused": "graphex fused (pattern_fusion_pass, frozen_parameter)",
          "graphex_cached": "graphex via cache_compile (no Dynamo per call)",
          "graphex_cached_fused": "graphex fused via cache_compile (pattern_fusion_pass, no Dynamo per call)",
          "handwritten": "hand-written C++ (ATen)"}


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal from the project issue: `compute(case)` gives the figure (None: not measured), met when <= limit."""

    figure: str
    limit: float
    unit: str
    compute: Callable[[dict[str, Any]], float | None]
    cases: tuple[str, ...] | None = None  # None: every case
    per_threads: bool = True  # False: measured once per case (first call, memory), reported once


def _get(case: dict[str, Any], backend: str, key: str) -> float | None:
    value = case["results"].get(backend, {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _ratio(backend: str, base: str, key: str) -> Callable[[dict[str, Any]], float | None]:
    def compute(case: dict[str, Any]) -> float | None:
        a, b = _get(case, backend, key), _get(case, base, key)
        return a / b if a is not None and b else None

    return compute


def _outside_engine(case: dict[str, Any]) -> float | None:
    return _get(case, "graphex", "outside_engine_us")


def _overhead_per_op(case: dict[str, Any]) -> float | None:
    g, h = _get(case, "graphex", "median_us"), _get(case, "handwritten", "median_us")
    return (g - h) / case["ops"] if g is not None and h is not None and case.get("ops") else None


TARGETS = (
    Target("step latency, graphex / eager", 0.5, "x", _ratio("graphex", "eager", "median_us"), (DECODER.name,)),
    Target("engine overhead per op, (graphex - hand-written) / ops", 0.5, "us", _overhead_per_op, (CHAIN.name,)),
    Target("first call, graphex / inductor", 0.2, "x", _ratio("graphex", "inductor", "first_call_s"), per_threads=False),
    Target("peak step memory, graphex / eager", 1.1, "x", _ratio("graphex", "eager", "peak_step_bytes"),
           per_threads=False),
    # issue 21 (fused mode) and issue 22 (exact mode's per call), as those issues state them
    Target("decode step, graphex fused / inductor", 0.85, "x", _ratio("graphex_fused", "inductor", "median_us"),
           DECODE_CASES),
    Target("decode step, graphex fused / ONNX Runtime", 1.0, "x", _ratio("graphex_fused", "onnxruntime", "median_us"),
           DECODE_CASES),
    # the same step on the guard-free path (cache_compile): what fused mode's kernels give without Dynamo's call
    Target("decode step, graphex fused via cache_compile / ONNX Runtime", 1.0, "x",
           _ratio("graphex_cached_fused", "onnxruntime", "median_us"), DECODE_CASES),
    Target("prefill, encoder or conv net, graphex fused / inductor", 1.0, "x",
           _ratio("graphex_fused", "inductor", "median_us"), ("llama_prefill128", "gpt2_prefill128", "bert_encoder",
                                                              "convnet", "mha_block", "transformer_encoder")),
    Target("decode step, graphex exact / TorchScript freeze", 0.9, "x", _ratio("graphex", "torchscript", "median_us"),
           DECODE_CASES),
    Target("conv net or attention block, graphex exact / eager", 0.9, "x", _ratio("graphex", "eager", "median_us"),
           ("convnet", "mha_block", "transformer_encoder")),
    Target("outside the engine, graphex exact", 40.0, "us", _outside_engine),
)
# the variants' medians (bench/variants.py), as the same targets: (figure, limit, key of the median)
VARIANT_TARGETS = (("decode step, graphex fused / inductor (generated variants' median)", 0.85, "fused_over_inductor"),
                   ("decode step, graphex fused / ONNX Runtime (generated variants' median)", 1.0,
                    "fused_over_onnxruntime"))


def derive(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target for every case it applies to, with its value and pass (None when not measured)."""
    rows = []
    warm = results.get("warm_start")
    if warm is not None:
        value = warm.get("ratio")
        rows.append({"figure": "cache_compile first output, warm / cold process", "case": DECODER.name,
                     "value": value, "limit": 0.1, "unit": "x",
                     "passed": None if value is None else bool(value <= 0.1)})
    variants = results.get("variants") or {}
    for n, medians in (variants.get("medians") or {}).items():
        for figure, limit, key in VARIANT_TARGETS:
            value = medians.get(key)
            rows.append({"figure": figure, "case": "bench/variants.py", "threads": int(n), "value": value,
                         "limit": limit, "unit": "x", "passed": None if value is None else bool(value <= limit)})
    last = {case["name"]: i for i, case in enumerate(results["cases"])}  # a case's entry at its last thread count
    for target in TARGETS:
        for i, case in enumerate(results["cases"]):
            if target.cases is not None and case["name"] not in target.cases:
                continue
            if not target.per_threads and last[case["name"]] != i:
                continue
            value = target.compute(case)
            rows.append({"figure": target.figure, "case": case["name"], "threads": case.get("threads"), "value": value,
                         "limit": target.limit, "unit": target.unit,
                         "passed": None if value is None else bool(value <= target.limit)})
    return rows


# -- formatting ---------------------------------------------------------------------------------
def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{_num(value)} us"


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1024:
        return f"{value:.0f} B"
    if value < 1024 ** 2:
        return f"{value / 1024:.1f} KiB"
    return f"{value / 1024 ** 2:.2f} MiB"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} s" if value >= 0.1 else f"{value * 1000:.1f} ms"


def _value(row: dict[str, Any]) -> str:
    v = row["value"]
    if v is None:
        return "not measured"
    return f"{v:.3f} us" if row["unit"] == "us" else f"{v:.3f}x"


def _verdict(row: dict[str, Any]) -> str:
    return "n/a" if row["passed"] is None else "PASS" if row["passed"] else "FAIL"


def _busy(meta: dict[str, Any]) -> list[str]:
    """A warning line when other work was running: the 1-minute load average before the run."""
    load, cores = meta.get("load_before"), meta.get("cores") or 1
    if load is None or load <= 0.5 * cores:
        return []
    return [f"**Warning:** the machine was busy (load average {load:.1f} on {cores} cores before the run); "
            "latencies and first calls are inflated and noisy."]


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def equality(r: dict[str, Any]) -> str:
    """The row's "== eager" cell: bitwise, or the largest difference (against eager on the backend's code path)."""
    if "unavailable" in r:
        return "-"
    diff = r.get("max_abs_diff_vs_eager")
    if diff is None:
        return "-"
    cell = "bitwise" if diff == 0 else f"max diff {diff:.1e}"
    if "reference" in r:
        cell += "\u2020"
        plain = r.get("max_abs_diff_vs_plain_eager")
        if plain is not None and plain != diff:
            cell += f" (eager's own path: {'bitwise' if plain == 0 else f'{plain:.1e}'})"
    return cell


def _outside(r: dict[str, Any]) -> str:
    out, median = r.get("outside_engine_us"), r.get("median_us")
    if out is None or not median:
        return "-"
    return f"{_num(out) if out >= 0 else '-' + _num(-out)} us ({out / median:.0%})"


def _first(r: dict[str, Any]) -> str:
    cell = _seconds(r.get("first_call_s"))
    return cell + "*" if r.get("first_call_in_process") and cell != "-" else cell


def _memory(r: dict[str, Any]) -> str:
    if r.get("peak_step_bytes") is None and r.get("peak_step_note"):
        return "not seen"
    return _bytes(r.get("peak_step_bytes"))


def thread_counts(results: dict[str, Any]) -> list[int | None]:
    seen: list[int | None] = []
    for case in results["cases"]:
        if case.get("threads") not in seen:
            seen.append(case.get("threads"))
    return seen


def _thread_word(n: int | None) -> str:
    return "torch's default threads" if n is None else f"{n} torch thread{'s' if n != 1 else ''}"


def step_table(results: dict[str, Any], threads: int | None) -> list[str]:
    """The per-backend table for one thread count."""
    lines = ["| workload | backend | median step | p10 - p90 | vs eager | == eager | outside engine | first call "
             "| peak step memory |", "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for case in results["cases"]:
        if case.get("threads") != threads:
            continue
        if case.get("skipped"):
            lines.append(f"| {case['name']} | - | skipped: {_one_line(case['skipped'], 120)} | | | | | | |")
            continue
        eager = _get(case, "eager", "median_us")
        for name in [b for b in ORDER if b in case["results"]] + [b for b in case["results"] if b not in ORDER]:
            r = case["results"][name]
            if "unavailable" in r:
                lines.append(f"| {case['name']} | {LABELS.get(name, name)} | not run: {_one_line(r['unavailable'], 160)} "
                             f"| - | - | - | - | - | - |")
                continue
            median = r.get("median_us")
            spread = f"{_num(r['p10_us'])} - {_us(r['p90_us'])}" if "p10_us" in r else "-"
            vs = f"{median / eager:.2f}x" if median is not None and eager else "-"
            lines.append(f"| {case['name']} | {LABELS.get(name, name)} | {_us(median)} | {spread} | {vs} "
                         f"| {equality(r) if name not in ('eager', 'handwritten') else '-'} | {_outside(r)} "
                         f"| {_first(r)} | {_memory(r)} |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    """The machine line, the per-backend tables (one per thread count), the targets table and the notes."""
    meta = results["meta"]
    lines = [
        f"Machine: {meta['cpu']} ({meta['cores']} cores), "
        f"torch {meta['torch']}, Python {meta['python']}, {meta['date']}"
        + (f", graphex {meta['commit']}" if meta.get("commit") else "") + ".",
        f"Latency: {meta['settings']}." + (" Quick run: a smoke test, not a measurement." if meta.get("quick") else ""),
        *_busy(meta),
    ]
    for n in thread_counts(results):
        lines += ["", f"### {_thread_word(n)}" + (" (ONNX Runtime: intra-op threads the same, inter-op 1)" if n else ""),
                  "", *step_table(results, n)]
    lines += floor_table(results)
    lines += ["", "| target | workload | threads | value | goal | result |", "|---|---|---:|---:|---:|:---:|"]
    for row in results.get("targets", []):
        goal = f"<= {row['limit']} us" if row["unit"] == "us" else f"<= {row['limit']}x"
        threads = row.get("threads")
        lines.append(f"| {row['figure']} | {row['case']} | {'-' if threads is None else threads} | {_value(row)} "
                     f"| {goal} | {_verdict(row)} |")
    described: set[str] = set()
    for case in results["cases"]:
        bd = case["results"].get("graphex", {}).get("breakdown")
        if bd and case["name"].startswith("decoder") and case["name"] not in described:
            described.add(case["name"])
            step = case["results"]["graphex"].get("median_us")
            top = ", ".join(f"{r['op']} {r['share']:.0%} ({r['calls_per_step']}x)" for r in bd["top"][:4])
            lines += ["", f"Where a graphex {case['name']} goes ({_thread_word(bd.get('threads', case.get('threads')))}; engine's "
                      f"per-instruction clock, {bd['instructions_us_per_step']:.0f} us of operator time"
                      + (f" in a {step:.0f} us step" if step else "") + f"): {top}."]
    warm = results.get("warm_start")
    if warm is not None:
        lines += [""]
        if "error" in warm:
            lines.append(f"cache_compile warm start: not measured ({_one_line(warm['error'])})")
        else:
            lines += ["| cache_compile, decoder_step | first call | whole process | Dynamo compiles | == eager |",
                      "|---|---:|---:|---:|:---:|"]
            for name in ("cold", "warm"):
                r = warm[name]
                lines.append(f"| {name} process | {_seconds(r['first_call_s'])} | {_seconds(r['process_s'])} "
                             f"| {r['dynamo_compiles']} | {'yes' if r['equal'] else 'NO'} |")
    from .tp_decode import markdown_lines as tp_decode_lines

    lines += tp_decode_lines(results.get("tp_decode"))
    from .cpp_runner import markdown_lines as cpp_runner_lines

    most = max((c.get("threads") or 0 for c in results["cases"]), default=0)
    lines += cpp_runner_lines(results.get("cpp_runner"), [c for c in results["cases"] if (c.get("threads") or 0) == most])
    from .per_call import markdown_lines as per_call_lines

    lines += per_call_lines(results.get("per_call"))
    from .device_graph_cost import markdown_lines as device_graph_cost_lines

    lines += device_graph_cost_lines(results.get("device_graph_cost"))
    from .variants import markdown_lines as variants_lines

    lines += variants_lines(results.get("variants"))
    lines += ["", "Workloads:"]
    listed: set[str] = set()
    for case in results["cases"]:
        if case["name"] in listed:
            continue
        listed.add(case["name"])
        ops = case["results"].get("graphex", {}).get("graphex_ops")
        lines.append(f"- {case['name']}: {case['description']}" + (f" (graphex replays {ops} ATen ops)" if ops else "") + ".")
    lines += ["", "First call: compile + first run, in a fresh process per backend (imports excluded; inductor with "
              "an empty cache dir and its FX graph / AOTAutograd caches off) for inductor and graphex, at the largest thread "
              "count; * marks backends measured in the bench process, at the same thread count, when first compiled "
              "(TorchScript trace + freeze, ONNX export + session, graphex fused, cache_compile into an empty cache; "
              "Dynamo reset before, no compile cache applies to them). Peak step memory: the most bytes "
              "live at once among the CPU allocations made during one steady-state step (torch.profiler memory events), "
              "outputs included; memory held before the step (weights, KV cache, constants) is not counted; ONNX "
              "Runtime's arena is not seen by the profiler. == eager: bitwise, or the largest absolute difference "
              "from eager's output; \u2020 marks a comparison with eager run on the code path the backend traced "
              "(transformers decides its attention path with is_torchdynamo_compiling() and friends; bench/models.py "
              "code_path patches them for the reference run only), with eager's own path in brackets where that differs. "
              "Outside engine: graphex's median step minus its bare C++ engine's (CompiledGraph.executor on the "
              "arguments of a real call, timed in the same rounds): Dynamo's guards, AOTAutograd's wrapper, Python."]
    notes = []
    for case in results["cases"]:
        for note in case.get("notes", []):
            line = f"{case['name']}: {note}"
            if line not in notes:
                notes.append(line)
        for name in ORDER:
            how = case["results"].get(name, {}).get("how")
            line = f"{case['name']}, {LABELS.get(name, name)}: {how}" if how else None
            if line and line not in notes:
                notes.append(line)
    if notes:
        lines += [""] + [f"- {_one_line(note)}" for note in notes]
    return "\n".join(lines) + "\n"


def floor_table(results: dict[str, Any]) -> list[str]:
    """Each workload with weights against its floor: one float32 matrix-vector product over as many bytes as its
    weights, at that thread count (measure.gemv_floor_us), and each graphex median as a multiple of it."""
    rows = []
    for case in results["cases"]:
        nbytes, floor, n = case.get("weight_bytes") or 0, case.get("weight_floor_us"), case.get("threads")
        if nbytes <= 0 or not floor or case.get("skipped"):
            continue
        exact = case["results"].get("graphex", {}).get("median_us")
        fused = case["results"].get("graphex_fused", {}).get("median_us")

        def times(step: float | None) -> str:
            return f"{_us(step)} ({step / floor:.1f}x)" if step else "-"

        rows.append(f"| {case['name']} | {n} | {nbytes / 1e6:.2f} MB | {_us(floor)} ({nbytes / floor / 1e3:.1f} GB/s) "
                    f"| {times(exact)} | {times(fused)} |")
    if not rows:
        return []
    return ["", "Weight floor: one float32 matrix-vector product (torch.mv) over as many bytes as the workload's weights "
            "(an embedding table read one row at a time left out), at each thread count: what reading the weights "
            "once costs here, from whichever cache they fit in. A decode step reads them at least once; prefills and "
            "encoders are bound by compute instead.", "",
            "| workload | threads | weights | floor (read rate) | graphex exact (/ floor) | graphex fused (/ floor) |",
            "|---|---:|---:|---:|---:|---:|", *rows]


def plot(results: dict[str, Any], path: str) -> None:
    """Grouped bars, one panel per thread count: median step latency per workload and backend, log scale,
    p10-p90 whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    counts = thread_counts(results)
    names = list(dict.fromkeys(c["name"] for c in results["cases"]))
    fig, axes = plt.subplots(len(counts), 1, figsize=(4.6 + 1.4 * len(names), 3.8 * len(counts)), squeeze=False)
    for ax, n in zip(axes[:, 0], counts):
        cases = {c["name"]: c for c in results["cases"] if c.get("threads") == n}
        backends = [b for b in ORDER if any(b in c["results"] and "median_us" in c["results"][b] for c in cases.values())]
        width = 0.8 / max(len(backends), 1)
        x = np.arange(len(names))
        for i, backend in enumerate(backends):
            rows = [cases.get(name, {}).get("results", {}).get(backend, {}) for name in names]
            med = np.array([r.get("median_us", np.nan) for r in rows], dtype=float)
            lo = np.array([r.get("p10_us", np.nan) for r in rows], dtype=float)
            hi = np.array([r.get("p90_us", np.nan) for r in rows], dtype=float)
            err = np.nan_to_num(np.vstack([med - lo, hi - med]))
            ax.bar(x + (i - (len(backends) - 1) / 2) * width, med, width, yerr=err, capsize=1, label=LABELS[backend])
        ax.set_xticks(x, names, rotation=20, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("median step (us, log)")
        ax.set_title(f"{_thread_word(n)} - torch {results['meta']['torch']}, {results['meta']['cpu']}", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(results: dict[str, Any], out_dir: str) -> dict[str, str]:
    """results.json, results.md and latency.png under out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "results.json"), "markdown": os.path.join(out_dir, "results.md"),
             "png": os.path.join(out_dir, "latency.png")}
    with open(paths["json"], "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    with open(paths["markdown"], "w") as f:
        f.write(markdown(results))
    plot(results, paths["png"])
    return paths


SUMMARY_BACKENDS = ("eager", "torchscript", "onnxruntime", "inductor", "graphex", "graphex_fused", "graphex_cached",
                    "graphex_cached_fused")


def summary_table(results: dict[str, Any], threads: int | None, cases: list[str] | None = None) -> list[str]:
    """One row per workload, one column per backend: the median step and its ratio to eager (docs' headline tables)."""
    names = {"eager": "eager", "torchscript": "TorchScript freeze", "onnxruntime": "ONNX Runtime",
             "inductor": "inductor", "graphex": "graphex exact", "graphex_fused": "graphex fused",
             "graphex_cached": "exact, cache_compile", "graphex_cached_fused": "fused, cache_compile"}
    backends = [b for b in SUMMARY_BACKENDS  # a backend no case ran (a run before it was a row) is left out
                if any(_get(c, b, "median_us") is not None for c in results["cases"])]
    lines = ["| workload | " + " | ".join(names[b] for b in backends) + " |",
             "|---|" + "---:|" * len(backends)]
    for case in results["cases"]:
        if case.get("threads") != threads or case.get("skipped") or (cases and case["name"] not in cases):
            continue
        eager = _get(case, "eager", "median_us")
        cells = []
        for b in backends:
            median = _get(case, b, "median_us")
            if median is None:
                cells.append("n/a")
            elif b == "eager" or not eager:
                cells.append(_us(median))
            else:
                cells.append(f"{_us(median)} ({median / eager:.2f}x)")
        lines.append(f"| {case['name']} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Print a results.json's headline tables (median step, / eager).")
    p.add_argument("results", help="a results.json written by python -m bench.run")
    p.add_argument("--only", help="comma-separated workloads")
    args = p.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)
    meta = results["meta"]
    print(f"{meta['date']}, graphex {meta['commit']}, {meta['cpu']} ({meta['cores']} cores), torch {meta['torch']}"
          + (f"; load average {meta['load_before']:.1f} before the run" if meta.get("load_before") else ""))
    for n in thread_counts(results):
        print(f"\n{_thread_word(n)}: median step, and / eager\n")
        print("\n".join(summary_table(results, n, args.only.split(",") if args.only else None)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
