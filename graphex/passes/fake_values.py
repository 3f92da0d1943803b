"""Refreshing the fake values a pass invalidates, re-running only what the change can reach.

Note [A pass refreshes only the fake values its change reaches]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The passes after a rewrite (no-op removal, reinplacing's canonical scatters, an index read as a view) read each
node's fake value: its sizes, strides and dtype, and its storage, which says what memory it shares (reinplacing's
alias analysis). inductor's FakeTensorUpdater re-runs a changed node and then every user of any node whose new value
is on another storage; a node that makes new memory always is, so one removed no-op near the top of a decoder re-ran
317 of its 450 nodes (0.15-0.18 s of a 3.3 s first call of Llama's step, in a fresh process; reinplacing's refresh
on the shipped decoder re-ran 298 nodes, 0.20 s). Most of that work cannot change anything: what matters downstream
is which nodes share memory, not which fake storage object stands for it.

So `FakeValues` re-runs, in graph order, the nodes a pass changed (another target or other arguments, or new) and
then only the users of a node whose value changed in a way the users can see:
  * a value of other sizes, strides, storage offset, dtype, device or layout: its users are re-run;
  * a value that shares memory with one of the node's inputs (a view; an in-place op) or did before (its old
    storage was an input's, or a value this refresh replaced): it is taken, and its users are re-run;
  * otherwise the node makes new memory, before and after, of the same shape, and it made the old value's storage
    (no node before it holds that storage): its old value stays, so the nodes that view it keep the storage they
    share with it, and its users are not re-run.
Keeping the old value is what a full re-propagation would give up to which fake storage stands for which memory.
`tests/python/test_fake_values.py` checks exactly that against a fresh propagation of the whole graph (the same
sizes, strides, offsets and dtypes; the same nodes sharing memory) on the fuzzer's programs and on decoders.

A graph this does not cover takes inductor's updater as before: one with subgraphs (a higher-order op's), or with
unbacked symbols (whose bindings inductor's updater rebinds).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._inductor.fx_utils import get_storage
from torch.utils import _pytree as pytree


class FakeValues:
    """Made before a pass changes `gm`; `incremental_update()` after it refreshes the fake values the change reaches
    (Note [A pass refreshes only the fake values its change reaches]); returns how many nodes took a new value."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        # each node's target, args, kwargs and value as objects: FX makes new args/kwargs tuples when a pass changes
        # them, and holding the old ones keeps any id from being reused while we compare
        self.before = {n: (n.target, n.args, n.kwargs, n.meta.get("val")) for n in gm.graph.nodes}

    def incremental_update(self) -> int:
        from torch._dispatch.python import enable_python_dispatcher
        from torch._inductor.fx_utils import get_fake_args_kwargs
        from torch._inductor.virtualized import V

        replaced: set[int] = set()  # storages of values this refresh replaced: a value that shared one is stale
        owner: dict[int, torch.fx.Node] = {}  # each storage's first holder, in graph order: the node that made it
        for node in self.gm.graph.nodes:
            for storage in _storages(node.meta.get("val")):
                owner.setdefault(storage, node)
        to_run: set[torch.fx.Node] = set()
        updated = 0
        for node in self.gm.graph.nodes:
            old = self.before.get(node)
            val = node.meta.get("val")
            if old is not None and old[3] is not val:  # a pass set this value itself: its users are re-run
                to_run.update(node.users)
            changed = old is None or old[0] is not node.target or old[1] is not node.args or old[2] is not node.kwargs
            if not (changed or node in to_run) or node.op != "call_function" or not callable(node.target) \
                    or hasattr(node.target, "_inductor_lowering_function"):
                continue
            valid, args, kwargs = get_fake_args_kwargs(node)  # (node, gm) only from torch 2.13: no subgraphs here
            if not valid:
                continue
            with V.fake_mode, enable_python_dispatcher():
                new = node.target(*args, **kwargs)
            inputs = _storages((args, kwargs))
            if "val" in node.meta and all(owner.get(s) is node for s in _storages(val)) \
                    and _same_new_memory(new, val, inputs, replaced):
                continue  # new memory before and after, the same layout: the old value stands for it
            replaced |= _storages(val)
            node.meta["val"] = new
            updated += 1
            to_run.update(node.users)
        return updated


def _leaves(value: Any) -> list[Any]:
    return pytree.tree_leaves(value)


def _storages(value: Any) -> set[int]:
    return {get_storage(t) for t in _leaves(value) if isinstance(t, torch.Tensor) and torch._C._has_storage(t)}


def _same_new_memory(new: Any, old: Any, inputs: set[int], replaced: set[int]) -> bool:
    """Both values are new memory (no storage of the node's inputs, nor one this refresh replaced) with the same
    layout, leaf for leaf; anything else (a symbolic size, a Python value that differs) is not."""
    new_leaves, old_leaves = _leaves(new), _leaves(old)
    if type(new) is not type(old) or len(new_leaves) != len(old_leaves):
        return False
    for a, b in zip(new_leaves, old_leaves):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return False
        if not isinstance(a, torch.Tensor):
            if isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool) or type(a) is not type(b) or a != b:
                return False
            continue
        if not (torch._C._has_storage(a) and torch._C._has_storage(b)):
            return False
        sa, sb = get_storage(a), get_storage(b)
        if sa in inputs or sb in inputs or sb in replaced:
            return False
        if (a.dtype, a.device, a.layout) != (b.dtype, b.device, b.layout) or not _known_equal(a.shape, b.shape) \
                or not _known_equal(a.stride(), b.stride()) or not _known_equal(a.storage_offset(), b.storage_offset()):
            return False
    return True


def _known_equal(a: Any, b: Any) -> bool:
    """Equal for every value of the shape symbols (a symbolic size that may differ counts as different)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

    return statically_known_true(sym_eq(a, b))


def refresher(gm: torch.fx.GraphModule) -> Any:
    """The fake-value refresh for a pass over `gm`: ours (Note [A pass refreshes only the fake values its change
    reaches]), or inductor's FakeTensorUpdater where the graph has subgraphs or unbacked symbols."""
    from .. import compat

    if _has_subgraphs(gm) or _has_unbacked_symbols(gm):
        return compat.fake_tensor_updater(gm)
    return FakeValues(gm)


def _has_subgraphs(gm: torch.fx.GraphModule) -> bool:
    return any(isinstance(m, torch.fx.GraphModule) for m in gm.children())


def _has_unbacked_symbols(gm: torch.fx.GraphModule) -> bool:
    return any("unbacked_bindings" in n.meta for n in gm.graph.nodes)
