"""The generated decoder variants' decode steps, timed: graphex fused against inductor and ONNX Runtime.

    python -m bench.variants [--spellings bench|all] [--threads 1,2] [--rounds N] [--round-s S] [--json PATH]

Issue 21's decode target names "the generated variants' median" beside the repository's and transformers' decoders:
fused mode must be fast on decoders spelled the ways real model code spells them, not only on the ones the bench
was tuned on. sweeps/coverage_decoder.py builds those decoders (sweeps/fusion_coverage.py checks their tokens at
coverage sizes); here each is built at the size of the bench's Llama (`_sizes()`: hidden 512, 8 query and 2 key/value
heads, 4 layers, MLP 1376, vocab 4096, a cache of 256 positions) and timed for one token at position `POSITION`.

Each variant is a bench Case (bench/cases.py), prepared the way `make bench` prepares a workload (bench.run.prepare:
compiled, its first output compared with eager's, warmed up), then the backends are timed in interleaved rounds at
each thread count (bench.measure.interleaved). Per variant: the medians, fused / inductor, fused / ONNX Runtime, the
fused kernels that fired and the largest difference from eager; then the median of each ratio over the variants.
ONNX Runtime gets the caches as explicit inputs and outputs, as for decoder_step (bench/measure.py); a variant it
cannot export is a row that says so, left out of its median.

`--spellings bench` (the default, and `make bench`'s) is `BENCH_SPELLINGS`: the baseline and one spelling of each
part that changes the graph most. `--spellings all` is the baseline and every spelling of every part alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch

from . import measure
from .cases import Case

POSITION = 100
BACKENDS = ("eager", "onnxruntime", "inductor", "graphex_fused")


def _sizes() -> Any:
    from sweeps.coverage_decoder import Sizes

    return Sizes(vocab=4096, hidden=512, heads=8, kv_heads=2, layers=4, intermediate=1376, max_positions=256)


def _spellings(which: str) -> list[Any]:
    from sweeps.coverage_decoder import AXES, Spelling

    if which == "all":
        return [Spelling()] + [Spelling(**{axis: v}) for axis, values in AXES.items() for v in values[1:]]
    if which == "quick":  # `make bench BENCH_ARGS=--quick`: a smoke test of the section
        return [Spelling(), Spelling(dtype="bfloat16")]
    return [Spelling(**kw) for kw in BENCH_SPELLINGS]


# The baseline (SDPA over repeat_kv, a boolean mask, RMSNorm, a SiLU-gated MLP, rotate_half), then the spellings that
# change the graph most: the attention written out, GQA by repeat_interleave, an additive mask, Gemma's norm, a
# GPT-2-like block (LayerNorm, an ungated GELU MLP), Phi3's fused gate/up projection, interleaved rotary pairs, and
# the baseline in bfloat16.
BENCH_SPELLINGS: tuple[dict[str, str], ...] = (
    {}, {"attention": "written"}, {"gqa": "repeat_interleave"}, {"mask": "additive"}, {"norm": "gemma"},
    {"norm": "layernorm", "mlp": "ungated"}, {"mlp": "fused_gate_up"}, {"rotary": "interleaved"},
    {"dtype": "bfloat16"},
)


def variant_case(spelling: Any, sizes: Any = None) -> Case:
    from sweeps import coverage_decoder as cd

    sizes = sizes or _sizes()

    def build() -> torch.nn.Module:
        return cd.build(spelling, sizes)

    def inputs(model: Any) -> tuple[Any, ...]:  # at POSITION, or the cache's last position when it is shorter
        return (torch.tensor([[3]]), torch.tensor([min(POSITION, sizes.max_positions - 1)]), *model.new_cache())

    return Case(name=f"variant[{spelling.name}]", description=f"sweeps/coverage_decoder.py spelled {spelling.name}",
                build=build, inputs=inputs)


def measure_variant(spelling: Any, threads: list[int], rounds: int, round_s: float, warmup: int,
                    log: Callable[[str], None], backends: tuple[str, ...] = BACKENDS, sizes: Any = None) -> dict[str, Any]:
    """One variant: each backend prepared at the largest thread count, then timed at each; medians in us."""
    from .run import prepare

    case = variant_case(spelling, sizes)
    row: dict[str, Any] = {"name": spelling.name, "dtype": spelling.dtype, "backends": {}, "median_us": {}}
    saved = torch.get_num_threads()
    torch.set_num_threads(max(threads))
    try:
        torch._dynamo.reset()
        runners: dict[str, measure.Runner] = {}
        for backend in backends:
            before = {id(g) for g in measure.graphex_graphs()}
            try:
                got, info = prepare(case, backend, warmup, with_breakdown=False)
            except measure.Unavailable as e:
                row["backends"][backend] = {"unavailable": str(e)}
                continue
            except Exception as e:  # noqa: BLE001  (one backend failing is a row that says so)
                row["backends"][backend] = {"unavailable": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
                continue
            if backend == "graphex_fused":
                from sweeps.fusion_coverage import _fired  # the coverage table's count, the same graphs' `fused`

                info["fired"] = _fired([g for g in measure.graphex_graphs() if id(g) not in before])
            row["backends"][backend] = {k: v for k, v in info.items() if k in ("max_abs_diff_vs_eager", "fired", "how")}
            runners[backend] = got[backend]
        for n in threads:
            torch.set_num_threads(n)
            for run in runners.values():
                run(0.0)
            samples = measure.interleaved(runners, rounds, round_s)
            row["median_us"][str(n)] = {b: measure.summarize(s)["median_us"] for b, s in samples.items()}
        log(f"variant {spelling.name}: " + "; ".join(
            f"{n} thread(s) " + ", ".join(f"{b} {us:.0f}" for b, us in row["median_us"][str(n)].items())
            for n in threads))
    finally:
        torch.set_num_threads(saved)
        torch._dynamo.reset()
    return row


def _ratio(row: dict[str, Any], n: int, num: str, den: str) -> float | None:
    med = row["median_us"].get(str(n), {})
    return med[num] / med[den] if num in med and den in med and med[den] > 0 else None


def measure_all(log: Callable[[str], None], threads: list[int] | None = None, rounds: int = 6, round_s: float = 0.15,
                warmup: int = 10, which: str = "bench", backends: list[str] | None = None,
                sizes: Any = None, spellings: list[Any] | None = None) -> dict[str, Any]:
    """Every variant of `which` ("bench", "all", "quick"; or the given `spellings`), on BACKENDS (those of them in
    `backends`, when given), at `sizes` (default: the bench's Llama size, _sizes())."""
    threads = threads or [torch.get_num_threads()]
    chosen = tuple(b for b in BACKENDS if backends is None or b in backends)
    t0 = time.perf_counter()
    rows = []
    for spelling in spellings if spellings is not None else _spellings(which):
        log(f"variant {spelling.name}: compiling {', '.join(chosen)}")
        rows.append(measure_variant(spelling, threads, rounds, round_s, warmup, log, chosen, sizes))
    medians: dict[str, dict[str, float | None]] = {}
    for n in threads:
        ratios = {key: [r for r in (_ratio(row, n, "graphex_fused", den) for row in rows) if r is not None]
                  for key, den in (("fused_over_inductor", "inductor"), ("fused_over_onnxruntime", "onnxruntime"),
                                   ("fused_over_eager", "eager"))}
        medians[str(n)] = {key: statistics.median(v) if v else None for key, v in ratios.items()}
        medians[str(n)].update({f"{key}_count": len(v) for key, v in ratios.items()})
    return {"rows": rows, "threads": threads, "medians": medians, "position": POSITION,
            "sizes": str(sizes or _sizes()), "seconds": time.perf_counter() - t0, "rounds": rounds, "round_s": round_s}


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def markdown_lines(section: dict[str, Any] | None) -> list[str]:
    """The variants' table and their medians (bench/report.py appends these to results.md)."""
    if section is None:
        return []
    if "error" in section:
        return ["", f"Generated decoder variants: not measured ({section['error']})"]
    threads = section["threads"]
    lines = ["", f"The generated decoder variants (bench/variants.py; sweeps/coverage_decoder.py at {section['sizes']}, one "
             f"token at position {section['position']}), medians in us and fused / inductor, fused / ONNX Runtime, at "
             + ", ".join(f"{n} thread{'s' if n > 1 else ''}" for n in threads) + ":", "",
             "| variant | threads | eager | ONNX Runtime | inductor | graphex fused | fused / inductor "
             "| fused / ONNX Runtime | fused kernels | max diff (fused) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for row in section["rows"]:
        fused = row["backends"].get("graphex_fused", {})
        fired = ", ".join(f"{k} x{v}" for k, v in sorted(fused.get("fired", {}).items())) or "none"
        diff = fused.get("max_abs_diff_vs_eager")
        for n in threads:
            med = row["median_us"].get(str(n), {})
            cells = [f"{med[b]:.0f}" if b in med else "-" for b in BACKENDS]
            lines.append(f"| {row['name']} | {n} | " + " | ".join(cells)
                         + f" | {_x(_ratio(row, n, 'graphex_fused', 'inductor'))}"
                         f" | {_x(_ratio(row, n, 'graphex_fused', 'onnxruntime'))} | {fired} | "
                         + ("-" if diff is None else f"{diff:.2g}") + " |")
    lines += [""] + [f"Median over the variants at {n} thread{'s' if int(n) > 1 else ''}: fused / inductor "
                     f"{_x(m['fused_over_inductor'])} ({m['fused_over_inductor_count']} variants), fused / ONNX Runtime "
                     f"{_x(m['fused_over_onnxruntime'])} ({m['fused_over_onnxruntime_count']}), fused / eager "
                     f"{_x(m['fused_over_eager'])}." for n, m in section["medians"].items()]
    for row in section["rows"]:
        for backend, info in row["backends"].items():
            if "unavailable" in info:
                lines.append(f"- {row['name']}, {backend}: {info['unavailable']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.variants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spellings", choices=("bench", "all"), default="bench",
                        help="bench: BENCH_SPELLINGS (make bench's); all: the baseline and every spelling of every part alone")
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated (default 1,2)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-s", type=float, default=0.15)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    ns = parser.parse_args(argv)
    threads = [int(t) for t in ns.threads.split(",") if t.strip()]
    section = measure_all(lambda m: print(f"variants: {m}", file=sys.stderr, flush=True), threads, ns.rounds,
                          ns.round_s, ns.warmup, ns.spellings)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(section, f, indent=1)
    print("\n".join(markdown_lines(section)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
