"""`python -m sweeps.fusion_coverage` (`make fusion-coverage`): what fused mode catches on decoders spelled the ways
real model code spells them, and whether it stays correct there.

    python -m sweeps.fusion_coverage                        # every generated variant, then the transformers decoders
    python -m sweeps.fusion_coverage --variants 12 --no-hf  # a subset (what make test runs: tests/python/test_fusion_coverage.py)
    python -m sweeps.fusion_coverage --markdown OUT.md --json OUT.json

Part one builds sweeps/coverage_decoder.py's decoder once per spelling (the baseline, each spelling of each part
alone, then seeded combinations) and decodes 16 tokens greedily in eager and through graphex with
`pattern_fusion_pass=True`. Part two generates 16 tokens with transformers decoders built from configs (random
weights, small sizes) through generate() with graphex.integrations.transformers.compile_config(fused options),
against eager generate(). Per row: the fused kernels that fired (the compiled graphs' `fused` counts), whether the
tokens equal eager's over all steps, and the largest logit difference over the steps before the first differing
token (bf16 rows: in bf16).

A row is a FAILURE when graphex changed the tokens while no fused kernel fired (exact mode must be bitwise), when
the compile fails, or when a fused row's tokens differ or its logits differ by more than fused mode's model
tolerance of their dtype (MODEL_TOL: tol + tol * |eager| per logit, docs/fused-mode.md). The exit status is 1 when any row failed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time
import traceback
import warnings
from typing import Any, Callable

import torch

from bench.models import HF_FAMILIES as HF_MODELS  # the nine families, defined once

from . import coverage_decoder as cd

STEPS = 16


@dataclasses.dataclass
class Row:
    name: str
    dtype: str
    fired: dict[str, int]
    tokens_equal: bool
    max_diff: float
    steps: int
    error: str = ""
    within_tolerance: bool = True  # every compared logit within fused mode's model tolerance of eager's
    not_graphex: str = ""  # the row fails the same way without graphex (Dynamo alone): why, and it is not counted

    @property
    def ok(self) -> bool:
        if self.not_graphex:
            return True
        if self.error:
            return False
        if not self.fired:
            return self.tokens_equal and self.max_diff == 0.0
        return self.tokens_equal and self.within_tolerance

    def fired_text(self) -> str:
        return ", ".join(f"{k} x{v}" for k, v in sorted(self.fired.items())) or "none"


def _capturing() -> tuple[list[Any], Any]:
    from graphex.compile import on_capture

    captured: list[Any] = []
    return captured, on_capture(lambda dynamo_graph, compiled: captured.append(compiled))


def _fired(captured: list[Any]) -> dict[str, int]:
    total: collections.Counter[str] = collections.Counter()
    for c in captured:
        total.update(c.fused)
    return dict(total)


# Fused mode's model tolerance per logit, |fused - eager| <= tol + tol * |eager|, per dtype (docs/fused-mode.md)
MODEL_TOL = {torch.float32: 1e-4, torch.bfloat16: 6.25e-2, torch.float16: 7.8125e-3}


def _compare(want: list[torch.Tensor], got: list[torch.Tensor], dtype: torch.dtype) -> tuple[bool, float, int, bool]:
    """(tokens equal at every step, max |logit difference| up to the first differing token, steps compared, every
    compared logit within the model tolerance of the model's dtype, MODEL_TOL; transformers returns float32 logits
    from a bfloat16 model)."""
    max_diff, close = 0.0, True
    tol = MODEL_TOL.get(dtype, 0.0)
    for i, (w, g) in enumerate(zip(want, got)):
        w, g = w.float(), g.float()
        max_diff = max(max_diff, (w - g).abs().max().item())
        close = close and bool(((w - g).abs() <= tol + tol * w.abs()).all())
        if not torch.equal(w.argmax(-1), g.argmax(-1)):
            return False, max_diff, i + 1, close
    return len(want) == len(got), max_diff, len(want), close


def run_variant(spelling: cd.Spelling, steps: int = STEPS) -> Row:
    torch._dynamo.reset()
    model = cd.build(spelling)
    captured, hook = _capturing()
    try:
        with torch.no_grad():
            want = [l.clone() for l in cd.decode(model, model, steps)]
            compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False,
                                     options={"pattern_fusion_pass": True})
            with hook, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = [l.clone() for l in cd.decode(model, compiled, steps)]
    except Exception as e:  # a fused compile must never fail where the code runs in eager
        return Row(spelling.name, spelling.dtype, {}, False, float("nan"), 0,
                   f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    equal, diff, n, close = _compare(want, got, getattr(torch, spelling.dtype))
    return Row(spelling.name, spelling.dtype, _fired(captured), equal, diff, n, within_tolerance=close)


def _hf_model(arch: str, dtype: torch.dtype) -> Any:
    from bench.models import hf_family

    return hf_family(arch, "coverage", dtype)


def run_hf(arch: str, dtype: torch.dtype, steps: int = STEPS) -> Row:
    import transformers as tf

    from graphex.integrations.transformers import compile_config, compile_on_every_device

    tf.logging.set_verbosity_error()
    torch._dynamo.reset()
    name = f"transformers {arch}"
    ids = torch.tensor([[5, 9, 2, 7, 1, 3]])

    def generate(model: Any, config: Any) -> list[torch.Tensor]:
        out = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0,
                             cache_implementation="static", compile_config=config, output_logits=True,
                             return_dict_in_generate=True)
        return [l.clone() for l in out.logits]

    captured, hook = _capturing()
    try:
        with torch.no_grad():
            want = generate(_hf_model(arch, dtype), None)
            with hook, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = generate(_hf_model(arch, dtype), compile_config({"pattern_fusion_pass": True}))
    except Exception as e:
        row = Row(name, str(dtype).replace("torch.", ""), {}, False, float("nan"), 0,
                  f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        # The same generate() with Dynamo alone (backend="eager": no graphex): if it fails too, the failure is
        # Dynamo's or transformers' (a sliding-window cache's Python int guarded and recompiled every step), not
        # graphex's; the row says so and is not counted as graphex's failure.
        torch._dynamo.reset()
        plain = compile_on_every_device(tf.CompileConfig(backend="eager", fullgraph=True, dynamic=False))
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                generate(_hf_model(arch, dtype), plain)
        except Exception as plain_error:
            row.not_graphex = f"fails without graphex too (Dynamo alone: {type(plain_error).__name__})"
        return row
    if not captured:
        return Row(name, str(dtype).replace("torch.", ""), {}, False, float("nan"), 0,
                   "generate() did not compile with graphex")
    equal, diff, n, close = _compare(want, got, dtype)
    return Row(name, str(dtype).replace("torch.", ""), _fired(captured), equal, diff, n, within_tolerance=close)


def markdown(rows: list[Row], header: str) -> str:
    lines = [header, "", "| variant | dtype | fused kernels that fired | tokens = eager (16 steps) | max logit diff | |",
             "|---|---|---|---|---:|---|"]
    for r in rows:
        verdict = (f"n/a: {r.not_graphex}: {r.error[:120]}" if r.not_graphex
                   else "ok" if r.ok else f"**FAIL** {r.error[:200]}".strip())
        lines.append(f"| {r.name} | {r.dtype} | {r.fired_text()} | {'yes' if r.tokens_equal else f'no (step {r.steps})'} "
                     f"| {r.max_diff:.1e} | {verdict} |")
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    fired = sum(1 for r in rows if r.fired)
    failed = [r for r in rows if not r.ok]
    na = sum(1 for r in rows if r.not_graphex)
    return (f"{len(rows)} rows: {fired} with a fused kernel, {len(rows) - fired - na} exact"
            + (f", {na} not run (they fail without graphex too)" if na else "")
            + f"; {len(rows) - len(failed) - na} ok, {len(failed)} failed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", type=int, default=40, help="how many generated spellings (default 40)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the combinations")
    p.add_argument("--only", help="comma-separated variant names (as printed) to run alone")
    p.add_argument("--no-hf", action="store_true", help="leave out the transformers decoders")
    p.add_argument("--hf", default=",".join(HF_MODELS), help=f"transformers decoders (default: {','.join(HF_MODELS)})")
    p.add_argument("--markdown", help="also write the tables to this file")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    spellings = cd.variants(args.variants, args.seed)
    if args.only:
        wanted = set(args.only.split(","))
        spellings = [s for s in spellings if s.name in wanted]
    rows: list[Row] = []
    t0 = time.perf_counter()
    for i, s in enumerate(spellings, 1):
        rows.append(run_variant(s))
        print(f"[{i}/{len(spellings)}] {s.name}: {rows[-1].fired_text()}"
              f"{'' if rows[-1].ok else '  FAIL ' + rows[-1].error}", file=sys.stderr, flush=True)
    hf_rows: list[Row] = []
    if not args.no_hf:
        for arch in args.hf.split(","):
            for dtype in (torch.float32, torch.bfloat16):
                hf_rows.append(run_hf(arch, dtype))
                print(f"[hf] {arch} {dtype}: {hf_rows[-1].fired_text()}"
                      f"{'' if hf_rows[-1].ok else '  FAIL ' + hf_rows[-1].error}", file=sys.stderr, flush=True)
    text = markdown(rows, f"Generated decoders ({summary(rows)}):")
    if hf_rows:
        text += "\n\n" + markdown(hf_rows, f"transformers decoders from configs ({summary(hf_rows)}):")
    print(text)
    print(f"\n{summary(rows + hf_rows)} in {time.perf_counter() - t0:.0f} s")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) | {"ok": r.ok} for r in rows + hf_rows], f, indent=1)
    return 0 if all(r.ok for r in rows + hf_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
