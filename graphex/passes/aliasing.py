"""The one alias analysis graphex's passes share: which tensor a node names, and who reads it when.

Used by reinplace.py (to explain every copy the replay still makes) and copy_back.py
(to decide whether a copy-back can be folded), so a kept copy is explained by the
same analysis that kept it.
"""

from __future__ import annotations

import torch
import torch.fx
from torch._inductor.fx_passes.reinplace import META_ONLY_OPS
from torch.fx.passes.reinplace import _is_view_op


def returns_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """For an in-place or out= op, the argument it returns (same tensor object), else None."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None
    schema = target._schema
    if len(schema.returns) != 1 or schema.returns[0].alias_info is None:
        return None
    ret = schema.returns[0].alias_info
    if not ret.is_write:
        return None
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write and arg.alias_info.before_set == ret.before_set:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            return value if isinstance(value, torch.fx.Node) else None
    return None


def resolve_inplace(node: torch.fx.Node) -> torch.fx.Node:
    """Follow in-place results back to the tensor they are (`index_put_(x, ...)` is x)."""
    while (source := returns_input(node)) is not None:
        node = source
    return node


def root(node: torch.fx.Node) -> torch.fx.Node:
    """The graph value whose memory `node` names: through views and in-place results."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node) and (
        _is_view_op(node.target) or returns_input(node) is not None
    ):
        node = node.args[0]
    return node


def reads_memory(node: torch.fx.Node) -> bool:
    """False for ops that only look at metadata (sizes, views): they never read a tensor's values."""
    return node.target not in META_ONLY_OPS and not _is_view_op(node.target)


def first_toucher_between(base_root: torch.fx.Node, start: torch.fx.Node, stop: torch.fx.Node | None,
                          ignore: frozenset[torch.fx.Node] = frozenset()) -> torch.fx.Node | None:
    """The first node strictly after `start` (and before `stop`) that reads or writes `base_root`'s memory."""
    node = start.next
    while node is not stop and node.op != "root":
        if node not in ignore and reads_memory(node) and any(root(a) is base_root for a in node.all_input_nodes):
            return node
        node = node.next
    return None
