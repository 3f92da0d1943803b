"""Device graphs: the engine's program captured on a device stream once per input signature, then replayed.

On an accelerator a small step is bound by kernel launches; replaying a captured device graph (CUDA
graphs, Ascend's aclgraph, torch.accelerator.Graph) launches the whole step at once. The program is
the same one the CPU engine runs (the same passes, custom ops and plan): the engine runs it once on a
capture stream while the device records, and each later call with that signature replays the
recording. One implementation for every device: the graph comes from the device's torch backend
(`compat.new_device_graph`), so CUDA, XPU and PrivateUse1 devices (graphex.testing.sim's "gxsim",
Ascend's NPU) share this runner.

Note [What a device graph reads and writes]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A replay reads and writes exactly the addresses the capture used. So, per input:
- an input the program writes (a KV cache updated in place) or that an output aliases is captured
  on the caller's own buffer: the write lands in the caller's tensor with no copy. Its address is
  checked on every call; a new address recaptures (logged, naming the input).
- a parameter or buffer (or a tensor marked with torch._dynamo.mark_static_address) is captured on
  its own memory; its address is checked per call and a moved one recaptures. (npugraph_ex skips
  that check under frozen_parameter=True; graphex keeps it: a replaced parameter replayed from its
  old address would be a silently wrong result, and the check is a pointer compare.)
- any other tensor input: with clone_input=True (the default) it is copied each call into a static
  buffer the graph owns; with clone_input=False the graph is captured on the first caller's buffer
  and a later call with another address is copied into that buffer.

Note [Device graph outputs are never overwritten]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A replay writes its outputs into the graph pool's memory, which the next replay (of this graph, or
of another graph sharing the pool) writes again. cudagraph trees hand out the pool's memory and
raise when an overwritten output is read; graphex copies every output the graph computes out of the
pool before returning it (one device copy per output: a decode step's logits), so an output a
caller holds is never changed by a later call. Outputs that alias an input are that input's memory
and are returned as they are.

Note [Outputs that share memory are copied together]
Outputs that share the pool's memory (`y, y.view(-1)`: eager's second is a view of the first) are
copied out as one: the memory they share once, each output rebuilt on the copy with its own sizes,
strides and offset, as a view of the output that is not a view (else of a base over the whole
copy), so writing one shows through the others, as in eager (found by a helper: each was copied
on its own, and a write into `y` no longer showed in the view).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Sequence

import torch
import torch.fx

from .. import compat
from ..base import log as _log
from ..base.warn import warn_once
from ..lowering.streams import uses_side_streams
from ..options import Options

# Note [One replay at a time]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A device graph reads its static input buffers and writes its pool: two threads replaying it at once
# would copy their inputs into the same buffers and read each other's outputs. The CPU engine runs
# calls from several threads at once (each run has its own values); a compiled graph's device graphs
# take one call at a time (a lock per compiled graph: uncontended it costs well under a microsecond).
_EAGER = object()  # a signature whose capture failed: it runs on the engine without a device graph
_WARM = object()   # a signature that ran once on the engine: its next call captures

# Note [A signature is captured on its second call]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The first call of a signature runs on the engine: the warm-up a device needs before a capture (lazy
# initialization, workspace allocation; torch.cuda.graphs' docs ask for it), and a graph Dynamo uses
# only once (transformers' StaticCache initializes itself on the first call, and Dynamo recompiles
# once it has) is never captured at all. The second call captures, then replays to compute its
# result (a capture does not run the work); later calls replay. A buffer that moved recaptures at
# once (no warm-up: the program has run on this signature).


def graph_device(gm: torch.fx.GraphModule) -> torch.device | None:
    """The one accelerator the graph's tensor inputs live on, when its torch backend can capture graphs.

    A graph with a CPU tensor input is not captured (as inductor's cudagraphs skip it): a capture bakes a CPU
    scalar's value into the recorded launch, so a replay would not see the next call's value."""
    devices = {v.device for n in gm.graph.find_nodes(op="placeholder") if isinstance(v := n.meta.get("val"), torch.Tensor)}
    accelerators = {d for d in devices if d.type not in ("cpu", "meta")}
    if len(accelerators) != 1:
        return None
    (device,) = accelerators
    if not compat.has_device_graphs(device.type):
        return None
    if any(d.type == "cpu" for d in devices):
        _log.info("graphex: a graph on %s with a CPU tensor input runs on the engine without device graphs "
                  "(a capture would bake the CPU value in); move that input to %s to capture it", device, device.type)
        return None
    return device


def pinned_inputs(gm: torch.fx.GraphModule) -> dict[int, str]:
    """Inputs a replay must see at the caller's own address (Note [What a device graph reads and writes]):
    index -> why (the program writes it, or an output aliases it)."""
    from torch._inductor.fx_utils import get_node_storage

    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    by_storage = {get_node_storage(p): i for i, p in enumerate(placeholders)
                  if isinstance(p.meta.get("val"), torch.Tensor)}
    pinned: dict[int, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for arg, value in zip(node.target._schema.arguments, _bound_args(node)):
            if arg.alias_info is not None and arg.alias_info.is_write:
                for v in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(v, torch.fx.Node) and get_node_storage(v) in by_storage:
                        pinned.setdefault(by_storage[get_node_storage(v)], f"written by {node.target.name()}")
    out = gm.graph.output_node().args[0]
    for o in out if isinstance(out, (list, tuple)) else (out,):
        if isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor):
            i = by_storage.get(get_node_storage(o))
            if i is not None:
                pinned.setdefault(i, "an output aliases it")
    return pinned


def _bound_args(node: torch.fx.Node) -> list[Any]:
    schema = node.target._schema  # type: ignore[union-attr]
    values = list(node.args) + [None] * (len(schema.arguments) - len(node.args))
    for i, arg in enumerate(schema.arguments):
        if arg.name in node.kwargs:
            values[i] = node.kwargs[arg.name]
    return values


def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
    """One device graph per concrete signature: sizes, strides, dtypes, devices of tensors; ints by value."""
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else
                 (type(a).__name__, a) for a in args)


def _static_signature(args: Sequence[Any]) -> tuple[Any, ...]:
    """A graph compiled with static shapes has one signature: Dynamo's guards already checked every tensor's
    sizes, strides, dtype and device and every int before this call (TENSOR_MATCH, CONSTANT_MATCH)."""
    return ()


@dataclasses.dataclass
class _Captured:
    graph: Any
    inputs: list[Any]          # what the capture ran on: static buffers, the caller's pinned tensors, non-tensors
    addresses: dict[int, int]  # input index -> data_ptr() checked per call
    copied: list[int]          # inputs copied into `inputs[i]` before each replay
    outputs: list[Any]         # what the capture produced (in the pool, or aliases of inputs)
    copy_out: list[int]        # outputs copied out of the pool (Note [Device graph outputs are never overwritten])
    # Note [Outputs that share memory are copied together]: groups of copy_out sharing one storage, each with the
    # index of its output that is not a view (or None); those outputs are not in copy_out.
    copy_together: list[tuple[list[int], int | None]] = dataclasses.field(default_factory=list)


class DeviceGraphs:
    """The steady runner of a compiled graph whose inputs live on an accelerator with a graph implementation."""

    def __init__(self, name: str, engine: Callable[[list[Any]], list[Any]], gm: torch.fx.GraphModule,
                 options: Options, device: torch.device, static_inputs: Sequence[int], dynamic: bool,
                 computed_outputs: Sequence[int]) -> None:
        """`computed_outputs`: the outputs the graph computes (not aliases of an input), which a replay copies
        out (Note [Device graph outputs are never overwritten])."""
        self.name = name
        self.engine = engine
        self.options = options
        self.device = device
        self.pinned = pinned_inputs(gm)
        self.side_streams = uses_side_streams(gm)
        self.parameters = set(static_inputs)
        self.graphs: dict[tuple[Any, ...], Any] = {}
        self.captures = 0
        self.replays = 0
        self._pool: Any = None  # one pool for this compiled graph's signatures (reuse_graph_pool_in_same_fx)
        self._lock = threading.Lock()
        self._call_lock = threading.RLock()
        self._pool_outputs = list(computed_outputs)
        self._key = _signature if dynamic else _static_signature

    # -- the call ---------------------------------------------------------------------------------
    def __call__(self, args: list[Any]) -> list[Any]:
        with self._call_lock:  # Note [One replay at a time]
            return self._call(args)

    def _call(self, args: list[Any]) -> list[Any]:
        key = self._key(args)
        entry = self.graphs.get(key)
        if entry is None:  # Note [A signature is captured on its second call]
            outs = self._engine(args)
            self.ran_on_the_engine(args, key)
            return outs
        if entry is _WARM:
            entry = self._capture_once(key, args)
        elif entry is not _EAGER and self.options.force_recapture:  # a fresh capture for every call
            _log.detail("%s: recapturing the device graph (force_recapture)", self.name)
            self._drop(key)
            entry = self._capture_once(key, args)
        elif entry is not _EAGER:
            moved = self._moved(entry, args)
            if moved:
                _log.info("%s: recapturing the device graph: %s", self.name, moved)
                self._drop(key)
                entry = self._capture_once(key, args)
        if entry is _EAGER:
            return self._engine(args)
        return self._replay(entry, args)

    def _engine(self, args: list[Any]) -> list[Any]:
        """A run on the engine; one that switches streams must return on the stream it was called on."""
        if not self.side_streams:
            return self.engine(args)
        entered = torch.accelerator.current_stream(self.device)
        outs = self.engine(args)
        left_on = torch.accelerator.current_stream(self.device)
        if left_on != entered:
            torch.accelerator.set_stream(entered)
            raise StreamLeftError(self.name, entered, left_on)
        return outs

    def _replay(self, entry: _Captured, args: list[Any]) -> list[Any]:
        for i in entry.copied:
            entry.inputs[i].copy_(args[i])
        entry.graph.replay()
        self.replays += 1
        outs = list(entry.outputs)
        for i in entry.copy_out:
            outs[i] = outs[i].clone()
        for group, base in entry.copy_together:
            _copy_together(outs, group, base)
        return outs

    def _moved(self, entry: _Captured, args: list[Any]) -> str:
        now_copied = []
        for i, ptr in entry.addresses.items():
            if args[i].data_ptr() == ptr:
                continue
            if i in self.pinned:
                return f"input {i} ({self.pinned[i]}) is at another address than at capture"
            if i in self.parameters:
                return f"parameter or buffer input {i} moved since the capture"
            now_copied.append(i)  # clone_input=False: copied into the captured buffer from now on
        for i in now_copied:
            del entry.addresses[i]
            entry.copied.append(i)
        return ""

    def _drop(self, key: tuple[Any, ...]) -> None:
        """Forget `key`'s device graph (its memory goes back to the pool); the caller captures it again at once."""
        entry = self.graphs.pop(key, None)
        if isinstance(entry, _Captured):
            entry.graph.reset()

    # -- capture ----------------------------------------------------------------------------------
    def _pool_for_next(self) -> tuple[int, int] | None:
        """use_graph_pool's pool; else this compiled graph's one pool (reuse_graph_pool_in_same_fx); else a new one."""
        if self.options.use_graph_pool is not None:
            return tuple(self.options.use_graph_pool)  # type: ignore[return-value]
        return self._pool if self.options.reuse_graph_pool_in_same_fx else None

    def ran_on_the_engine(self, args: list[Any], key: tuple[Any, ...] | None = None) -> None:
        """`args` just ran on the engine (the first run of a graph validates custom ops' fakes): their signature is
        warm, and its next call captures."""
        key = key if key is not None else self._key(args)
        with self._lock:
            if key in self.graphs:
                return
            if len(self.graphs) >= self.options.capture_limit:
                warn_once(f"capture_limit:{self.name}",
                          f"graphex: {self.name} has captured {self.options.capture_limit} device graphs, one per "
                          "input signature (capture_limit); new signatures now run on the engine without a device "
                          "graph. Raise options={'capture_limit': N} or pad inputs to a few fixed shapes.")
                self.graphs[key] = _EAGER
                return
            self.graphs[key] = _WARM

    def _capture_once(self, key: tuple[Any, ...], args: list[Any]) -> Any:
        with self._lock:
            entry = self.graphs.get(key)
            if entry is _WARM or entry is None:
                entry = self.graphs[key] = self._capture(args)
        return entry

    def _capture(self, args: list[Any]) -> Any:
        inputs: list[Any] = []
        addresses: dict[int, int] = {}
        copied: list[int] = []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor) or a.device.type == "cpu":
                inputs.append(a)
                continue
            if i in self.pinned or i in self.parameters or not self.options.clone_input:
                inputs.append(a)
                addresses[i] = a.data_ptr()  # checked per call, frozen_parameter or not: a pointer compare each
            else:
                buffer = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                buffer.copy_(a)
                inputs.append(buffer)
                copied.append(i)
        graph = compat.new_device_graph(self.device, self._pool_for_next(), self.options.capture_error_mode)
        stream = torch.Stream(device=self.device)
        compat.wait_stream(stream, self.device)
        try:
            with compat.on_stream(stream, self.device), \
                    (compat.entry_stream(stream) if self.side_streams else contextlib.nullcontext()):
                graph.capture_begin()
                try:
                    outputs = self.engine(inputs)
                    left_on = torch.accelerator.current_stream(self.device)
                    if left_on != stream:
                        raise StreamLeftError(self.name, stream, left_on)
                except BaseException:
                    with contextlib.suppress(Exception):  # ends the capture; the body's error is the one to report
                        torch.accelerator.set_stream(stream)
                        graph.capture_end()
                    raise
                graph.capture_end()
        except StreamLeftError:
            graph.reset()
            raise
        except Exception as e:  # noqa: BLE001  a capture failure falls back, named, for this signature only
            graph.reset()
            warn_once(f"device_graph:capture:{self.name}:{type(e).__name__}",
                      f"graphex: {self.name}: the program could not be captured into a {self.device.type} device "
                      f"graph: {_capture_failure(e)}. This input signature runs on the engine without a device "
                      f"graph. {_capture_fix(e)}")
            return _EAGER
        compat.wait_stream(torch.accelerator.current_stream(self.device), self.device, stream)
        if self.options.use_graph_pool is None and self.options.reuse_graph_pool_in_same_fx and self._pool is None:
            self._pool = graph.pool()
        self.captures += 1
        _log.info("%s: captured device graph %d on %s", self.name, len(self.graphs) + 1, self.device)
        copy_out = [i for i in self._pool_outputs if isinstance(outputs[i], torch.Tensor)]
        copy_out, together = _sharing_groups(outputs, copy_out)
        return _Captured(graph, inputs, addresses, copied, list(outputs), copy_out, together)


