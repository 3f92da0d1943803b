"""ATen calls per step: how many ops graphex's engine runs per call, exact mode against fused mode (its patterns
alone, then with element-wise chains: Note [Element-wise chains are fused by rule, not by pattern]).

    python -m bench.op_counts [--dtype float32|bfloat16]

Models: the shipped decoder's one-token step; transformers' GPT-2, Falcon, Bloom and Llama from small configs
(sweeps/fusion_coverage.py's, random weights), one greedy decode step over a static cache as generate() compiles
it; the bench's conv net (a small ResNet) on one 64 x 64 image. The count is the lowered program's ops
(CompiledGraph.num_ops: every ATen or fused call the engine makes; views included).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any, Callable

import torch

CONFIGS = {"exact": {}, "fused, patterns only": {"pattern_fusion_pass": True, "pointwise_fusion": False},
           "fused": {"pattern_fusion_pass": True}}


def _counted(run: Callable[[dict[str, Any]], None], options: dict[str, Any]) -> int:
    from graphex.compile import on_capture

    captured: list[Any] = []
    torch._dynamo.reset()
    with on_capture(lambda dynamo_graph, compiled: captured.append(compiled)), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(options)
    return captured[-1].num_ops if captured else -1  # the last graph: the decode step (transformers' prefill is eager)


def _decoder(dtype: torch.dtype) -> Callable[[dict[str, Any]], None]:
    from examples.models.decoder import build_decoder

    model = build_decoder().to(dtype)
    k, v = model.new_cache(dtype=dtype)

    def run(options: dict[str, Any]) -> None:
        with torch.no_grad():
            torch.compile(model, backend="graphex", fullgraph=True, dynamic=False, options=options)(
                torch.tensor([[3]]), torch.tensor([5]), k, v)

    return run


def _transformers(arch: str, dtype: torch.dtype) -> Callable[[dict[str, Any]], None]:
    from graphex.integrations.transformers import compile_config
    from sweeps.fusion_coverage import _hf_model

    def run(options: dict[str, Any]) -> None:
        model = _hf_model(arch, dtype)
        with torch.no_grad():
            model.generate(torch.tensor([[5, 9, 2, 7]]), max_new_tokens=2, min_new_tokens=2, do_sample=False,
                           pad_token_id=0, cache_implementation="static", compile_config=compile_config(options))

    return run


def _convnet(dtype: torch.dtype) -> Callable[[dict[str, Any]], None]:
    from bench.models import build_convnet

    net = build_convnet().to(dtype)
    x = torch.randn(1, 3, 64, 64).to(dtype)

    def run(options: dict[str, Any]) -> None:
        with torch.no_grad():
            torch.compile(net, backend="graphex", fullgraph=True, dynamic=False, options=options)(x)

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    import graphex  # noqa: F401

    dtype = getattr(torch, args.dtype)
    models: dict[str, Callable[[dict[str, Any]], None]] = {"shipped decoder": _decoder(dtype)}
    for arch in ("gpt2", "falcon", "bloom", "llama"):
        models[f"transformers {arch}"] = _transformers(arch, dtype)
    models["conv net (ResNet)"] = _convnet(dtype)
    print(f"ATen calls per step ({args.dtype}): the ops graphex's engine runs per call")
    print(f"| model | {' | '.join(CONFIGS)} | fused / exact |")
    print("|---|" + "---:|" * (len(CONFIGS) + 1))
    for name, run in models.items():
        counts = {c: _counted(run, o) for c, o in CONFIGS.items()}
        print(f"| {name} | {' | '.join(str(n) for n in counts.values())} | {counts['fused'] / counts['exact']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
