"""transformers' generate(), the way its users call it: eager against graphex and inductor through CompileConfig.

    python -m bench.generate [--arch llama,gpt2] [--new-tokens 32] [--runs 5] [--threads 1] [--backends ...] [--json P]
                             [--dtype float32|bfloat16|float16]

Each model is the benchmark's transformers decoder (bench/models.py: random weights, hidden 512, 4 layers) and
generates greedily from an 8-token prompt over a static cache (`cache_implementation="static"`), with
graphex's `compile_config()` (graphex/integrations/transformers.py) or, for inductor, `CompileConfig(backend="inductor",
fullgraph=True, dynamic=False)` with the `_compile_all_devices` flag it sets too (transformers compiles generate()'s
forward on the CPU only with it: docs/transformers.md). transformers' prefill runs eagerly; the decode steps compiled. Per backend: the first generate()
(compiles: inductor cold, its caches off), then the median of `--runs` more, in interleaved rounds; the tokens are compared with eager's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

BACKENDS = ("eager", "graphex", "graphex_fused", "inductor")


def _compile_config(backend: str) -> Any:
    from transformers import CompileConfig

    from graphex.integrations.transformers import compile_config, compile_on_every_device

    if backend == "eager":
        return None
    if backend == "graphex":
        return compile_config()
    if backend == "graphex_fused":
        return compile_config({"pattern_fusion_pass": True})
    return compile_on_every_device(CompileConfig(backend=backend, fullgraph=True, dynamic=False, mode="default"))


def measure(arch: str, backends: list[str], new_tokens: int, runs: int,
            dtype: torch.dtype = torch.float32) -> list[dict[str, Any]]:
    from transformers import GenerationConfig

    from . import models

    # One model per backend (the same seed, so the same weights): transformers keeps one compiled call per model and
    # compiles it again whenever the CompileConfig changes, so backends sharing a model would recompile every round.
    built = {b: models.build_hf_decoder(arch).model.to(dtype) for b in backends}
    vocab = built[backends[0]].config.vocab_size
    prompt = (torch.arange(8, dtype=torch.long) * 7 + 3).remainder(vocab).view(1, 8)

    def gen_config(backend: str) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                cache_implementation="static", compile_config=_compile_config(backend),
                                pad_token_id=0)

    configs = {b: gen_config(b) for b in backends}
    rows: dict[str, dict[str, Any]] = {}
    with torch.no_grad():
        for b in backends:  # first call: compiles
            t0 = time.perf_counter()
            out = built[b].generate(prompt, generation_config=configs[b])
            rows[b] = {"arch": arch, "dtype": str(dtype)[6:], "backend": b, "first_s": time.perf_counter() - t0,
                       "times": [], "tokens": out}
        for _ in range(runs):  # interleaved rounds
            for b in backends:
                t0 = time.perf_counter()
                out = built[b].generate(prompt, generation_config=configs[b])
                rows[b]["times"].append(time.perf_counter() - t0)
                rows[b]["same_tokens"] = rows[b].get("same_tokens", True) and torch.equal(out, rows[b]["tokens"])
    eager = rows.get("eager")
    result = []
    for b in backends:
        r = rows[b]
        median = statistics.median(r["times"])
        result.append({"arch": arch, "dtype": str(dtype)[6:], "backend": b, "first_s": round(r["first_s"], 3),
                       "median_ms": round(median * 1e3, 2), "ms_per_token": round(median * 1e3 / new_tokens, 3),
                       "vs_eager": round(median / statistics.median(eager["times"]), 3) if eager else None,
                       "tokens_equal_eager": bool(torch.equal(r["tokens"], eager["tokens"])) if eager else None})
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="llama,gpt2", help="comma-separated: llama, gpt2")
    p.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="the models' dtype")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from torch._inductor import config as inductor_config

    inductor_config.force_disable_caches = True  # inductor's first call compiles cold, as graphex's does
    import transformers

    transformers.logging.set_verbosity_error()
    rows = []
    for arch in args.arch.split(","):
        rows += measure(arch, args.backends.split(","), args.new_tokens, args.runs, getattr(torch, args.dtype))
    print(f"generate(): {args.new_tokens} new tokens from an 8-token prompt, static cache, {args.dtype}, {args.threads} thread(s), "
          f"median of {args.runs}")
    print("| model | backend | first call (compiles) | median | per token | / eager | tokens = eager |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['arch']} | {r['backend']} | {r['first_s']:.2f} s | {r['median_ms']:.1f} ms | "
              f"{r['ms_per_token']:.2f} ms | {r['vs_eager']:.2f}x | {'yes' if r['tokens_equal_eager'] else 'NO'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["tokens_equal_eager"] in (True, None) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
