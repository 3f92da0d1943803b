"""torch.fx's internals: the create-node hook and the graph's insertion point."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
import torch.fx


# -- torch.fx: where a pass inserts a node ---------------------------------------------------------

@contextlib.contextmanager
def on_node_created(gm: torch.fx.GraphModule, hook: Callable[[torch.fx.Node], None]) -> Iterator[None]:
    """Call `hook(node)` for every node created in `gm`'s graph while the block runs (this graph only).

    GraphModule's create-node hooks (2.5+) run as the node is made, before it is linked in.
    """
    gm._register_create_node_hook(hook)
    try:
        yield
    finally:
        gm._unregister_create_node_hook(hook)


def insertion_successor(graph: torch.fx.Graph) -> torch.fx.Node | None:
    """The node a node created now will be inserted before (None at the end of the graph).

    The graph's insertion point is `anchor.prepend` (inserting_before, the default
    with the root) or `anchor.append` (inserting_after); both 2.0+.
    """
    insert = graph._insert
    anchor = getattr(insert, "__self__", None)
    if not isinstance(anchor, torch.fx.Node):
        return None
    node = anchor if getattr(insert, "__name__", "") == "prepend" else anchor.next
    return None if node.op == "root" else node
