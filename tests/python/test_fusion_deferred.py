"""Note [A built-in pattern is registered once a graph can hold it] (graphex/fusion/manager.py): run_fusion registers a
built-in only once a graph holds every op of its search graph. Deferring must lose nothing and change no order: every
built-in replacement inserts only ops the deferral counts as available, and processes that fuse the same models in
other orders, or register every built-in first, fire the same kernels, give the same bits and end with the same
patterns in the same order at every anchor."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._inductor import pattern_matcher

import graphex.compat
from graphex.fusion import manager
from graphex.fusion.registration import no_decompositions
from graphex.fusion import serialized
from graphex.fusion.serialized import writer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _builtin_registrations(monkeypatch) -> list[dict]:
    """Every built-in registration (into a registry of its own): its search graph's ops and its replacement's trace on
    the example inputs, as torch's register_replacement makes its first trace."""
    seen: list[dict] = []
    real = graphex.compat.register_replacement

    def recording(search_fn, replace_fn, example_inputs, trace_fn, pass_dict, extra_check, **kw):
        record = {"name": kw["pattern_name"], "search_fn": search_fn, "replace_fn": replace_fn,
                  "example_inputs": list(example_inputs), "scalar_workaround": kw["scalar_workaround"] or {}}
        first_trace = kw["first_trace"]

        def first(trace):
            gm = first_trace(trace)
            record["search_ops"] = serialized.call_targets(gm)
            return gm

        seen.append(record)
        return real(search_fn, replace_fn, example_inputs, trace_fn, pass_dict, extra_check,
                    **{**kw, "first_trace": first})

    monkeypatch.setattr(graphex.compat, "register_replacement", recording)
    writer.register_builtins(None)
    return seen


def _trace_replacement(record: dict) -> frozenset:
    names = list(inspect.signature(record["search_fn"]).parameters)
    inputs = iter(record["example_inputs"])
    args = [record["scalar_workaround"][n] if n in record["scalar_workaround"] else next(inputs) for n in names]
    takes_decomp = "get_decomp_fn" in inspect.signature(pattern_matcher.fwd_only).parameters
    gm = (pattern_matcher.fwd_only(record["replace_fn"], args, get_decomp_fn=no_decompositions) if takes_decomp
          else pattern_matcher.fwd_only(record["replace_fn"], args))
    return serialized.call_targets(gm)


def test_every_builtin_replacement_inserts_only_ops_the_deferral_counts_as_available(monkeypatch):
    records = _builtin_registrations(monkeypatch)
    assert len(records) > 150, len(records)  # every group: common, bfloat16, float16
    for record in records:
        inserted = _trace_replacement(record)
        extra = {op for op in inserted - record["search_ops"] - manager.REPLACEMENT_OPS
                 if not (isinstance(op, torch._ops.OpOverload) and op.namespace == "graphex_fused")}
        assert not extra, (f"{record['name']} ({record['replace_fn'].__qualname__}) inserts {sorted(map(str, extra))}: "
                           "add them to manager.REPLACEMENT_OPS")
    search_ops = set().union(*(r["search_ops"] for r in records))
    assert not any(isinstance(op, torch._ops.OpOverload) and op.namespace == "graphex_fused" for op in search_ops), \
        "a built-in that searches for a graphex_fused op would match what another replacement inserted"


def test_a_shipped_graphs_ops_are_read_without_building_it():
    """A waiting built-in's ops come from running its shipped builder against a recorder (serialized._Targets), not
    from building the graph: the same ops as the graph built."""
    graphs = serialized.shipped()
    if not graphs.builders:
        pytest.skip(f"no shipped patterns for torch {torch.__version__}: each built-in is traced (its ops read from "
                    "the trace)")
    for key, build in graphs.builders.items():
        assert serialized._build_targets(build) == serialized.call_targets(serialized.rebuild(build)), key


