"""Per-op data dumps (options dump_tensor_data, data_dump_stage, data_dump_dir, data_dump_calls).

Layout, one directory per graph and dumped replay:

    data_dump_dir/graph_N/call_K/index.json        stage, [{file, node, target, kind}, ...] in run order
    data_dump_dir/graph_N/call_K/input_III.pt      each graph input, before the call
    data_dump_dir/graph_N/call_K/NNN_<node>.pt     each op's outputs (a list, one per returned value)

Note [Dumps are written whole and bounded]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Every file is written atomically (graphex/base/atomic.py) and index.json last, so a directory with
an index is complete. Only the first data_dump_calls replays of each graph are dumped; then the
graph switches back to the plain engine call, so one dumped call costs about the graph's inputs
plus all its intermediates, times data_dump_calls, per graph.
"""

from __future__ import annotations

import copy
import io
import json
import operator
import os
import re
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from ..base.atomic import write_atomic
from ..options import Options

DEFAULT_DIR = "graphex_data_dump"


def keep_original(gm: torch.fx.GraphModule, options: Options) -> torch.fx.GraphModule | None:
    """A copy of the functional ATen graph before graphex's passes, kept only for data_dump_stage='original'."""
    if not (options.dump_tensor_data and options.data_dump_stage == "original"):
        return None
    with _disable_current_modes():
        return copy.deepcopy(gm)


def dump_dir(options: Options) -> str:
    return options.data_dump_dir or DEFAULT_DIR


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return [_clone(v) for v in value]
    return value


def _write(path: str, value: Any) -> None:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    write_atomic(path, buffer.getvalue())


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]


def write_call(directory: str, stage: str, inputs: list[Any], ops: list[tuple[str, str, list[Any]]]) -> None:
    """One dumped call: inputs and (node, target, values) per op, in run order (Note [Dumps are written whole and bounded])."""
    os.makedirs(directory, exist_ok=True)
    index: dict[str, Any] = {"stage": stage, "entries": []}
    for i, value in enumerate(inputs):
        name = f"input_{i:03d}.pt"
        _write(os.path.join(directory, name), value)
        index["entries"].append({"file": name, "node": f"input_{i}", "target": "input", "kind": "input"})
    for n, (node, target, values) in enumerate(ops):
        name = f"{n:03d}_{_safe(node)}.pt"
        _write(os.path.join(directory, name), values)
        index["entries"].append({"file": name, "node": node, "target": target, "kind": "op"})
    write_atomic(os.path.join(directory, "index.json"), json.dumps(index, indent=1))


def read_call(directory: str) -> tuple[str, list[tuple[str, str, str, Any]]]:
    """(stage, [(kind, node, target, value)]) of one dumped call."""
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    out = []
    for e in index["entries"]:
        value = torch.load(os.path.join(directory, e["file"]), weights_only=True)
        out.append((e["kind"], e["node"], e["target"], value))
    return index["stage"], out


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.ops: list[tuple[str, str, list[Any]]] = []

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if n.op == "call_function" and n.target is not operator.getitem:
            values = list(result) if isinstance(result, (tuple, list)) else [result]
            self.ops.append((n.name, _target_text(n.target), _clone(values)))
        return result


def _target_text(target: Any) -> str:
    name = getattr(target, "_schema", None)
    if name is not None:
        overload = getattr(target, "_overloadname", "default") or "default"
        return f"{target._schema.name}.{overload}"
    return getattr(target, "__name__", str(target))


def run_original(gm: torch.fx.GraphModule, inputs: list[Any]) -> list[tuple[str, str, list[Any]]]:
    """The original graph's per-op values, run by torch.fx on clones of `inputs` (eager kernels)."""
    recorder = _Recorder(gm)
    recorder.run(*[_clone(a) if isinstance(a, torch.Tensor) else a for a in inputs])
    return recorder.ops


class DumpingRun:
    """The run a CompiledGraph uses while dump_tensor_data is on, for its first data_dump_calls calls.

    optimized: the engine's run_dumped (its own values), or, under force_eager, torch.fx on the
    optimized graph. original: torch.fx on the graph before graphex's passes, on clones of the
    inputs, then the normal replay (its outputs are what the caller gets).
    """

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.calls = 0

    def __call__(self, args: list[Any]) -> list[Any]:
        owner, options = self.owner, self.owner.options
        directory = os.path.join(dump_dir(options), owner.name, f"call_{self.calls}")
        inputs = [_clone(a) for a in args]
        if options.data_dump_stage == "original" and owner.original_gm is not None:
            ops = run_original(owner.original_gm, args)
            outs = owner.run_fx(args) if owner.executor is None else owner.executor(args)
        elif owner.executor is None:  # force_eager
            recorder = _Recorder(owner.gm)
            out = recorder.run(*args)
            outs, ops = (list(out) if isinstance(out, (tuple, list)) else [out]), recorder.ops
        else:
            outs, ops = owner.executor.run_dumped(args)
        write_call(directory, options.data_dump_stage, inputs, ops)
        self.calls += 1
        if self.calls >= options.data_dump_calls:
            owner.dumps_finished()
        return outs
