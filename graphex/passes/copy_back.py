"""Fold "functional op, then copy_ the result back" into the op's in-place variant.

Functionalization turns `cache[i].index_copy_(2, pos, k)` into

    v   = select(cache, 0, i)
    new = index_copy(v, 2, pos, k)         # a full copy of the cache layer
    copy_(select(cache, 0, i), new)        # and a full copy back

Inductor's reinplacing covers index_put, scatters and auto_functionalized ops but
not every op with an in-place twin. This pass handles the rest generically: when
`copy_(dst, f(base, ...))` writes back into the very memory `base` names (views of
the same root tensor with the same sizes, strides and offset), `f` has an in-place variant `f_` with the
same schema, the result has base's shape and dtype, and nothing reads or writes
that storage between `f` and the `copy_`, then `f(base, ...)` becomes
`f_(base, ...)` and the `copy_` disappears (Note [In-place means in place]).
"""

from __future__ import annotations

import collections
import dataclasses

import torch
import torch.fx
from torch.fx.passes.reinplace import _maybe_get_inplace_op

from .aliasing import first_toucher_between, op_name, resolve_inplace, root, same_layout

aten = torch.ops.aten


@dataclasses.dataclass
class Declined:
    """A copy-back left in the graph, and the decision that left it (explained by reinplace.py)."""

    copy_node: torch.fx.Node
    cause: str  # "option" | "read-later" | "replaced" | "unproven"
    reader: torch.fx.Node | None = None  # for "read-later": who touches the old value in between
    option: str = ""


def fold_copy_backs(graph: torch.fx.Graph, *, inputs: bool = True, intermediates: bool = True,
                    in_place: collections.Counter[str] | None = None) -> list[Declined]:
    """Rewrite every foldable copy-back in `graph`; returns the ones left, with why. Each op made in place is
    counted in `in_place` (by its in-place op's name).

    `inputs` / `intermediates` say whether copy-backs into graph inputs (and views of
    them) / into intermediate tensors may be folded (options input_inplace_pass / inplace_pass).
    """
    declined: list[Declined] = []
    for copy_node in list(graph.find_nodes(op="call_function", target=aten.copy_.default)):
        dst, written = copy_node.args[0], copy_node.args[1]
        if not (isinstance(dst, torch.fx.Node) and isinstance(written, torch.fx.Node)):
            continue
        if copy_node.kwargs.get("non_blocking") or (len(copy_node.args) > 2 and copy_node.args[2]):
            continue
        # `written` may be the end of a chain of in-place ops on the functional result
        # (index_copy, then index_put_ on it): fold the functional op at its start.
        src = resolve_inplace(written)
        inplace = _maybe_get_inplace_op(src.target) if src.op == "call_function" else None
        into_input = root(dst).op == "placeholder"
        if (into_input and not inputs) or (not into_input and not intermediates):
            option = "input_inplace_pass" if into_input else "inplace_pass"
            declined.append(Declined(copy_node, "option", option=option))
            continue
        if inplace is None or not src.args or not isinstance(src.args[0], torch.fx.Node):
            declined.append(Declined(copy_node, "replaced"))
            continue
        chain = _functional_chain(src, dst)  # [src, ..., the op that reads base first]
        base = chain[-1].args[0]
        if not (isinstance(base, torch.fx.Node) and _same_memory(base, dst)
                and all(_same_meta(n, dst) for n in chain) and _no_internal_overlap(base)
                and not any(_reads_root(n, root(base)) for n in chain[:-1])):
            reader = _reader_cutting_the_chain(chain[-1], dst)
            declined.append(Declined(copy_node, "read-later", reader=reader) if reader is not None
                            else Declined(copy_node, "unproven"))
            continue
        if len(src.users) > 1 and not _same_strides(src, dst):
            # Note [Folding keeps the layout readers saw]: the functional result's readers were traced
            # with its strides (a later reshape is a view only for those); in place, they would see dst's.
            declined.append(Declined(copy_node, "unproven"))
            continue
        # Readers of the functional result read the same values once it lives in `base`;
        # what must not exist is a reader (or writer) of base's old value in between.
        reader = first_toucher_between(root(base), chain[-1], copy_node, ignore=frozenset(chain))
        if reader is not None:
            declined.append(Declined(copy_node, "read-later", reader=reader))
            continue
        for node in chain:
            node.target = _maybe_get_inplace_op(node.target)
            if in_place is not None:
                in_place[op_name(node.target)] += 1
        copy_node.replace_all_uses_with(dst)
        graph.erase_node(copy_node)
    return declined


