"""CompiledGraph: what AOTAutograd calls on every step (boxed: one list in, one list out).

The common case is a straight call into the C++ executor. The options that need
Python on the hot path (force_eager, clone_output, capture_limit for programs that
capture a device graph per shape, frozen_parameter's first call) select a
different `_run` once, at construction, so the plain path pays for none of them.

Note [capture_limit counts device graphs]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
In npugraph_ex, capture_limit bounds how many device graphs (one per concrete
input signature) one compiled graph captures. A CPU program captures none: with
dynamic=True it is one program that computes every size per call in C++, so a
new size or a new int value (a decode position) costs no capture and never runs
eagerly. Only a program that sets `captures_per_shape` (a device-graph mode)
counts signatures in `_admit_signature`; the CPU path never pays for the check.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch._inductor.fx_utils import get_node_storage
from torch.utils._python_dispatch import _disable_current_modes

from . import _C, _log, _spec
from ._warn import warn_once
from .lower import LoweredGraph, lower
from .options import Options
from .passes import KeptCopy


_live: "weakref.WeakValueDictionary[int, CompiledGraph]" = weakref.WeakValueDictionary()
_order = itertools.count()


def live_graphs() -> list["CompiledGraph"]:
    """Every CompiledGraph still referenced (by Dynamo's cache or by you), oldest first."""
    return [g for _, g in sorted(_live.items())]


class CompiledGraph:
    _boxed_call = True  # AOTAutograd passes the inputs as one list

    def __init__(self, name: str, gm: torch.fx.GraphModule, options: Options, *, static_inputs: Sequence[int],
                 kept_copies: list[KeptCopy]) -> None:
        self.name = name
        self.gm = gm
        self.options = options
        self.static_inputs = list(static_inputs)
        self.kept_copies = kept_copies
        self.num_outputs = len(_output_nodes(gm))
        self._signatures: set[tuple[Any, ...]] = set()
        self.executor: _C.Executor | None = None
        self.lowered: LoweredGraph | None = None
        self.aot_metadata: Any = None  # AOTAutograd's ViewAndMutationMeta for this graph (set by capture)
        self.original_gm: torch.fx.GraphModule | None = None  # before the passes; only for data_dump_stage='original'
        self._dumping = options.dump_tensor_data

        frozen = options.frozen_parameter and bool(self.static_inputs)
        if options.force_eager:
            # Note [force_eager never lowers]: torch.fx runs the optimized graph as it is, so what the
            # engine cannot replay (control flow, effect tokens) still runs, and the advice to use
            # force_eager in graphex's errors always works.
            self.num_ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
            self.dynamic = any(isinstance(n.meta.get("val"), torch.SymInt) or (
                isinstance(n.meta.get("val"), torch.Tensor)
                and any(isinstance(d, torch.SymInt) for d in n.meta["val"].shape))
                for n in gm.graph.find_nodes(op="placeholder"))
        else:
            self.lowered = lower(gm, name=name)
            if not frozen:  # frozen: parameters become constants of the program, built on the first call
                self.executor = build_executor(self.lowered)
            self.num_ops = self.lowered.num_ops
            self.dynamic = self.lowered.dynamic
        # Note [capture_limit counts device graphs]: the CPU engine captures no per-shape device graphs.
        self.captures_per_shape = False
        self._clone_outputs = _outputs_to_clone(gm) if options.clone_output else []
        self._run = self._select_run(frozen)
        _live[next(_order)] = self

    # -- the hot path ----------------------------------------------------------
    def __call__(self, args: list[Any]) -> list[Any]:
        return self._run(args)

    def _select_run(self, frozen: bool) -> Callable[[list[Any]], list[Any]]:
        if frozen and not self.options.force_eager:
            return self._first_frozen_call
        if self._dumping:  # Note [Dumps are written whole and bounded] (graphex/debug_dump.py); off: never here
            from .debug_dump import DumpingRun
            return DumpingRun(self)
        if self.options.force_eager:
            return self.run_fx
        if self.options.validate_fake and self.lowered is not None and self.lowered.validates_fakes:
            return self._first_validated_call
        return self._steady_run()

    def _run_with_options(self, args: list[Any]) -> list[Any]:
        if self.captures_per_shape and not self._admit_signature(args):
            return self.run_fx(args)
        return self._with_options_applied(self.executor(args))  # type: ignore[misc]

    def _first_validated_call(self, args: list[Any]) -> list[Any]:
        """The first replay checks every custom op's outputs against its fake (option validate_fake)."""
        from .custom_ops import explain_fake_mismatch
        from .errors import FakeMismatch

        if self.captures_per_shape:
            self._admit_signature(args)  # counts toward capture_limit like any other first call
        try:
            outs = self.executor.run_validated(args)  # type: ignore[union-attr]
        except FakeMismatch as e:
            node = self.lowered.spec["nodes"][e.node_index]  # type: ignore[union-attr]
            op = self.lowered.node_ops[e.node_index]  # type: ignore[union-attr]
            raise explain_fake_mismatch(op, node["name"], e.output, e.expected, e.actual, node["source"]) from None
        self._run = self._steady_run()
        return self._with_options_applied(outs)

    def _steady_run(self) -> Callable[[list[Any]], list[Any]]:
        if not self.captures_per_shape and not self._clone_outputs:
            return self.executor  # type: ignore[return-value]
        return self._run_with_options

    def _with_options_applied(self, outs: list[Any]) -> list[Any]:
        for i in self._clone_outputs:
            outs[i] = outs[i].clone()
        return outs

    def _first_frozen_call(self, args: list[Any]) -> list[Any]:
        frozen = {i: args[i] for i in self.static_inputs}
        self.lowered = lower(self.gm, name=self.name, frozen=frozen)
        self.executor = build_executor(self.lowered)
        self._run = self._select_run(frozen=False)
        _log.info("%s: froze %d parameters and buffers into the program", self.name, len(frozen))
        return self._run(args)

    def dumps_finished(self) -> None:
        """The last dumped call (data_dump_calls) is done: from now on the plain run."""
        self._dumping = False
        self._run = self._select_run(frozen=False)

    def _admit_signature(self, args: list[Any]) -> bool:
        key = tuple((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a for a in args)
        if key in self._signatures:
            return True
        if len(self._signatures) >= self.options.capture_limit:
            warn_once(f"capture_limit:{self.name}",
                      f"graphex: {self.name} has been replayed for {self.options.capture_limit} different input "
                      f"signatures (capture_limit); new signatures now run eagerly. Raise "
                      f"options={{'capture_limit': N}} or pad inputs to a few fixed shapes.")
            return False
        self._signatures.add(key)
        _log.info("%s: capture %d for input signature %s", self.name, len(self._signatures), _short(key))
        return True

    def run_fx(self, args: list[Any]) -> list[Any]:
        """Run the optimized graph with torch.fx (force_eager, and past capture_limit for device graphs)."""
        out = self.gm(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    # -- introspection (dumps, tests) -------------------------------------------
    def code(self) -> str:
        return self.gm.print_readable(print_output=False, include_stride=True, include_device=True)

    def plan(self) -> str:
        if self.options.force_eager:
            return "(force_eager: the graph runs with torch.fx; no program is built)\n"
        if self.executor is None:
            return "(program not built yet: frozen parameters are bound on the first call)\n"
        return self.executor.describe()


def build_executor(lowered: LoweredGraph) -> _C.Executor:
    # Capture runs under AOTAutograd's FakeTensorMode; the program's constants must be real.
    with _disable_current_modes():
        return _C.Executor(_spec.encode(lowered.spec), lowered.constants)


def _output_nodes(gm: torch.fx.GraphModule) -> list[Any]:
    out = gm.graph.output_node().args[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _outputs_to_clone(gm: torch.fx.GraphModule) -> list[int]:
    """Outputs computed by the graph (not views of an input, not None/ints): the ones clone_output copies."""
    input_storages = {get_node_storage(p) for p in gm.graph.find_nodes(op="placeholder")}
    clone = []
    for i, node in enumerate(_output_nodes(gm)):
        if isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor):
            if get_node_storage(node) not in input_storages:
                clone.append(i)
    return clone


def _short(key: tuple[Any, ...], limit: int = 160) -> str:
    text = ", ".join(f"{list(k[0])}" if isinstance(k, tuple) else repr(k) for k in key)
    return text if len(text) <= limit else text[:limit] + "..."