def _sharing_groups(outputs: Sequence[Any], copy_out: list[int]) -> tuple[list[int], list[tuple[list[int], int | None]]]:
    """copy_out split into the outputs copied alone and the groups that share one storage (Note [Outputs that share
    memory are copied together]); a group of several dtypes stays apart (copied alone each, as before)."""
    by_storage: dict[int, list[int]] = {}
    for i in copy_out:
        by_storage.setdefault(outputs[i].untyped_storage().data_ptr(), []).append(i)
    alone: list[int] = []
    together: list[tuple[list[int], int | None]] = []
    for group in by_storage.values():
        if len(group) == 1 or len({outputs[i].dtype for i in group}) > 1:
            alone += group
            continue
        bases = [i for i in group if not outputs[i]._is_view()]
        together.append((group, bases[0] if bases else None))
    return sorted(alone), together


def _copy_together(outs: list[Any], group: list[int], base: int | None) -> None:
    """Copy the storage `group`'s outputs share once and rebuild each on the copy (Note [Outputs that share memory
    are copied together])."""
    first = outs[group[0]]
    storage = first.untyped_storage().clone()
    if base is not None:
        b = outs[base]
        root = torch.empty(0, dtype=b.dtype, device=b.device).set_(storage, b.storage_offset(), b.size(), b.stride())
    else:
        root = torch.empty(0, dtype=first.dtype, device=first.device).set_(
            storage, 0, (storage.nbytes() // first.element_size(),), (1,))
    for i in group:
        o = outs[i]
        outs[i] = root if i == base else root.as_strided(o.size(), o.stride(), o.storage_offset())


class StreamLeftError(RuntimeError):
    """The program returned on another stream than it was called on (npugraph_ex refuses this too): the caller's
    next work would run on a stream it never chose, and a capture cannot end there."""

    def __init__(self, name: str, entered: Any, left: Any) -> None:
        super().__init__(
            f"graphex: {name}: the compiled function was entered on stream {entered.stream_id} of {entered.device} "
            f"and returned on stream {left.stream_id}. Every stream switch inside it must be undone before it "
            "returns: run side-stream work inside `with stream:` (and have the calling stream wait for it, "
            "`torch.accelerator.current_stream().wait_stream(stream)`); a custom op that runs work on another "
            "stream must fork and join it as a side stream, then restore the stream it found: `found = "
            "torch.accelerator.current_stream(); side.wait_stream(found)`, the work under `with side:`, then "
            "`found.wait_stream(side)`.")


def _capture_fix(e: BaseException) -> str:
    if "unjoined" in str(e).lower():
        return ("Work forked to a side stream was not joined back: before the function returns, have the calling "
                "stream wait for each side stream (`torch.accelerator.current_stream().wait_stream(side)`, or "
                "`event.record(side)` then `event.wait()`).")
    return ("A host sync in the model (.item(), .tolist(), a copy to the CPU, a data-dependent shape) breaks a "
            "capture: keep it out of the compiled function.")


def _capture_failure(e: BaseException) -> str:
    """What broke a capture: the node, its op and the user's source line when the engine names them."""
    finding = getattr(e, "finding", None)
    if finding is not None:
        where = f" at {finding.where}" if finding.where else ""
        return f"node '{finding.node}' ({finding.op}){where}: {finding.what}"
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
