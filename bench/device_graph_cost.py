"""Host cost of a device-graph call on the simulated accelerator gxsim (issue 20 point 8), on the shipped decoder.

    python -m bench.device_graph_cost [--rounds N] [--calls N]

A section of `make bench` (bench/run.py; --no-device-graph-cost skips it). gxsim runs its kernels on the host, so
these figures say nothing about GPU speed; they measure what graphex adds around a replay, and compare it with the
CPU engine's per-call cost for the same program. Medians over N interleaved rounds, one thread:
- the compiled step on the CPU and the CPU engine alone (torch.compile's cost around the engine is their gap);
- the compiled step on gxsim, graphex's runner alone, and the device graph's replay() alone; the runner's own cost
  per call is its whole call with replay() stubbed (runner - replay is a difference of two timings of several
  hundred us, and lands within their noise);
- that cost split into its parts, each timed alone on the same arguments: the lock, the signature and its lookup,
  the address checks, the input copies, the outputs copied out of the pool; plus what one gxsim launch costs
  (an elementwise op of the same size as a copied input), since every copy is one launch through gxsim's boxed
  fallback, where a CUDA device-to-device copy launch is a few microseconds.
"""
from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable

import torch

from .cache_call_cost import per_call_us

PARTS = ("lock", "signature and lookup", "address checks", "input copies", "outputs copied out")


def measure(log: Callable[[str], None] = print, rounds: int = 7, calls: int = 300) -> dict[str, Any]:
    """The section's results: medians in us per row, the parts of the runner, and the counts behind them."""
    from examples.models.decoder import DecoderConfig, build_decoder
    from graphex.runtime import live_graphs
    from graphex.testing import sim

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dev = sim.enable()
        cfg = DecoderConfig(layers=2)
        torch.manual_seed(0)
        cpu_model = build_decoder(cfg)
        dev_model = build_decoder(cfg)
        dev_model.load_state_dict(cpu_model.state_dict())
        dev_model.to(dev)
        opts = dict(backend="graphex", fullgraph=True, dynamic=False)
        cpu_step, dev_step = torch.compile(cpu_model, **opts), torch.compile(dev_model, **opts)
        k, v = cpu_model.new_cache()
        kd, vd = k.to(dev), v.to(dev)
        tok, pos = torch.ones(1, 1, dtype=torch.long), torch.tensor([3])
        tokd, posd = tok.to(dev), pos.to(dev)
        before = {id(g) for g in live_graphs()}
        with torch.inference_mode():
            for _ in range(3):
                want = cpu_step(tok, pos, k, v)
                got = dev_step(tokd, posd, kd, vd)
            equal = torch.equal(want.cpu() if isinstance(want, torch.Tensor) else want[0].cpu(),
                                got.cpu() if isinstance(got, torch.Tensor) else got[0].cpu())
            graphs = [g for g in live_graphs() if id(g) not in before]  # this section's two compiled graphs
            (dev_graph,) = [g for g in graphs if g.device_graphs is not None]
            (cpu_graph,) = [g for g in graphs if g.device_graphs is None]
            seen: list[list[Any]] = []
            stop = dev_graph.watch(lambda a, o: seen.append(list(a)))
            dev_step(tokd, posd, kd, vd)
            stop()
            stop = cpu_graph.watch(lambda a, o: seen.append(list(a)))
            cpu_step(tok, pos, k, v)
            stop()
            dev_args, cpu_args = seen
            runner = dev_graph.device_graphs
            (entry,) = [e for e in runner.graphs.values() if hasattr(e, "graph")]
            copied = [dev_args[i] for i in entry.copied]
            one_launch_input = max(copied, key=lambda t: t.numel()) if copied else torch.ones(1, device=dev)

            class _NoReplay:
                def replay(self) -> None:
                    pass

            no_replay, real_graph = _NoReplay(), entry.graph

            def runner_replay_stubbed() -> None:  # the runner's whole call, with replay() doing nothing
                entry.graph = no_replay
                try:
                    runner(dev_args)
                finally:
                    entry.graph = real_graph

            def lock() -> None:
                with runner._call_lock:
                    pass

            rows: dict[str, Callable[[], Any]] = {
                "CPU: compiled step": lambda: cpu_step(tok, pos, k, v),
                "CPU: engine alone": lambda: cpu_graph.executor(cpu_args),
                "gxsim: compiled step": lambda: dev_step(tokd, posd, kd, vd),
                "gxsim: graphex's runner": lambda: runner(dev_args),
                "gxsim: replay() alone": entry.graph.replay,
                "gxsim: runner, replay() stubbed": runner_replay_stubbed,
                "lock": lock,
                "signature and lookup": lambda: runner.graphs.get(runner._key(dev_args)),
                "address checks": lambda: runner._moved(entry, dev_args),
                "input copies": lambda: [entry.inputs[i].copy_(dev_args[i]) for i in entry.copied],
                "outputs copied out": lambda: [entry.outputs[i].clone() for i in entry.copy_out],
                "one gxsim launch": lambda: one_launch_input.neg(),
            }
            results: dict[str, list[float]] = {name: [] for name in rows}
            for r in range(rounds):
                for name, fn in rows.items():
                    results[name].append(per_call_us(fn, calls=calls))
                log(f"  device graph cost: round {r + 1}/{rounds}")
    finally:
        torch.set_num_threads(threads)
    med = {name: statistics.median(r) for name, r in results.items()}
    return {"workload": f"shipped decoder ({cfg.layers} layers, custom ops)", "threads": 1, "rounds": rounds,
            "calls": calls, "median_us": med,
            "runner_around_replay_us": med["gxsim: runner, replay() stubbed"],
            "runner_minus_replay_us": med["gxsim: graphex's runner"] - med["gxsim: replay() alone"],
            "compile_around_cpu_engine_us": med["CPU: compiled step"] - med["CPU: engine alone"],
            "parts_sum_us": sum(med[p] for p in PARTS),
            "addresses_checked": len(entry.addresses), "inputs_copied": len(entry.copied),
            "outputs_copied": len(entry.copy_out), "equal_cpu_eager": bool(equal)}


