"""Host cost of a device-graph call on the simulated accelerator gxsim (issue 20 point 8), on the shipped decoder.

    python -m bench.device_graph_cost [--rounds N]

gxsim runs its kernels on the host, so these figures say nothing about GPU speed; they measure what graphex
adds around a replay. Prints medians over N rounds of 300 calls: the compiled step on the CPU (the engine);
the compiled step on gxsim (graphex's runner: signature, address checks, input copies, the replay, outputs
copied out); graphex's runner alone and the device graph's replay() alone, so the runner's own cost per call is
their difference; and the same split on the CPU (what torch.compile adds around the engine). One thread.
"""
import argparse
import statistics

import torch

from examples.models.decoder import DecoderConfig, build_decoder
from graphex.testing import sim

from .cache_call_cost import per_call_us


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    dev = sim.enable()
    cfg = DecoderConfig(layers=2)
    cpu_model, dev_model = build_decoder(cfg), build_decoder(cfg).to(dev)
    opts = dict(backend="graphex", fullgraph=True, dynamic=False)
    cpu_step, dev_step = torch.compile(cpu_model, **opts), torch.compile(dev_model, **opts)
    k, v = cpu_model.new_cache()
    kd, vd = k.to(dev), v.to(dev)
    tok, pos = torch.ones(1, 1, dtype=torch.long), torch.tensor([3])
    tokd, posd = tok.to(dev), pos.to(dev)
    from graphex.runtime import live_graphs

    with torch.inference_mode():
        for _ in range(3):
            cpu_step(tok, pos, k, v)
            dev_step(tokd, posd, kd, vd)
        graphs = live_graphs()
        dev_graph = next(g for g in graphs if g.device_graphs is not None)
        cpu_graph = next(g for g in graphs if g.device_graphs is None and g.executor is not None)
        seen = []
        stop = dev_graph.watch(lambda a, o: seen.append(list(a)))
        dev_step(tokd, posd, kd, vd)
        stop()
        stop = cpu_graph.watch(lambda a, o: seen.append(list(a)))
        cpu_step(tok, pos, k, v)
        stop()
        dev_args, cpu_args = seen
        runner = dev_graph.device_graphs
        (entry,) = [e for e in runner.graphs.values() if hasattr(e, "graph")]
        rows = {"CPU: compiled step": lambda: cpu_step(tok, pos, k, v),
                "CPU: engine alone": lambda: cpu_graph.executor(cpu_args),
                "gxsim: compiled step": lambda: dev_step(tokd, posd, kd, vd),
                "gxsim: graphex's runner": lambda: runner(dev_args),
                "gxsim: replay() alone": entry.graph.replay}
        results = {name: [] for name in rows}
        for _ in range(args.rounds):
            for name, fn in rows.items():
                results[name].append(per_call_us(fn, calls=300))
    medians = {name: statistics.median(r) for name, r in results.items()}
    print(f"shipped decoder ({cfg.layers} layers, custom ops), 1 thread, median of {args.rounds} rounds x 300 calls")
    for name, us in medians.items():
        print(f"  {name:28s} {us:9.1f} us")
    runner_cost = medians["gxsim: graphex's runner"] - medians["gxsim: replay() alone"]
    print(f"  {'runner around the replay':28s} {runner_cost:9.1f} us  (key, address checks, input copies, outputs "
          "copied out)")
    print(f"  {'torch.compile around the CPU engine':28s} "
          f"{medians['CPU: compiled step'] - medians['CPU: engine alone']:9.1f} us  (Dynamo's guards, AOTAutograd)")


if __name__ == "__main__":
    main()
