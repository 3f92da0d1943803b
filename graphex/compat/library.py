"""torch.library's internals: trivial fakes, effectful ops, and where an operator was registered."""

from __future__ import annotations

from typing import Any

import torch


# -- custom ops without a fake (graphex/custom_ops/checks.py) --------------------------------------------------------

def trivial_fake(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """(True, result) when torch can fake `op` without a registered fake, as its own custom_op does.

    torch <= 2.12: only a mutating op that returns nothing (its fake returns None). 2.13 added
    out= and in-place ops (`generate_trivial_fake_impl`)."""
    from torch._library import utils

    if not utils.can_generate_trivial_fake_impl(op):
        return False, None
    generate = getattr(utils, "generate_trivial_fake_impl", None)
    return True, (generate(op, *args, **kwargs) if generate is not None else None)


# -- effectful custom ops (graphex.save_tensor) ----------------------------------------------------

def register_ordered_effect(op: Any) -> None:
    """Mark `op` as having an ordered side effect: AOTAutograd wraps it in `with_effects` (threading a
    token), so it is neither dead-code eliminated nor reordered. torch 2.11-2.13 name the enum
    `_EffectType`; later versions also export `EffectType` (torch._library.effects)."""
    from torch._higher_order_ops import effects

    kinds = getattr(effects, "EffectType", None) or effects._EffectType
    effects._register_effectful_op(op, kinds.ORDERED)


# -- where an operator's schema and kernels were registered (graphex.export's deployability check) --

def operator_registrations(qualname: str) -> dict[str, str] | None:
    """For operator "ns::name" (or "ns::name.overload"): {"schema": file, dispatch key: file, ...} giving
    the file each registration came from (a .py file: registered from Python), or None if the operator
    is unknown. Read from the dispatcher's dump (torch._C._dispatch_dump, text stable since 2.0:
    "debug: registered at FILE:LINE" and "KEY: registered at FILE:LINE :: ...")."""
    try:
        text = torch._C._dispatch_dump(qualname)
    except RuntimeError:
        return None
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(": registered at ")
        if not sep:
            continue
        where = rest.split(" :: ", 1)[0].strip()
        out["schema" if key == "debug" else key.removesuffix("[alias]")] = where.rsplit(":", 1)[0]
    return out
