"""`make bench`'s 2-rank tensor-parallel decode step: eager vs graphex, on gloo over 127.0.0.1.

The parent (`measure`) starts 2 ranks of this file with torchrun (bounded in time). Each rank
builds the TP decoder (examples/models/tp_decoder.py) and times one decode step at a fixed
position, eager and graphex taking turns in rounds of a fixed number of calls: every rank
makes the same calls in the same order, so each collective meets its peer. Rank 0 prints JSON:
per backend median / p10 / p90 of its step times, whether graphex's logits equal eager's
bitwise and whether every graphex call ran on the engine.

    python -m bench.tp_decode            # the measurement, as bench/run.py runs it
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POSITION = 7
WORLD = 2


def rank_job(rounds: int, calls: int, warmup: int) -> dict[str, Any] | None:
    sys.path.insert(0, ROOT)
    import datetime

    import torch
    import torch.distributed as dist

    import graphex
    from examples.models.decoder import build_decoder
    from examples.models.tp_decoder import TPDecoder

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    tp = TPDecoder(build_decoder())
    tokens, pos = torch.ones((1, 1), dtype=torch.long), torch.tensor([POSITION])
    fns = {"eager": tp, "graphex": torch.compile(tp, backend="graphex", fullgraph=True, dynamic=False)}
    caches = {name: tp.new_cache() for name in fns}
    info: dict[str, Any] = {}
    with torch.no_grad():
        start = time.perf_counter()
        first = {name: fn(tokens, pos, *caches[name]) for name, fn in fns.items()}
        info["first_call_s"] = time.perf_counter() - start
        info["equal"] = bool(torch.equal(first["graphex"], first["eager"])
                             and torch.equal(caches["graphex"][0], caches["eager"][0]))
        runs_before = graphex._C.total_run_count()
        for fn_name, fn in fns.items():
            for _ in range(warmup):
                fn(tokens, pos, *caches[fn_name])
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                for _ in range(calls):
                    t0 = time.perf_counter()
                    fn(tokens, pos, *caches[name])
                    samples[name].append((time.perf_counter() - t0) * 1e6)
        info["engine_ran"] = graphex._C.total_run_count() - runs_before == warmup + rounds * calls
    dist.barrier()
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank != 0:
        return None
    for name, values in samples.items():
        values.sort()
        info[name] = {"median_us": statistics.median(values), "p10_us": values[len(values) // 10],
                      "p90_us": values[(len(values) * 9) // 10], "samples": len(values)}
    return info


def measure(log=lambda m: None, *, rounds: int = 12, round_s: float = 0.25, warmup: int = 20,
            timeout: float = 600) -> dict[str, Any]:
    """Start the 2 ranks, wait at most `timeout` seconds (then kill them), return rank 0's figures."""
    calls = max(3, int(round_s / 0.02))  # a TP step takes ~20 ms here: about round_s per turn
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}", "--master-addr=127.0.0.1",
           f"--master-port={port}", os.path.abspath(__file__), "--rank-job", str(rounds), str(calls), str(warmup)]
    log(f"tp_decode: {WORLD} ranks, eager vs graphex, {rounds} rounds of {calls} calls each")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH")))))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise RuntimeError(f"the {WORLD}-rank TP decode run did not finish in {timeout:.0f} s (killed)") from None
    lines = [line for line in out.splitlines() if line.startswith("TP_BENCH ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the {WORLD}-rank TP decode run failed (exit {proc.returncode}):\n{err[-3000:]}")
    result = json.loads(lines[-1][len("TP_BENCH "):])
    result["calls_per_round"], result["rounds"], result["world"] = calls, rounds, WORLD
    return result


def markdown_lines(tp: dict[str, Any] | None) -> list[str]:
    """The report's table for results["tp_decode"] (bench/report.py)."""
    if tp is None:
        return []
    if "error" in tp:
        return ["", f"tp_decode_step ({WORLD} ranks): not measured ({' '.join(tp['error'].split())[:300]})"]
    eager = tp["eager"]["median_us"]
    lines = ["", f"| tp_decode_step, {tp['world']} ranks (gloo, 127.0.0.1), rank 0 | median step | p10 - p90 "
             "| vs eager | == eager | on the engine |", "|---|---:|---:|---:|:---:|:---:|"]
    for name in ("eager", "graphex"):
        r = tp[name]
        same = "-" if name == "eager" else ("yes" if tp["equal"] else "NO")
        engine = "-" if name == "eager" else ("yes" if tp["engine_ran"] else "NO")
        lines.append(f"| {name} | {r['median_us']:,.0f} us | {r['p10_us']:,.0f} - {r['p90_us']:,.0f} us "
                     f"| {r['median_us'] / eager:.2f}x | {same} | {engine} |")
    lines += ["", f"- tp_decode_step: examples/models/tp_decoder.py (the decoder_step model split over {tp['world']} "
              "processes: column/row-parallel attention and MLP with all_reduce, KV cache sharded by heads, "
              f"vocab-parallel head with all_gather), one step at position {POSITION}, {tp['rounds']} interleaved "
              f"rounds of {tp['calls_per_round']} calls per backend, 1 torch thread per rank."]
    return lines


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank-job"]:
        figures = rank_job(*(int(a) for a in sys.argv[2:5]))
        if figures is not None:
            print("TP_BENCH " + json.dumps(figures), flush=True)
    else:
        print(json.dumps(measure(lambda m: print(m, file=sys.stderr)), indent=1))