def _functional_chain(src: torch.fx.Node, dst: torch.fx.Node) -> list[torch.fx.Node]:
    """`src` and the functional ops feeding its first argument, each used only by the next:
    `cache.mul_(a).add_(x)` becomes add(mul(cache, a), x) then copy_(cache, ...): chain [add, mul].
    Each has an in-place twin and dst's shape and dtype, so the whole chain can write dst's memory."""
    chain = [src]
    node = src
    while node.args and isinstance(node.args[0], torch.fx.Node):
        prev = node.args[0]
        if (prev.op != "call_function" or len(prev.users) != 1 or _maybe_get_inplace_op(prev.target) is None
                or not prev.args or not isinstance(prev.args[0], torch.fx.Node) or not _same_meta(prev, dst)
                or _same_memory(prev, dst)):
            break
        chain.append(prev)
        node = prev
    return chain


def _reader_cutting_the_chain(last: torch.fx.Node, dst: torch.fx.Node) -> torch.fx.Node | None:
    """Where the chain stops at a functional op that would join it but for another reader of its value (the op
    writes into dst's own memory, has an in-place twin and dst's meta): the first such reader after the chain's
    last op, which in place would read what the chain writes over that value; None if there is none."""
    prev = last.args[0] if last.args else None
    if not (isinstance(prev, torch.fx.Node) and prev.op == "call_function" and len(prev.users) > 1
            and _maybe_get_inplace_op(prev.target) is not None and prev.args and isinstance(prev.args[0], torch.fx.Node)
            and _same_meta(prev, dst) and _same_memory(prev.args[0], dst)):
        return None
    order = {n: i for i, n in enumerate(last.graph.nodes)}
    later = [u for u in prev.users if u is not last and order[u] > order[last]]
    return min(later, key=order.__getitem__) if later else None


def _reads_root(node: torch.fx.Node, base_root: torch.fx.Node) -> bool:
    """A later op of the chain must not read the memory it writes through another argument
    (`cache * 0.5 + cache`: once the first op writes in place, the second would read the new value)."""
    others: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args[1:], node.kwargs), others.append)
    return any(root(a) is base_root for a in others)


def _val(node: torch.fx.Node) -> torch.Tensor | None:
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None


def _same_memory(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Views of one root tensor with one layout. (The fake tensors' storages cannot be
    compared here: after reinplacing, a view's meta may still name the storage of the
    functional value it was taken from.)"""
    va, vb = _val(a), _val(b)
    if va is None or vb is None or root(a) is not root(b):
        return False
    return same_layout(va, vb)


def _same_meta(src: torch.fx.Node, dst: torch.fx.Node) -> bool:
    vs, vd = _val(src), _val(dst)
    return vs is not None and vd is not None and vs.dtype == vd.dtype and vs.shape == vd.shape


def _same_strides(src: torch.fx.Node, dst: torch.fx.Node) -> bool:
    """Note [Folding keeps the layout readers saw]
    Folding `new = op(x); copy_(x, new)` into `op_(x)` hands every reader of `new` the tensor x, with x's
    strides. A functional op may return another layout than its input (index_copy of a transposed input
    is contiguous), and readers were traced for that layout: `new.reshape(-1)` became `_unsafe_view` of it,
    which fails on x's strides (found by the fuzzer, seed 5272). So a result that is read must keep its
    strides for the fold to happen."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

    vs, vd = _val(src), _val(dst)
    return vs is not None and vd is not None and statically_known_true(sym_eq(vs.stride(), vd.stride()))


def _no_internal_overlap(node: torch.fx.Node) -> bool:
    v = _val(node)
    return v is not None and all(not (st == 0 and sz > 1) for sz, st in zip(v.shape, v.stride()))
