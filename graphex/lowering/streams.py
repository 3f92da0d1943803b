"""Side streams in a lowered program: which stream each op runs on, and Dynamo's spelling of stream syncs.

Used by lower.py, which emits the stream switches and records (Note [Side streams in a program] below).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ..program import Slot

# Note [Side streams in a program]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Dynamo (torch >= 2.13) traces `with stream:`, `s.wait_stream(t)` and events into the graph: each op run inside
# `with stream:` carries `meta["custom"]["stream"]`, an index into Dynamo's table of the frame's stream and event
# objects (torch._dynamo.graph_bytecode_inputs; index 0 is the stream the frame was called on), and each sync is
# a `streams::*` op wrapped in `control_deps`. The engine runs the program in order on one host thread, so the
# program switches the current stream itself: a `streams::fork` before the first op of a stretch on a side
# stream, a `streams::join` back to the entry stream after it, and the program always ends on the stream it was
# entered on. A tensor made on one stream and read on another gets a `streams::record_stream`, so its memory is
# not reused before the reader is done. Under a device-graph capture (graphex/runtime/device_graphs.py) the entry stream
# is the capture stream (graphex.compat.entry_stream rebinds index 0, as cudagraph trees'
# _update_current_stream_external_object does): a side stream that waits on it joins the capture (a fork), and
# the entry stream's wait on the side stream joins it back, so the side stream's work is recorded into the same
# graph, as CUDA graphs capture fork/join.


def is_control_deps(target: Any) -> bool:
    """torch._inductor.fx_passes.control_dependencies.control_deps, registered only once that module loads."""
    return isinstance(target, torch._ops.HigherOrderOperator) and target.name() == "control_deps"


ENTRY_STREAM = 0  # torch._dynamo.graph_bytecode_inputs.CURRENT_STREAM_INDEX
NOT_MADE_HERE = object()


def annotated_stream(node: torch.fx.Node) -> Any:
    """The stream index Dynamo annotated `node` with, as it wrote it (None: not annotated)."""
    return (node.meta.get("custom") or {}).get("stream")


def set_stream(node: torch.fx.Node, stream: Any) -> None:
    node.meta["custom"] = {**(node.meta.get("custom") or {}), "stream": stream}


def stream_of(node: torch.fx.Node) -> int | None:
    """The side stream `node` runs on; None for the stream the program was entered on."""
    stream = annotated_stream(node)
    return None if stream == ENTRY_STREAM else stream


def uses_side_streams(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph runs work on another stream than the one it is called on, or syncs streams."""
    return any(stream_of(n) is not None or is_control_deps(n.target) or
               (isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "streams")
               for n in gm.graph.nodes)


def slots_in(values: Any) -> list[Slot]:
    found: list[Slot] = []
    for v in values:
        if isinstance(v, Slot):
            found.append(v)
        elif isinstance(v, tuple):
            found.extend(slots_in(v))
    return found
