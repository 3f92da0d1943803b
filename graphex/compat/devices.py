"""Accelerators: the graph class a device captures with, streams, and Dynamo's traced side streams."""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Iterator

import torch

from ._base import TorchInternalChanged


# -- device graphs (graphex/runtime/device_graphs.py) -------------------------------------------------------------------------

# Note [Which graph class a device uses]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Since torch 2.13 torch.accelerator.Graph captures on the current accelerator through the graph
# implementation its backend registered (REGISTER_GRAPH_IMPL). Before, and for a device that is not
# the current accelerator, each backend's module has its own class named after the device type:
# torch.cuda.CUDAGraph, torch.xpu.XPUGraph, torch_npu's torch.npu.NPUGraph, graphex.testing.sim's
# torch.gxsim.GXSIMGraph; all take capture_begin(pool=..., [capture_error_mode=...]).

def _device_graph_class(device_type: str) -> Any:
    accelerator = getattr(torch, "accelerator", None)
    current = accelerator.current_accelerator() if accelerator is not None and accelerator.is_available() else None
    if current is not None and current.type == device_type and hasattr(accelerator, "Graph"):
        return accelerator.Graph
    module = getattr(torch, device_type, None)
    if module is None or not getattr(module, "is_available", lambda: False)():
        return None
    return getattr(module, f"{device_type.upper()}Graph", None)


def has_device_graphs(device_type: str) -> bool:
    """Whether tensors of `device_type` can be captured into a device graph with this torch and backend."""
    return device_type not in ("cpu", "meta") and _device_graph_class(device_type) is not None


class _DeviceGraph:
    """A device graph with one capture_begin(): the pool and the error mode bound at construction."""

    def __init__(self, cls: Any, pool: tuple[int, int] | None, capture_error_mode: str) -> None:
        self._accelerator = cls is getattr(getattr(torch, "accelerator", None), "Graph", None)
        if self._accelerator:
            self._graph = cls(pool=pool, capture_error_mode=capture_error_mode)
        else:
            self._graph = cls()
        self._pool, self._mode = pool, capture_error_mode

    def capture_begin(self) -> None:
        if self._accelerator:
            self._graph.capture_begin()
            return
        import inspect

        kwargs: dict[str, Any] = {"pool": self._pool}
        if self._mode != "default" and "capture_error_mode" in inspect.signature(self._graph.capture_begin).parameters:
            kwargs["capture_error_mode"] = self._mode
        self._graph.capture_begin(**kwargs)

    def capture_end(self) -> None:
        self._graph.capture_end()

    def replay(self) -> None:
        self._graph.replay()

    def reset(self) -> None:
        self._graph.reset()

    def pool(self) -> tuple[int, int]:
        return tuple(self._graph.pool())  # type: ignore[return-value]


def new_device_graph(device: torch.device, pool: tuple[int, int] | None, capture_error_mode: str) -> _DeviceGraph:
    cls = _device_graph_class(device.type)
    if cls is None:
        raise TorchInternalChanged(f"graphex: torch {torch.__version__} has no graph implementation for {device.type}")
    return _DeviceGraph(cls, pool, capture_error_mode)


@contextlib.contextmanager
def on_stream(stream: Any, device: torch.device) -> Iterator[None]:
    """Make `stream` the current stream of `device` for the block (torch.accelerator.set_stream, 2.6+)."""
    previous = torch.accelerator.current_stream(device)
    torch.accelerator.set_stream(stream)
    try:
        yield
    finally:
        torch.accelerator.set_stream(previous)


def wait_stream(waiter: Any, device: torch.device, on: Any = None) -> None:
    """`waiter` waits for the work queued so far on `on` (default: the device's current stream)."""
    on = on if on is not None else torch.accelerator.current_stream(device)
    if on != waiter:
        waiter.wait_stream(on)


@contextlib.contextmanager
def entry_stream(stream: Any) -> Iterator[None]:
    """Note [Side streams in a program] (graphex/lowering/streams.py): for the block, index 0 of Dynamo's table of a frame's
    streams and events (torch._dynamo.graph_bytecode_inputs, torch >= 2.13) is `stream`. Dynamo's bytecode fills
    the table with the stream the frame was called on just before it calls the graph; a device-graph capture runs
    the program on the capture stream instead, and the program's stream switches and syncs must name that one."""
    if not traces_side_streams():  # torch < 2.13: nothing in the program names the entry stream
        yield
        return
    table_module = _stream_tracing_module("torch._dynamo.graph_bytecode_inputs")
    table = table_module.index_to_external_object_weakref
    index = table_module.CURRENT_STREAM_INDEX
    before = table.get(index)
    table[index] = weakref.ref(stream)
    try:
        yield
    finally:
        if before is None:
            table.pop(index, None)
        else:
            table[index] = before


@functools.cache
def traces_side_streams() -> bool:
    """Whether Dynamo traces side streams in the shape Note [Side streams in a program] lowers (torch >= 2.13): the
    `streams::*` ops, the `custom["stream"]` annotation, and index 0 of its table of the frame's streams and events
    always the stream the frame was called on (CURRENT_STREAM_INDEX). torch 2.11 annotates ops too, but its table
    has no fixed index for that stream (an event made first takes index 0) and it drops `wait_stream`: there the
    annotations are not lowered, and the ops run in order on the calling stream, as aot_eager runs them."""
    streams = _stream_tracing_module("torch._dynamo.variables.streams")
    table = _stream_tracing_module("torch._dynamo.graph_bytecode_inputs")
    return (streams is not None and hasattr(streams, "fork_stream") and hasattr(torch.ops.streams, "record_stream")
            and getattr(table, "CURRENT_STREAM_INDEX", None) == 0)


def _stream_tracing_module(name: str) -> Any:
    """One of Dynamo's stream-tracing modules (torch >= 2.13), or None. Imported by name, since older torch lacks
    them; tests/python/test_torch_internals.py checks the names graphex reads in them where torch traces streams."""
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
