"""Reinplacing: functional ops go back to writing in place, and we say where we could not.

Note [In-place means in place]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
AOTAutograd functionalizes the graph: `cache.index_copy_(0, pos, v)` on a graph
input becomes `new = index_copy(cache, ...)` plus a `copy_(cache, new)` epilogue,
and a mutable custom op becomes `auto_functionalized(_v2)(op, ...)`, which clones
every mutated argument. Replayed like that, each step would copy the whole cache.

This pass proves per op that nothing reads the old value afterwards and then
rewrites it to the in-place form, drops the epilogue copy, and marks which
auto_functionalized arguments still need a clone (decompose_auto_functionalized,
inductor's, then makes those clones). The ops and their in-place forms are
inductor's table (graphex/compat/inductor.py); copy-backs of every other op with an
in-place twin are folded by copy_back.py. Where a copy is kept, the decision says
which later node reads the old value (GRAPHEX_LOG=1, `graphex triage`).

Note [Reinplacing decides and records in one place]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
`_Reinplacer.decide` is the one decision: for a node and a tensor it writes, None
(write it in place) or the `Why` it may not, made and recorded at that point:
  * the options: `input_inplace_pass=False` declines every write into (a view of)
    a graph input, `inplace_pass=False` every write into an intermediate (npugraph_ex's
    switches; nothing in the graph is hidden or rewritten to steer the decision);
  * a graph input is written in place only where the graph copies the new value back
    into it (the caller's tensor is declared mutated), and a view of one only where
    that copy-back is this op's result in the same layout; where the copy-back is of
    another value, the op's result must be read before it (Note [A result written into
    an input is read before the input's copy-back]);
  * no node after the op (before the copy-back, which overwrites the old value anyway)
    may read memory the written tensor may share: the first such node is the reader
    the record names; ops that read only metadata do not count;
  * the written tensor must not overlap itself (Note [Never reinplace into overlapping
    memory]) and a scatter's source must not be its own memory (Note [A scatter is not
    reinplaced onto its own source]).
The rules are inductor's reinplacing pass's (torch 2.13, `reinplace_inplaceable_ops_core`:
same storage map, overlap filter, copy-back maps and replacement order), written here
so that the decision carries its reason and is the same on every torch graphex supports.
KeptCopy records (kept_copies.py) are built from those decisions; copy_back.py's Declined from its own.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
from collections import defaultdict
from typing import Any, Iterable

import torch
import torch.fx
from torch._inductor.fx_passes.post_grad import decompose_auto_functionalized
from torch._inductor.fx_utils import get_node_storage
from torch._inductor.virtualized import V

from ..base.source import display_name
from ..compat import around_reinplacing, inplaceable_ops_table, is_foreach_entry, may_overlap
from .aliasing import (META_ONLY_OPS, is_view_op, op_name, reaches_output, resolve_inplace, returns_input, same_layout,
                       view_base)
from .copy_back import fold_copy_backs
from .fake_values import refresher
from .kept_copies import Declined, KeptCopy, Why, input_copies, kept_copy, read_later

aten = torch.ops.aten
_AUTO_FUNCTIONALIZED = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)
_HELD = ("placeholder", "get_attr")  # graph inputs (get_attr: a module's tensor, as AOTInductor unlifts them)


@dataclasses.dataclass(frozen=True)
class Reinplaced:
    """What reinplacing decided: the copies the replay still makes (with reasons), and the writes it made in place
    per in-place op (`{"aten::index_put_": 2, "mylib::update_": 1}`)."""

    kept: list[KeptCopy]
    in_place: dict[str, int]


def reinplace_graph(gm: torch.fx.GraphModule, fake_mode: object, *, intermediates: bool, inputs: bool) -> Reinplaced:
    """Reinplace functional ops of `gm` in place; returns what was decided (Note [Reinplacing decides and records in
    one place])."""
    graph = gm.graph
    with V.set_fake_mode(fake_mode):
        reinplacer = _Reinplacer(inplaceable_ops_table(), intermediates=intermediates, inputs=inputs)
        around_reinplacing(refresher(gm), graph, reinplacer.run)
        decompose_auto_functionalized(graph)
    _remove_self_copies(graph)
    folded = fold_copy_backs(graph, inputs=inputs, intermediates=intermediates, in_place=reinplacer.in_place)
    graph.eliminate_dead_code()
    kept = [kept_copy(d.what, d.node, d.why) for d in reinplacer.declined if d.node.target in _AUTO_FUNCTIONALIZED]
    kept += input_copies(graph, reinplacer.declined, folded, intermediates=intermediates, inputs=inputs)
    gm.recompile()
    return Reinplaced(kept, dict(reinplacer.in_place))


class _Reinplacer:
    """One walk over the graph: each functional op of the table, and each auto_functionalized call, is decided
    (`decide`) and, where it may, rewritten in place; every decline is recorded in `declined`."""

    def __init__(self, table: dict[Any, Any], *, intermediates: bool, inputs: bool) -> None:
        self.table = table
        self.intermediates = intermediates
        self.inputs = inputs
        self.declined: list[Declined] = []
        self.in_place: collections.Counter[str] = collections.Counter()

    # -- the maps the decisions read (inductor's, built once per graph) ---------------------------------------

    def _index(self, graph: torch.fx.Graph) -> None:
        self.order: dict[torch.fx.Node, int] = {}
        self.by_storage: dict[Any, list[torch.fx.Node]] = defaultdict(list)
        self.copy_into: dict[torch.fx.Node, torch.fx.Node] = {}  # graph input -> its first copy-back
        self.copy_of: dict[tuple[Any, torch.fx.Node], torch.fx.Node] = {}  # (input, source) -> that copy-back
        self.copy_via_view: dict[tuple[Any, torch.fx.Node], torch.fx.Node] = {}  # (view of input, op) -> copy-back
        self.replace: dict[torch.fx.Node, Any] = {}
        for i, node in enumerate(graph.nodes):
            self.order[node] = i
            self.by_storage[get_node_storage(node)].append(node)
            if not (node.target is aten.copy_.default and isinstance(node.args[0], torch.fx.Node)
                    and node.args[0].op in _HELD and isinstance(node.args[1], torch.fx.Node)):
                continue
            dst, src = node.args[0], node.args[1]
            if (src.target is operator.getitem and isinstance(src.args[0], torch.fx.Node)
                    and (src.args[0].target is torch.ops.higher_order.auto_functionalized
                         or is_foreach_entry(src.args[0].target))):
                src = src.args[0]
            self.copy_of.setdefault((dst, src), node)
            self.copy_into.setdefault(dst, node)
            src_base = _view_chain_base(src)
            entry = self.table.get(src_base.target) if src_base is not src and src_base.op == "call_function" else None
            for i_arg in (entry.mutated_args if entry is not None else ()):
                mutated = src_base.args[i_arg]
                if (isinstance(mutated, torch.fx.Node) and _view_chain_base(mutated) is dst
                        and _layout_preserving_copy_back(dst, src, mutated, src_base)):
                    self.copy_via_view.setdefault((mutated, src_base), node)

    # -- the decision --------------------------------------------------------------------------------------------

    def decide(self, node: torch.fx.Node, arg: Any) -> Why | None:
        """None if `node` may write `arg` in place, else why not (Note [Reinplacing decides and records in one
        place])."""
        if isinstance(arg, (list, tuple)):
            if len({get_node_storage(a) for a in arg}) != len(arg):
                return Why("two of the tensors it writes share memory", "unproven")
            return next((w for a in arg if (w := self.decide(node, a)) is not None), None)
        storage = get_node_storage(arg) if isinstance(arg, torch.fx.Node) else None
        if storage is None:
            return Why("the aliasing analysis could not follow the tensor it writes", "unproven")
        of_input = any(n.op in _HELD for n in self.by_storage[storage])
        if of_input and not self.inputs:
            return Why("option input_inplace_pass=False", "option", option="input_inplace_pass")
        if not of_input and not self.intermediates:
            return Why("option inplace_pass=False", "option", option="inplace_pass")
        views = [v for v in self.by_storage[storage] if may_overlap(arg.meta["val"], v.meta["val"])]
        if arg.op in _HELD:
            copy_node = self.copy_into.get(arg)
            if copy_node is None:
                return Why("the graph must leave that input unchanged (the caller's tensor is not declared "
                            "mutated)", "not-declared")
            if _copied_from(copy_node) is not node and self._result_read_from(node, copy_node):
                # Note [A result written into an input is read before the input's copy-back]
                return Why("in place its result would be that input, which the graph's copy-back of another value "
                           "overwrites before the result is read", "read-after-copy-back")
            written = arg
        elif any(v.op in _HELD for v in views):
            copy_node = self.copy_via_view.get((arg, node))
            if copy_node is None or not _layout_preserving_copy_back(copy_node.args[0], copy_node.args[1], arg, node):
                return Why("it writes a view of a graph input whose new value is not this op's result written back "
                            "in the same layout", "unproven")
            written = copy_node.args[0]
        else:
            copy_node, written = None, arg
            if _returned(node) and view_base(arg) is not None and returns_input(arg) is None:
                return Why("its result is returned, and in place it would be a view of a larger tensor where eager "
                           "returns new memory", "returned-view")  # Note [A returned result is not made a view]
        reader = self._reader_after(node, views, copy_node=copy_node, written=written)
        return read_later(reader) if reader is not None else None

    def _result_read_from(self, node: torch.fx.Node, copy_node: torch.fx.Node) -> bool:
        """Whether `node`'s result, or a view of it, is read at or after `copy_node` (the graph's output included).

        Note [A result written into an input is read before the input's copy-back]
        Written in place into a graph input, an op's result is the input's memory. The input's copy-back (the
        caller's mutation, `a.mul_(2)` after `r = a.index_put(...)`) then overwrites it: where the copy-back is of
        another value, the result must be read before it, or the reader gets the input's new value (the fuzzer's
        seed 3496 returned `a * 2` for the index_put). Inductor's rule looks only at readers of the input's old
        value; this is the one for the result."""
        return reaches_output(node, _view_of, read_by=lambda user: self.order[user] >= self.order[copy_node])

    def _reader_after(self, node: torch.fx.Node, views: list[torch.fx.Node], *, copy_node: torch.fx.Node | None,
                      written: torch.fx.Node) -> torch.fx.Node | None:
        """The first node after `node` (and before the copy-back `copy_node`) that reads one of `views`."""
        start = self.order[node]
        stop = self.order[copy_node] if copy_node is not None else None
        first: torch.fx.Node | None = None
        for view in views:
            for user in view.users:
                at = self.order[user]
                if at <= start or (stop is not None and stop <= at) or _reads_only_metadata(user):
                    continue
                if user.target is aten.copy_.default and user.args[0] is written:
                    continue  # it overwrites the value anyway
                if first is None or at < self.order[first]:
                    first = user
        return first

    def _own_checks(self, node: torch.fx.Node, entry: Any) -> Why | None:
        """The checks past the alias analysis, for an op of the table (each with its Note)."""
        for i in entry.mutated_args:
            arg = node.args[i] if i < len(node.args) else None
            for a in (arg if isinstance(arg, (list, tuple)) else [arg]):
                val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                if isinstance(val, torch.Tensor) and _may_overlap_itself(val):
                    return Why("the tensor it writes has elements that share memory (an expanded view), so writing "
                                "one would change the others", "overlaps-itself")
        if node.target is _generalized_scatter() and not _scatter_source_is_elsewhere(node):
            return Why("the update reads the memory it overwrites, so it is written into a fresh copy",
                        "own-source")
        if not entry.extra_check(node):
            return Why("inductor's check for this op declined it", "unproven")
        return None

    # -- the walk ------------------------------------------------------------------------------------------------

    def run(self, graph: torch.fx.Graph) -> None:
        self._index(graph)
        for node in list(graph.nodes):
            if node.op != "call_function":
                continue
            entry = self.table.get(node.target)
            if entry is not None:
                self._table_op(node, entry)
            elif node.target is torch.ops.higher_order.auto_functionalized_v2:
                op = node.args[0]
                if isinstance(op, torch._ops.OpOverload) and _is_out(op):
                    node.meta["only_clone_these_tensors"] = []  # out= arguments are written, never read
                    continue
                bases = node.kwargs["_all_bases"]
                node.meta["only_clone_these_tensors"] = self._clones(
                    node, range(len(bases)), dict(enumerate(bases)), v2=True,
                    what=lambda i: f"the tensor {op} mutates ({display_name(bases[i])})")
            elif node.target is torch.ops.higher_order.auto_functionalized:
                from torch._higher_order_ops.auto_functionalize import get_mutable_args

                op = node.args[0]
                names = [name for name in get_mutable_args(op)[0] if node.kwargs.get(name) is not None]
                node.meta["only_clone_these_tensors"] = self._clones(
                    node, names, node.kwargs, v2=False,
                    what=lambda name: f"argument '{name}' of {op} ({display_name(node.kwargs[name])})")
        for node, replacement in self.replace.items():
            while replacement in self.replace:
                replacement = self.replace[replacement]
            self.replace[node] = replacement
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)

    def _table_op(self, node: torch.fx.Node, entry: Any) -> None:
        mutated = [node.args[i] for i in entry.mutated_args]
        if is_foreach_entry(node.target):
            # inductor's rule for foreach ops: each list item must be a graph input with a copy-back of this op
            if not all((a, node) in self.copy_of for a in mutated[0]):
                return
            mutated = mutated[0]
            why = self.decide(node, list(mutated))
        else:
            why = next((w for a in mutated if (w := self.decide(node, a)) is not None), None) or self._own_checks(
                node, entry)
        if why is not None:
            for a in mutated:
                if isinstance(a, torch.fx.Node):
                    self.declined.append(Declined(node, a, f"{display_name(a)} (written by {op_name(node.target, overload=True)})", why))
            return
        for a in mutated:
            copy_node = self._copy_back_of(node, a)
            if copy_node is not None:
                self.replace[copy_node] = copy_node.args[0]
        if is_foreach_entry(node.target):
            # the in-place foreach op returns nothing: each item read from its result is the list item it wrote
            # (a read of the parameter after `torch._foreach_mul_([p], 0.5)`; a helper's find: the getitem was left
            # on a call that returns nothing, and the program failed to build)
            for user in list(node.users):
                if user.target is operator.getitem:
                    self.replace[user] = mutated[user.args[1]]
        node.target = entry.inplace_op
        self.in_place[op_name(entry.inplace_op)] += 1

    def _clones(self, node: torch.fx.Node, keys: Iterable[Any], tensors: Any, *, v2: bool, what: Any) -> list[Any]:
        """The mutated tensors of an auto_functionalized call that still need a clone (inductor's
        reinplace_and_refine_tensors_to_clone, each clone's reason recorded)."""
        clones: list[Any] = []
        written_storages: set[Any] = set()
        for key in keys:
            arg = tensors[key]
            items = arg if isinstance(arg, (list, tuple)) else [arg]
            if any(get_node_storage(a) in written_storages for a in items):
                why: Why | None = Why("another tensor the same call writes in place shares its memory", "unproven")
            else:
                why = self.decide(node, arg)
            if why is not None:
                clones.append(key)
                if isinstance(arg, torch.fx.Node):
                    self.declined.append(Declined(node, arg, what(key), why))
                continue
            copy_node = self._copy_back_of(node, arg)
            if copy_node is not None:
                self.replace[copy_node] = copy_node.args[0]
            self.in_place[op_name(node.args[0])] += 1
            if not v2:
                for user in node.users:
                    if user.target is operator.getitem and user.args[1] == key:
                        self.replace[user] = arg
            written_storages.update(get_node_storage(a) for a in items)
        return clones

    def _copy_back_of(self, node: torch.fx.Node, arg: Any) -> torch.fx.Node | None:
        copy_node = self.copy_of.get((arg, node))
        if copy_node is None:
            copy_node = self.copy_via_view.get((arg, node))
            if copy_node is not None and not _layout_preserving_copy_back(copy_node.args[0], copy_node.args[1],
                                                                          arg, node):
                return None
        return copy_node


def _returned(node: torch.fx.Node) -> bool:
    """Whether the graph returns `node`'s value itself.

    Note [A returned result is not made a view]
    Written in place, a functional op's result becomes the tensor it writes. Where that is a view of an
    intermediate (`h[:, :4].diagonal_scatter(...)`, h new memory) and the graph returns the result, the caller
    would get a view of all of h, with a `_base`, where eager's result is new memory of its own; so such a write
    keeps its copy (found by comparing what each output aliases with eager, sweeps/compare.aliasing). The same
    holds where the graph returns a view of the result (`...diagonal_scatter(...).t()`: eager's `_base` is the
    scatter's result, found by a helper), so views of it are followed to the output too.
    """
    return reaches_output(node, _view_of)


def _view_of(user: torch.fx.Node) -> torch.fx.Node | None:
    """The value `user` is a view (or an item of a list) of, else None."""
    if user.op == "call_function" and (is_view_op(user.target) or user.target is operator.getitem) and user.args:
        return user.args[0] if isinstance(user.args[0], torch.fx.Node) else None
    return None


def _copied_from(copy_node: torch.fx.Node) -> Any:
    """The node whose result a copy-back writes (through the items of a multi-output op's result)."""
    src = copy_node.args[1]
    while isinstance(src, torch.fx.Node) and src.target is operator.getitem:
        src = src.args[0]
    return src


def _view_chain_base(node: torch.fx.Node) -> torch.fx.Node:
    """Through view ops to the node they view (inductor's `_get_view_base`)."""
    while is_view_op(node.target) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _layout_preserving_copy_back(dst: Any, src: Any, mutated: torch.fx.Node, src_base: torch.fx.Node) -> bool:
    """The copy-back `copy_(dst, src)` writes `src_base`'s result into `dst` exactly where `mutated` lies: same
    sizes, strides and offsets on both sides (inductor's `_is_layout_preserving_view_copy_back`)."""
    return (isinstance(dst, torch.fx.Node) and isinstance(src, torch.fx.Node)
            and _same_layout(src_base, mutated) and _same_layout(src, dst))


def _same_layout(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    x, y = a.meta.get("val"), b.meta.get("val")
    return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and same_layout(x, y)


def _reads_only_metadata(node: torch.fx.Node) -> bool:
    if is_view_op(node.target):
        return all(_reads_only_metadata(u) for u in node.users)
    return node.target in META_ONLY_OPS


def _is_out(op: torch._ops.OpOverload) -> bool:
    from torch._library import utils

    return bool(getattr(utils, "is_out", lambda _op: False)(op))


def _generalized_scatter() -> Any:
    from torch._inductor.fx_passes.reinplace import _generalized_scatter as scatter

    return scatter


def _scatter_source_is_elsewhere(node: torch.fx.Node) -> bool:
    """Note [A scatter is not reinplaced onto its own source]
    `x[1:] = x[:-1].clone()` reaches us as `_generalized_scatter(x, clone(x[:-1]), [slice 1:])`, and no-op
    removal drops the clone (its value equals its input's). Reinplaced, the scatter becomes
    `x[1:].copy_(x[:-1])`: a copy that reads what it is overwriting (ATen refuses it when it can see the
    overlap, and is wrong where it cannot). So a scatter whose source is a view of its own base stays
    functional: it writes into a fresh copy of the base. torch 2.15 added the same test to inductor's own
    `should_reinplace_scatter`, which graphex does not use (graphex/compat/inductor.py), so it is ours for every
    version.
    """
    inp, src = node.args[0], node.args[1]
    if isinstance(inp, torch.fx.Node) and isinstance(src, torch.fx.Node):
        inp_storage = get_node_storage(inp)
        if inp_storage is not None and inp_storage == get_node_storage(src):
            return False
    return True


def _may_overlap_itself(t: torch.Tensor) -> bool:
    """Note [Never reinplace into overlapping memory]
    A functional op on a tensor whose elements share memory (`y = x.expand(2, n)`; `y.index_put(...)`)
    first clones it into distinct elements, then writes some of them. Its in-place form would write the
    shared memory, changing every element that aliases the written one (found by the fuzzer: seed 1328,
    `cat` + `expand` + `index_put`). So a written tensor must have memory of its own per element: true unless
    the sizes and strides prove it (sorted by stride, each dim must step past everything the smaller ones reach).
    Symbolic sizes or strides: only a known stride 0 on a dim not known to be 1 counts as overlapping.
    """
    dims = []
    for size, stride in zip(t.shape, t.stride()):
        size_i = size if isinstance(size, int) else size.node.maybe_as_int()
        stride_i = stride if isinstance(stride, int) else stride.node.maybe_as_int()
        if size_i == 0:
            return False  # no elements
        if size_i == 1:
            continue
        if stride_i == 0:
            return True
        if size_i is None or stride_i is None:
            return False  # symbolic: a view other than expand; assume distinct (as before)
        dims.append((abs(stride_i), size_i))
    reach = 0
    for stride, size in sorted(dims):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _remove_self_copies(graph: torch.fx.Graph) -> None:
    """Drop `copy_(x, y)` where y is x itself after reinplacing (a no-op left by the pass)."""
    for node in list(graph.find_nodes(op="call_function", target=aten.copy_.default)):
        dst, src = node.args[0], node.args[1]
        if isinstance(src, torch.fx.Node) and resolve_inplace(src) is resolve_inplace(dst):  # type: ignore[arg-type]
            node.replace_all_uses_with(dst)  # type: ignore[arg-type]
            graph.erase_node(node)


