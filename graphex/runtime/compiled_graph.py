"""CompiledGraph: what AOTAutograd calls on every step (boxed: one list in, one list out).

Note [A compiled graph runs in explicit phases]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A CompiledGraph is in one of three phases (`phase`):

    FIRST_CALL  frozen_parameter: the program is lowered on the first call, with the real
                parameters as constants (they are not known before). Then VALIDATION or STEADY.
    VALIDATION  validate_fake (and the program has custom ops): the next run checks every
                custom op's outputs against its fake (run_validated). Then STEADY.
    STEADY      `runner`, chosen once by `_steady_runner` from the options, the data dumps
                still to write and the watchers: the C++ executor itself in the common case,
                so the plain path pays for none of the options.

`runner` is what `__call__` calls; only `_enter` sets it (with `phase`), when a phase ends or
when what selects the steady runner changes (a watcher added or removed, the last dump
written). Nothing outside this class assigns it: code that needs to see a run's inputs and
outputs (cache_compile's cold path, bench) registers a watcher with `watch`.

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

import enum
import itertools
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch._inductor.fx_utils import get_node_storage
from torch.utils._python_dispatch import _disable_current_modes

from .. import _C, errors
from ..base import log as _log
from ..program import encode as _spec
from ..base.warn import warn_once
from ..distributed import collective_failure, is_collective
from ..lowering.lower import LoweredGraph, lower
from ..errors import FrozenInputReplaced
from ..options import Options
from ..passes import KeptCopy

# Note [A frozen parameter is checked by identity]: after this many re-lowerings, one warning.
_RELOWER_WARNING = 3


_live: "weakref.WeakValueDictionary[int, CompiledGraph]" = weakref.WeakValueDictionary()
_order = itertools.count()


def live_graphs() -> list["CompiledGraph"]:
    """Every CompiledGraph still referenced (by Dynamo's cache or by you), oldest first."""
    return [g for _, g in sorted(_live.items())]


def make_replay_error(kind: str, message: str, graph: str, node: str, op: str, source: str,
                      cause: BaseException | None = None) -> errors.ReplayError:
    """The error graphex._C raises for an operator that failed at replay: errors.make_replay_error, with what
    the live graph of that name tells about a collective (Note [A collective that fails names its peers])."""
    why = fix = ""
    if is_collective(op):
        gm = next((g.gm for g in live_graphs() if g.name == graph), None)
        why, fix = collective_failure(gm, node)
    return errors.make_replay_error(kind, message, graph, node, op, source, cause, why=why, fix=fix)


class Phase(enum.Enum):
    """Note [A compiled graph runs in explicit phases]."""
    FIRST_CALL = "first call"
    VALIDATION = "validation"
    STEADY = "steady"


Watcher = Callable[[list[Any], list[Any]], None]


class CompiledGraph(_C.RunnerCall):
    """One captured graph. Calling it calls `self.runner(args)` from C++, with no Python frame of ours between
    (Note [A compiled graph's call enters its runner at once], csrc/python/runner_call.cpp)."""

    _boxed_call = True  # AOTAutograd passes the inputs as one list

    def __init__(self, name: str, gm: torch.fx.GraphModule, options: Options, *, static_inputs: Sequence[int],
                 kept_copies: list[KeptCopy], in_place: dict[str, int] | None = None,
                 fused: dict[str, int] | None = None) -> None:
        self.name = name
        self.gm = gm
        self.options = options
        self.static_inputs = list(static_inputs)
        self.kept_copies = kept_copies  # the copies the replay still makes, with why (graphex.passes)
        self.in_place = dict(in_place or {})  # in-place op -> writes reinplacing made with it (graphex.passes)
        self.fused = dict(fused or {})  # fusion pattern name -> times it fired in this graph (pattern_fusion_pass)
        self.num_outputs = len(_output_nodes(gm))
        self._signatures: set[tuple[Any, ...]] = set()
        self.executor: _C.Executor | None = None
        self.lowered: LoweredGraph | None = None
        self.aot_metadata: Any = None  # AOTAutograd's ViewAndMutationMeta for this graph (set by capture)
        self.original_gm: torch.fx.GraphModule | None = None  # before the passes; only for data_dump_stage='original'
        self._dumping_run: Any = None
        self._watchers: list[Watcher] = []
        self.relowerings = 0  # frozen programs re-lowered because a parameter was replaced
        self._relower_lock = threading.Lock()

        frozen = options.frozen_parameter and bool(self.static_inputs) and not options.force_eager
        if options.force_eager or frozen:
            # Note [force_eager never lowers]: torch.fx runs the optimized graph as it is, so what the
            # engine cannot replay (control flow, effect tokens) still runs, and the advice to use
            # force_eager in graphex's errors always works. Frozen parameters: lowered once, on the
            # first call, when the real parameters are known (Phase.FIRST_CALL).
            self.num_ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
            self.dynamic = any(isinstance(n.meta.get("val"), torch.SymInt) or (
                isinstance(n.meta.get("val"), torch.Tensor)
                and any(isinstance(d, torch.SymInt) for d in n.meta["val"].shape))
                for n in gm.graph.find_nodes(op="placeholder"))
        else:
            self.lowered = lower(gm, name=name)
            self.executor = build_executor(self.lowered)
            self.num_ops = self.lowered.num_ops
            self.dynamic = self.lowered.dynamic
        # Note [capture_limit counts device graphs]: the CPU engine captures no per-shape device graphs; on an
        # accelerator with a graph implementation the program is captured per signature (graphex/runtime/device_graphs.py).
        self.captures_per_shape = False
        self.device_graphs: Any = None
        if self.executor is not None:
            self._attach_device_graphs()
        self._clone_outputs = _outputs_to_clone(gm) if options.clone_output else []
        if options.dump_tensor_data:  # Note [Dumps are written whole and bounded] (graphex/runtime/debug_dump.py)
            from .debug_dump import DumpingRun
            self._dumping_run = DumpingRun(self)
        self.phase = Phase.STEADY
        self.runner: Callable[[list[Any]], list[Any]] = self._first_call
        self._enter(Phase.FIRST_CALL if frozen else self._after_build())
        _live[next(_order)] = self

    # -- phases (Note [A compiled graph runs in explicit phases]) ----------------
    def _after_build(self) -> Phase:
        if (self.options.validate_fake and self._dumping_run is None and self.lowered is not None
                and self.lowered.validates_fakes):
            return Phase.VALIDATION
        return Phase.STEADY

    def _enter(self, phase: Phase) -> None:
        self.phase = phase
        self.runner = self._steady_runner() if phase is Phase.STEADY else self._first_call

    def _first_call(self, args: list[Any]) -> list[Any]:
        if self.phase is Phase.FIRST_CALL:
            self._lower_frozen(args)
            _log.info("%s: froze %d parameters and buffers into the program", self.name, len(self.static_inputs))
            self._enter(self._after_build())
            if self.phase is Phase.STEADY:
                return self.runner(args)
        return self._validated_call(args)

    def _lower_frozen(self, args: list[Any]) -> None:
        frozen = {i: args[i] for i in self.static_inputs}
        # Note [A frozen convolution weight is prepacked once]: fused mode only (not bit for bit)
        prepack = self.options.pattern_fusion_pass and self.options.prepack_conv_weights
        lowered = lower(self.gm, name=self.name, frozen=frozen, prepack=prepack)
        executor = build_executor(lowered)
        # Note [A frozen parameter is checked by identity], Note [Folding frozen parameters]
        executor.bind_frozen([(i, t, lowered.frozen_watch.get(i, 0)) for i, t in sorted(frozen.items())])
        self.lowered, self.executor, self.num_ops = lowered, executor, lowered.num_ops
        if self.device_graphs is None:
            self._attach_device_graphs()

    def _attach_device_graphs(self) -> None:
        """Inputs on an accelerator whose backend captures graphs: the program is replayed as device graphs."""
        from .device_graphs import DeviceGraphs, graph_device

        device = graph_device(self.gm)
        if device is not None:
            engine = self._run_frozen if self.lowered is not None and self.lowered.frozen_inputs else self.executor
            self.device_graphs = DeviceGraphs(self.name, engine, self.gm, self.options, device,  # type: ignore[arg-type]
                                              self.static_inputs, dynamic=self.dynamic,
                                              computed_outputs=_outputs_to_clone(self.gm))

    def _run_frozen(self, args: list[Any]) -> list[Any]:
        """The engine run of a frozen program; a replaced parameter re-lowers it first (once per replacement)."""
        try:
            return self.executor(args)  # type: ignore[misc]
        except FrozenInputReplaced as e:
            with self._relower_lock:
                if not self.executor.fits(args):  # type: ignore[union-attr]  (another thread may have re-lowered)
                    self._relower_frozen(args, e)
            return self.executor(args)  # type: ignore[misc]

    def _relower_frozen(self, args: list[Any], change: FrozenInputReplaced) -> None:
        self.relowerings += 1
        start = time.perf_counter()
        self._lower_frozen(args)
        ms = (time.perf_counter() - start) * 1000
        what = str(change).removeprefix("graphex: ")
        _log.info("%s: re-lowered the program with the current parameters and buffers in %.1f ms", what, ms)
        if self.relowerings == _RELOWER_WARNING:
            warn_once(f"frozen_parameter:relower:{self.name}",
                      f"graphex: {self.name}: frozen parameters changed {self.relowerings} times after compiling "
                      f"(last: {what}); each change re-lowers the program ({ms:.1f} ms). For a model whose "
                      "parameters change between calls, compile without options={'frozen_parameter': True}.")

    def _validated_call(self, args: list[Any]) -> list[Any]:
        """The first replay checks every custom op's outputs against its fake (option validate_fake)."""
        from ..custom_ops import explain_fake_mismatch
        from ..errors import FakeMismatch

        if self.captures_per_shape:
            self._admit_signature(args)  # counts toward capture_limit like any other first call
        try:
            outs = self.executor.run_validated(args)  # type: ignore[union-attr]
        except FakeMismatch as e:
            node = self.lowered.program.nodes[e.node_index]  # type: ignore[union-attr]
            op = self.lowered.node_ops[e.node_index]  # type: ignore[union-attr]
            raise explain_fake_mismatch(op, node.name, e.output, e.expected, e.actual, node.source) from None
        self._enter(Phase.STEADY)
        if self.device_graphs is not None:  # that run was this signature's warm-up: capture it now
            self.device_graphs.ran_on_the_engine(args)
        outs = self._with_options_applied(outs)
        for watcher in list(self._watchers):
            watcher(args, outs)
        return outs

    def _steady_runner(self) -> Callable[[list[Any]], list[Any]]:
        if self._dumping_run is not None:
            run = self._dumping_run
        elif self.options.force_eager:
            run = self.run_fx
        elif self.device_graphs is not None:
            run = self.device_graphs
        elif self.captures_per_shape or self._clone_outputs:
            run = self._run_with_options
        elif self.lowered is not None and self.lowered.frozen_inputs:
            run = self._run_frozen
        else:
            run = self.executor  # type: ignore[assignment]
        if not self._watchers:
            return run  # type: ignore[return-value]

        def watched(args: list[Any]) -> list[Any]:
            outs = run(args)
            for watcher in list(self._watchers):
                watcher(args, outs)
            return outs

        return watched

    def _run_with_options(self, args: list[Any]) -> list[Any]:
        if self.captures_per_shape and not self._admit_signature(args):
            return self.run_fx(args)
        engine = self._run_frozen if self.lowered is not None and self.lowered.frozen_inputs else self.executor
        return self._with_options_applied(engine(args))  # type: ignore[misc]

    def _with_options_applied(self, outs: list[Any]) -> list[Any]:
        for i in self._clone_outputs:
            outs[i] = outs[i].clone()
        return outs

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call `watcher(args, outputs)` after every run from now on; returns the function that stops it.

        For tools that need what the engine received or returned (cache_compile's cold path records
        the first outputs; bench records the arguments). The plain path is back to the bare executor
        once no watcher is left.
        """
        self._watchers.append(watcher)
        if self.phase is Phase.STEADY:
            self._enter(Phase.STEADY)

        def unwatch() -> None:
            if watcher in self._watchers:
                self._watchers.remove(watcher)
                if self.phase is Phase.STEADY:
                    self._enter(Phase.STEADY)

        return unwatch

    def dumps_finished(self) -> None:
        """The last dumped call (data_dump_calls) is done: from now on the plain run."""
        self._dumping_run = None
        self._enter(Phase.STEADY)

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
        return _C.Executor(_spec.encode(lowered.program), lowered.constants)


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