_SCRIPT = """
import hashlib, json, sys, warnings
import torch
import graphex
from graphex.compile import on_capture
from graphex.fusion import manager
from torch._inductor.pattern_matcher import PatternPrettyPrinter
from sweeps import coverage_decoder as cd

order, first = sys.argv[1].split(","), sys.argv[2].startswith("all-first")
if sys.argv[2].endswith("traced"):  # as under a torch with no shipped graphs (2.12, 2.14, 2.15): each one traced
    from graphex.fusion import serialized
    manager.REGISTRY.graphs = serialized.tracing("test: the traced path")
if first:
    manager.REGISTRY.ensure_builtins()  # every built-in registered before any graph: nothing deferred
spellings = {
    "sdpa": cd.Spelling(),                                   # no softmax: the written-out attention forms wait
    "written": cd.Spelling(attention="written"),             # softmax and bmm: they are registered here
    "layernorm": cd.Spelling(norm="layernorm"),
    "bf16": cd.Spelling(attention="written", dtype="bfloat16"),  # the bfloat16 group, its written forms
    "gemma": cd.Spelling(norm="gemma", gqa="repeat_interleave"),
}
rows = {}
for name in order:
    torch._dynamo.reset()
    model = cd.build(spellings[name])
    captured = []
    with torch.no_grad(), on_capture(lambda g, c: captured.append(c)), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False,
                                 options={"pattern_fusion_pass": True})
        logits = [l.float().clone() for l in cd.decode(model, compiled, 3)]
    fired = {}
    for c in captured:
        for k, v in c.fused.items():
            fired[k] = fired.get(k, 0) + v
    digest = hashlib.sha256(b"".join(l.numpy().tobytes() for l in logits)).hexdigest()
    rows[name] = {"fired": fired, "bits": digest, "deferred_after": len(manager.REGISTRY.deferred)}
manager.REGISTRY.ensure_builtins()
anchors = {str(key): [PatternPrettyPrinter.run(e.pattern) for e in entries]
           for key, entries in sorted(manager.REGISTRY.matcher.patterns.items(), key=lambda kv: str(kv[0]))}
print(json.dumps({"rows": rows, "anchors": anchors, "deferred": len(manager.REGISTRY.deferred)}))
"""


def _run(order: list[str], mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT), ",".join(order), mode],
                          capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fusing_in_any_order_fires_the_same_kernels_bit_for_bit_as_registering_everything_first():
    names = ["sdpa", "written", "layernorm", "bf16", "gemma"]
    everything_first = _run(names, "all-first")
    forward = _run(names, "lazy")
    backward = _run(names[::-1], "lazy")
    assert forward["rows"]["sdpa"]["deferred_after"] > 50, "the SDPA decoder holds few patterns' ops: most wait"
    for run in (forward, backward):
        assert run["deferred"] == 0
        for name in names:
            assert run["rows"][name]["fired"] == everything_first["rows"][name]["fired"], name
            assert run["rows"][name]["bits"] == everything_first["rows"][name]["bits"], name
        assert run["anchors"] == everything_first["anchors"], "each anchor's patterns in one order in every process"
    assert everything_first["rows"]["written"]["fired"].get("decode_attention"), everything_first["rows"]["written"]
    assert everything_first["rows"]["bf16"]["fired"].get("decode_attention"), everything_first["rows"]["bf16"]


def test_traced_built_ins_wait_and_fuse_the_same():
    """Under a torch with no shipped graphs each built-in is traced; one that waits keeps its trace for later."""
    names = ["sdpa", "written", "bf16"]
    everything_first, lazy = _run(names, "all-first traced"), _run(names, "lazy traced")
    assert lazy["rows"]["sdpa"]["deferred_after"] > 50 and lazy["deferred"] == 0
    for name in names:
        assert lazy["rows"][name]["fired"] == everything_first["rows"][name]["fired"], name
        assert lazy["rows"][name]["bits"] == everything_first["rows"][name]["bits"], name
    assert lazy["anchors"] == everything_first["anchors"]
