"""cache_compile's warm start: time to first output in a fresh process, cold cache vs warm cache.

The parent (`measure`) runs this module as a child twice with the same empty cache
directory: the first child compiles and writes the entry (cold), the second loads it
(warm). Each child builds the benchmark decoder behind `cache_compile` and reports,
as JSON, the time of its first call (imports and model construction excluded) and
whether Dynamo ran.

    python -m bench.warm_start CACHE_DIR      # one child run
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(cache_dir: str) -> dict[str, Any]:
    sys.path.insert(0, ROOT)
    started = time.perf_counter()
    import torch

    import graphex
    from examples.models.decoder import build_decoder

    model = build_decoder()
    step = graphex.inference.cache_compile(model.forward, dynamic=False, cache_dir=cache_dir)
    k_cache, v_cache = model.new_cache()
    args = (torch.ones((1, 1), dtype=torch.long), torch.tensor([0]), k_cache, v_cache)
    ready = time.perf_counter()
    with torch.no_grad():
        out = step(*args)
    first = time.perf_counter() - ready
    ref_k, ref_v = model.new_cache()
    with torch.no_grad():
        expected = model(args[0], args[1], ref_k, ref_v)
    dynamo = sys.modules.get("torch._dynamo")  # a hit never imports it (Note [A cache hit imports no compiler])
    return {"first_call_s": first, "process_s": time.perf_counter() - started, "dynamo_imported": dynamo is not None,
            "dynamo_compiles": dynamo.utils.counters["stats"]["unique_graphs"] if dynamo is not None else 0,
            "stats": step.stats, "equal": bool(torch.equal(out, expected) and torch.equal(k_cache, ref_k))}


def measure(log=lambda m: None) -> dict[str, Any]:
    """Cold then warm child on one fresh cache directory."""
    with tempfile.TemporaryDirectory(prefix="graphex-warm-") as cache_dir:
        runs = {}
        for name in ("cold", "warm"):
            log(f"cache_compile warm start: {name} process")
            proc = subprocess.run([sys.executable, "-m", "bench.warm_start", cache_dir], cwd=ROOT,
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"{name} child failed:\n{proc.stderr[-3000:]}")
            runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    runs["ratio"] = runs["warm"]["first_call_s"] / runs["cold"]["first_call_s"]
    return runs


if __name__ == "__main__":
    print(json.dumps(child(sys.argv[1])))