def markdown_lines(section: dict[str, Any] | None) -> list[str]:
    """The bench report's section (bench/report.py)."""
    if not section:
        return []
    if "error" in section:
        return ["", f"Device graphs on gxsim: not measured ({section['error']})"]
    m = section["median_us"]
    lines = ["", f"Device graphs, host cost on the simulated device gxsim ({section['workload']}, 1 thread, medians "
             f"of {section['rounds']} rounds x {section['calls']} calls; bench/device_graph_cost.py; says nothing "
             "about GPU speed):", "", "| row | us |", "|---|---:|"]
    for name in ("CPU: compiled step", "CPU: engine alone", "gxsim: compiled step", "gxsim: graphex's runner",
                 "gxsim: replay() alone"):
        lines.append(f"| {name} | {m[name]:.1f} |")
    lines.append(f"| **runner around the replay** (its whole call with replay() stubbed) | "
                 f"{section['runner_around_replay_us']:.1f} |")
    for name in PARTS:
        what = {"address checks": f"{section['addresses_checked']} pointer compares",
                "input copies": f"{section['inputs_copied']} copies",
                "outputs copied out": f"{section['outputs_copied']} copies"}.get(name)
        lines.append(f"| &nbsp;&nbsp;{name}{f' ({what})' if what else ''} | {m[name]:.1f} |")
    lines.append(f"| &nbsp;&nbsp;the parts' sum | {section['parts_sum_us']:.1f} |")
    lines.append(f"| one gxsim launch (each copy is one; a CUDA copy launch is a few us) | {m['one gxsim launch']:.1f} |")
    lines.append(f"| torch.compile around the CPU engine | {section['compile_around_cpu_engine_us']:.1f} |")
    lines.append(f"- runner - replay(), two timings of several hundred us each: "
                 f"{section['runner_minus_replay_us']:.1f} us (within their noise; the stubbed row is the measurement)")
    lines.append(f"- gxsim's output equals the CPU's: {'bitwise' if section['equal_cpu_eager'] else 'NO'}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    print("\n".join(markdown_lines(measure(rounds=args.rounds, calls=args.calls))))


if __name__ == "__main__":
    main()
