"""The one alias analysis graphex's passes share: which tensor a node names, and who reads it when.

Used by reinplace.py (which ops count as views and metadata-only reads; who reads an input's old value before a
copy-back no pass decided on), copy_back.py
(to decide whether a copy-back can be folded), lowering's fold.py (which values
an op of the graph writes, so none of them is folded), noop.py and fresh_outputs.py
(which outputs name whose memory), so a kept copy is explained by the same analysis
that kept it.

Note [One alias analysis]
~~~~~~~~~~~~~~~~~~~~~~~~~
A node names the memory of its `view_base` when it is a view (its first argument is
an alias the op does not write: `t`, `view`, `split`), the result of an in-place or
out= op (the argument it returns), or an item of a view op's list (`split(x)[1]`);
`root` follows those steps to the value that owns the memory. Anything else is new
memory. `allocation` follows more: also the ops whose result shares its argument's memory
without a schema that says so (`_unsafe_view`, `unsafe_split`, `unsafe_chunk`), for the
passes where missing one would be silently wrong (a copy replaced by a view, a folded value
an output shares). Where the analysis cannot see inside a call (a higher-order op, with_effects)
`written_nodes` assumes the call writes every tensor it is given: too many writes
only cost a fold or a removed copy, too few would be silently wrong.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.fx
from torch._inductor.fx_passes.reinplace import META_ONLY_OPS
from torch.fx.passes.reinplace import _is_view_op as is_view_op

__all__ = ["META_ONLY_OPS", "is_view_op", "op_name", "same_layout", "written_args", "returns_input", "resolve_inplace", "view_base", "root", "memory_argument", "allocation", "mark_memory", "reaches_output", "written_nodes",
           "reads_memory", "first_toucher_between"]


def op_name(target: object, *, overload: bool = False) -> str:
    """How graphex's records name an op: `aten::index_put_` (an OpOverload's schema name; with `overload`,
    `aten::index_put_.default`), else the callable's name."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}" if overload else target._schema.name
    return getattr(target, "__name__", str(target))


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, sizes, strides and storage offset, where the shape environment can prove it."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

    return (a.dtype == b.dtype and statically_known_true(sym_eq(a.shape, b.shape))
            and statically_known_true(sym_eq(a.stride(), b.stride()))
            and statically_known_true(sym_eq(a.storage_offset(), b.storage_offset())))


def written_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The tensors `node` may write: the arguments its schema marks written; for a call with no schema (a
    higher-order op) every tensor it is given (Note [One alias analysis])."""
    target = node.target
    if node.op != "call_function" or target is operator.getitem:
        return []
    if not isinstance(target, torch._ops.OpOverload):
        return list(node.all_input_nodes)
    written: list[torch.fx.Node] = []
    for position, arg in enumerate(target._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[position] if position < len(node.args) else node.kwargs.get(arg.name)
        written += [n for n in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(n, torch.fx.Node)]
    return written


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


def view_base(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node whose memory `node` names, one step (Note [One alias analysis]), else None."""
    if node.op != "call_function" or not node.args:
        return None
    first = node.args[0]
    if node.target is operator.getitem:
        is_item_of_view = isinstance(first, torch.fx.Node) and first.op == "call_function" and is_view_op(first.target)
        return first if is_item_of_view else None
    if isinstance(first, torch.fx.Node) and is_view_op(node.target):
        return first
    return returns_input(node)


def root(node: torch.fx.Node) -> torch.fx.Node:
    """The graph value whose memory `node` names: through views, items of views and in-place results."""
    while (base := view_base(node)) is not None:
        node = base
    return node


def memory_argument(node: torch.fx.Node) -> torch.fx.Node | None | bool:
    """The argument whose memory `node`'s result may be (a view of): for an in-place or out= op the argument it
    returns; for a view by schema, `_unsafe_view`, an `unsafe_` split or chunk (no alias annotation, views all the
    same), `alias` and an item of a list result, the first argument. None: new memory. True: a call the analysis
    cannot see into (it may return any of its arguments)."""
    if node.op != "call_function":
        return None
    first = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
    if node.target is operator.getitem:
        return first
    if not isinstance(node.target, torch._ops.OpOverload):
        return True
    returned = returns_input(node)
    if returned is not None:
        return returned
    schema = node.target._schema
    name = schema.name
    if any(r.alias_info is not None for r in schema.returns) or name.startswith(("aten::unsafe_", "aten::_unsafe_")) \
            or name == "aten::alias":
        return first if first is not None else True
    return None


def allocation(x: torch.fx.Node) -> torch.fx.Node:
    """The node whose memory `x` names, followed back through every op whose result may be its argument's memory
    (stricter than aliasing.root, which follows only what schemas declare); `x` itself when that is not known."""
    node = x
    while True:
        arg = memory_argument(node)
        if arg is None:
            return node
        if arg is True:
            return x if node is x else node  # a call that may return any argument: treated as not fresh below
        node = arg


def mark_memory(node: torch.fx.Node, marked: set[torch.fx.Node]) -> None:
    """Add `node` and every value whose memory it may be (memory_argument, followed back; a call the
    analysis cannot see into may be any of its arguments)."""
    todo = [node]
    while todo:
        value = todo.pop()
        if value in marked:
            continue
        marked.add(value)
        arg = memory_argument(value)
        if arg is True:
            todo += value.all_input_nodes
        elif arg is not None:
            todo.append(arg)


def reaches_output(start: torch.fx.Node, passes_on: Callable[[torch.fx.Node], torch.fx.Node | None],
                   skip: torch.fx.Node | None = None,
                   read_by: Callable[[torch.fx.Node], bool] = lambda user: False) -> bool:
    """Whether the graph returns `start`'s memory: `start` itself, or a user that passes its memory on
    (`passes_on(user)` is the value whose memory the user's result is: a view's base, ...), and so on, not through
    `skip`; or whether a user for which `read_by(user)` holds reads it on the way."""
    todo, seen = [start], set()
    while todo:
        value = todo.pop()
        if value in seen:
            continue
        seen.add(value)
        for user in value.users:
            if user is skip:
                continue
            if user.op == "output" or read_by(user):
                return True
            if passes_on(user) is value:
                todo.append(user)
    return False


def written_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Every node whose memory some op of the graph writes: a written argument, what it is a view of and every
    view of that; a call the analysis cannot see into writes every tensor it is given (Note [One alias analysis])."""
    written_roots = {root(n) for node in graph.nodes for n in written_args(node)}
    return {n for n in graph.nodes if root(n) in written_roots}


def reads_memory(node: torch.fx.Node) -> bool:
    """False for ops that only look at metadata (sizes, views): they never read a tensor's values."""
    return node.target not in META_ONLY_OPS and not is_view_op(node.target)


def first_toucher_between(base_root: torch.fx.Node, start: torch.fx.Node, stop: torch.fx.Node | None,
                          ignore: frozenset[torch.fx.Node] = frozenset()) -> torch.fx.Node | None:
    """The first node strictly after `start` (and before `stop`) that reads or writes `base_root`'s memory."""
    node = start.next
    while node is not stop and node.op != "root":
        if node not in ignore and reads_memory(node) and any(root(a) is base_root for a in node.all_input_nodes):
            return node
        node = node.next
    return None
