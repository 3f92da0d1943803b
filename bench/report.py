"""The results: derived figures checked against the project's targets, then
results.json, results.md (tables ready for the README) and latency.png.

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

ORDER = ("eager", "inductor", "aot_eager", "graphex", "graphex_cached", "handwritten")
LABELS = {"eager": "eager", "inductor": "inductor (torch.compile default)", "aot_eager": "aot_eager",
          "graphex": "graphex", "graphex_cached": "graphex via cache_compile (no Dynamo per call)", "handwritten": "hand-written C++ (ATen)"}


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal from the project issue: `compute(case)` gives the figure (None: not measured), met when <= limit."""

    figure: str
    limit: float
    unit: str
    compute: Callable[[dict[str, Any]], float | None]
    cases: tuple[str, ...] | None = None  # None: every case


def _get(case: dict[str, Any], backend: str, key: str) -> float | None:
    value = case["results"].get(backend, {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _ratio(backend: str, base: str, key: str) -> Callable[[dict[str, Any]], float | None]:
    def compute(case: dict[str, Any]) -> float | None:
        a, b = _get(case, backend, key), _get(case, base, key)
        return a / b if a is not None and b else None

    return compute


def _overhead_per_op(case: dict[str, Any]) -> float | None:
    g, h = _get(case, "graphex", "median_us"), _get(case, "handwritten", "median_us")
    return (g - h) / case["ops"] if g is not None and h is not None and case.get("ops") else None


TARGETS = (
    Target("step latency, graphex / eager", 0.5, "x", _ratio("graphex", "eager", "median_us"), (DECODER.name,)),
    Target("engine overhead per op, (graphex - hand-written) / ops", 0.5, "us", _overhead_per_op, (CHAIN.name,)),
    Target("first call, graphex / inductor", 0.2, "x", _ratio("graphex", "inductor", "first_call_s")),
    Target("peak step memory, graphex / eager", 1.1, "x", _ratio("graphex", "eager", "peak_step_bytes")),
)


def derive(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target for every case it applies to, with its value and pass (None when not measured)."""
    rows = []
    warm = results.get("warm_start")
    if warm is not None:
        value = warm.get("ratio")
        rows.append({"figure": "cache_compile first output, warm / cold process", "case": DECODER.name,
                     "value": value, "limit": 0.1, "unit": "x",
                     "passed": None if value is None else bool(value <= 0.1)})
    for target in TARGETS:
        for case in results["cases"]:
            if target.cases is not None and case["name"] not in target.cases:
                continue
            value = target.compute(case)
            rows.append({"figure": target.figure, "case": case["name"], "value": value, "limit": target.limit,
                         "unit": target.unit, "passed": None if value is None else bool(value <= target.limit)})
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


def markdown(results: dict[str, Any]) -> str:
    """The machine line, the per-backend table, the targets table and the notes."""
    meta = results["meta"]
    lines = [
        f"Machine: {meta['cpu']} ({meta['cores']} cores, {meta['torch_threads']} torch threads), "
        f"torch {meta['torch']}, Python {meta['python']}, {meta['date']}"
        + (f", graphex {meta['commit']}" if meta.get("commit") else "") + ".",
        f"Latency: {meta['settings']}." + (" Quick run: a smoke test, not a measurement." if meta.get("quick") else ""),
        *_busy(meta),
        "",
        "| workload | backend | median step | p10 - p90 | vs eager | first call | peak step memory |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for case in results["cases"]:
        eager = _get(case, "eager", "median_us")
        for name in [b for b in ORDER if b in case["results"]] + [b for b in case["results"] if b not in ORDER]:
            r = case["results"][name]
            median = r.get("median_us")
            spread = f"{_num(r['p10_us'])} - {_us(r['p90_us'])}" if "p10_us" in r else "-"
            vs = f"{median / eager:.2f}x" if median is not None and eager else "-"
            lines.append(f"| {case['name']} | {LABELS.get(name, name)} | {_us(median)} | {spread} | {vs} "
                         f"| {_seconds(r.get('first_call_s'))} | {_bytes(r.get('peak_step_bytes'))} |")
    lines += ["", "| target | workload | value | goal | result |", "|---|---|---:|---:|:---:|"]
    for row in results.get("targets", []):
        goal = f"<= {row['limit']} us" if row["unit"] == "us" else f"<= {row['limit']}x"
        lines.append(f"| {row['figure']} | {row['case']} | {_value(row)} | {goal} | {_verdict(row)} |")
    for case in results["cases"]:
        bd = case["results"].get("graphex", {}).get("breakdown")
        if bd and case["name"].startswith("decoder"):
            step = case["results"]["graphex"].get("median_us")
            top = ", ".join(f"{r['op']} {r['share']:.0%} ({r['calls_per_step']}x)" for r in bd["top"][:4])
            lines += ["", f"Where a graphex {case['name']} goes (engine's per-instruction clock, "
                      f"{bd['instructions_us_per_step']:.0f} us of operator time"
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

    lines += cpp_runner_lines(results.get("cpp_runner"), results["cases"])
    lines += ["", "Workloads:"]
    for case in results["cases"]:
        ops = case["results"].get("graphex", {}).get("graphex_ops")
        lines.append(f"- {case['name']}: {case['description']}" + (f" (graphex replays {ops} ATen ops)" if ops else "") + ".")
    lines += ["", "First call: compile + first run, in a fresh process per backend (imports excluded; inductor with "
              "an empty cache dir and its FX graph / AOTAutograd caches off). Peak step memory: the most bytes live "
              "at once among the CPU allocations made during one steady-state step (torch.profiler memory events), "
              "outputs included; memory held before the step (weights, KV cache, constants) is not counted."]
    notes = [f"{case['name']}: {note}" for case in results["cases"] for note in case.get("notes", [])]
    if notes:
        lines += [""] + [f"- {_one_line(note)}" for note in notes]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: str) -> None:
    """Grouped bars: median step latency per workload and backend, log scale, p10-p90 whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cases = results["cases"]
    backends = [b for b in ORDER if any(b in c["results"] and "median_us" in c["results"][b] for c in cases)]
    width = 0.8 / max(len(backends), 1)
    fig, ax = plt.subplots(figsize=(4.6 + 2.4 * len(cases), 4.2))
    x = np.arange(len(cases))
    for i, backend in enumerate(backends):
        rows = [c["results"].get(backend, {}) for c in cases]
        med = np.array([r.get("median_us", np.nan) for r in rows], dtype=float)
        lo = np.array([r.get("p10_us", np.nan) for r in rows], dtype=float)
        hi = np.array([r.get("p90_us", np.nan) for r in rows], dtype=float)
        err = np.nan_to_num(np.vstack([med - lo, hi - med]))
        ax.bar(x + (i - (len(backends) - 1) / 2) * width, med, width, yerr=err, capsize=2, label=LABELS[backend])
    ax.set_xticks(x, [c["name"] for c in cases])
    ax.set_yscale("log")
    ax.set_ylabel("median step latency (us, log)")
    ax.set_title(f"graphex benchmark - torch {results['meta']['torch']}, {results['meta']['cpu']}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
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
