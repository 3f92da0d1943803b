"""Per-op step of the accuracy bisection: once the replay is the first stage that differs, name the
first op whose output differs from eager.

The compiled function is run twice more at stage replay with data dumps on (graphex/runtime/debug_dump.py):
once with data_dump_stage='original' (the functional graph from before graphex's passes, run by
torch.fx: eager's kernels, called the way eager calls them) and once with 'optimized' (the C++
engine's own values). Walking the engine's ops in run order, the first whose node also exists in
the original graph and whose output is not bitwise equal there is the culprit.

Note [The per-op step compares by node name]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
graphex's passes keep node names (a reinplaced op keeps the name of the functional op it
replaces), so the same name in both dumps is the same value. Nodes only one side has (a removed
no-op, an inserted copy) are skipped; values whose shape or dtype differ are not compared.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import torch

from ...runtime.debug_dump import read_call


@dataclasses.dataclass
class OpDiff:
    graph: str      # the graph's name in the optimized run, e.g. "graph_3"
    node: str       # the FX node's name
    target: str     # "triage_plant::scale"
    output: int     # which returned value
    max_abs: float

    def describe(self) -> str:
        return (f"the first op whose output differs from eager is node '{self.node}' ({self.target}, output "
                f"{self.output}, max abs diff {self.max_abs:.3g})")


def first_differing_op(entry: Any, options: dict[str, Any], run_stage: Any) -> OpDiff | None:
    """`run_stage(entry, stage, options)` is bisect's _run. None if the dumps show no difference."""
    with tempfile.TemporaryDirectory(prefix="graphex-triage-dump-") as tmp:
        dirs = {}
        for stage in ("original", "optimized"):
            dirs[stage] = os.path.join(tmp, stage)
            run_stage(entry, "replay", dict(options, dump_tensor_data=True, data_dump_stage=stage,
                                            data_dump_dir=dirs[stage], data_dump_calls=1))
        originals = _graphs(dirs["original"])
        optimized = _graphs(dirs["optimized"])
        for (_, before), (name, after) in zip(originals, optimized):  # graphs in capture order
            found = _first_diff(name, before, after)
            if found is not None:
                return found
    return None


def _graphs(root: str) -> list[tuple[str, str]]:
    if not os.path.isdir(root):
        return []
    names = sorted(os.listdir(root), key=lambda n: int(n.rsplit("_", 1)[-1]) if n.rsplit("_", 1)[-1].isdigit() else 0)
    return [(n, os.path.join(root, n, "call_0")) for n in names if os.path.isfile(os.path.join(root, n, "call_0", "index.json"))]


def _first_diff(graph: str, original_dir: str, optimized_dir: str) -> OpDiff | None:
    _, original = read_call(original_dir)
    _, optimized = read_call(optimized_dir)
    reference = {node: value for kind, node, _, value in original if kind == "op"}  # Note [The per-op step compares by node name]
    for kind, node, target, values in optimized:
        if kind != "op" or node not in reference:
            continue
        for i, (got, want) in enumerate(zip(values, reference[node])):
            if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)):
                continue
            if got.shape != want.shape or got.dtype != want.dtype or _same(got, want):
                continue
            diff = (got.double() - want.double()).abs() if got.is_floating_point() else (got != want).double()
            return OpDiff(graph, node, target.split(".")[0] if target.count(".") else target, i,
                          float(diff.max()) if diff.numel() else 0.0)
    return None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaNs in the same places counting as equal."""
    if torch.equal(a, b):
        return True
    return a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all())
