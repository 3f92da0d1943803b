"""Every operator call names one overload: passes that insert `aten.clone(x)` (the packet) get `aten.clone.default`.

inductor's scatter decomposition (run by the reinplacing pass) creates calls to
operator packets; the engine resolves an overload's schema once at load, so each
packet call is resolved here to the overload whose schema accepts its arguments
(the same choice the packet makes when called in eager).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx


def resolve_packets(graph: torch.fx.Graph) -> None:
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverloadPacket):
            overload = _matching_overload(node.target, node.args, node.kwargs)
            if overload is not None:
                node.target = overload


def _matching_overload(packet: torch._ops.OpOverloadPacket, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> torch._ops.OpOverload | None:
    names = packet.overloads()
    for name in sorted(names, key=lambda n: n != "default"):  # "default" first, as eager prefers it
        overload = getattr(packet, name)
        if _binds(overload._schema, args, kwargs):
            return overload
    return None


def _binds(schema: torch._C.FunctionSchema, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call with `args` and `kwargs` fits `schema` (count and names; eager checks the types)."""
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        return False
    bound = {a.name for a in positional[:len(args)]}
    if set(kwargs) & bound or not set(kwargs) <= {a.name for a in schema.arguments}:
        return False
    given = bound | set(kwargs)
    return all(a.name in given or a.has_default_value() or _optional(a) for a in schema.arguments)


def _optional(a: Any) -> bool:
    return isinstance(a.type, torch.OptionalType)
