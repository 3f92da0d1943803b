"""Common subexpressions: an ATen call repeated with the same arguments is computed once.

Note [CSE keeps eager's values]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Models recompute the same value per layer (the decoder's `~mask` in every attention block,
the same `select` of a rotary table, the same `view`): the functional graph repeats the
call, and the replay would run it each time. A repeated call of a pure ATen operator with
the same arguments gives the same value, bit for bit, so its later copies are replaced by
the first. Only where that is certain:
- ATen / prims operators with no mutable argument, one tensor result, not random
  (`nondeterministic_seeded`) and not `empty*` (uninitialized memory is not a value); and `split.Tensor` (the views
  `chunk` writes, a list of them) with the `getitem`s of it, which are views too;
- both calls in the same mutation region (no in-place op of the graph between them, see
  torch._inductor.pattern_matcher.compute_mutation_region_ids, which AOTAutograd's own CSE uses);
- neither is a graph output or a view of one: outputs are distinct tensors in eager, and a
  caller may write one without changing the other;
- custom operators are never merged: they may have effects their schema does not declare;
- both calls on the same stream (Note [Side streams in a program]): a call on a side stream merged into one
  on the entry stream (or the reverse) would be read by a stream that never waited for it.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx
from torch._inductor.pattern_matcher import compute_mutation_region_ids
from torch.multiprocessing.reductions import StorageWeakRef

from ..lowering.streams import stream_of

aten = torch.ops.aten
_UNINITIALIZED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}


def eliminate_common_subexpressions(graph: torch.fx.Graph,
                                    only: Callable[[torch.fx.Node], bool] | None = None) -> int:
    """Note [CSE keeps eager's values]; `only`: merge only the calls it accepts (fused mode's cuts written twice,
    graphex/fusion/spellings.py). Returns how many calls were removed."""
    compute_mutation_region_ids(graph)  # type: ignore[arg-type]
    output_storages = {_storage(n) for n in graph.output_node().all_input_nodes} - {None}
    first: dict[Any, torch.fx.Node] = {}
    removed = 0
    for node in list(graph.nodes):
        if (only is not None and not only(node)) or not _mergeable(node) or _storage(node) in output_storages:
            continue
        try:
            key = (node.target, _key(node.args), _key(node.kwargs), node.meta["mutation_region_id"], stream_of(node))
            hash(key)
        except TypeError:
            continue
        earlier = first.get(key)
        if earlier is None:
            first[key] = node
            continue
        node.replace_all_uses_with(earlier)
        graph.erase_node(node)
        removed += 1
    for node in graph.nodes:
        node.meta.pop("mutation_region_id", None)
    return removed


def _mergeable(node: torch.fx.Node) -> bool:
    target = node.target
    if node.op == "call_function" and target is operator.getitem:  # a view out of a split's list
        return isinstance(node.args[0], torch.fx.Node) and node.args[0].target is aten.split.Tensor \
            and isinstance(node.meta.get("val"), torch.Tensor)
    if node.op == "call_function" and target is aten.split.Tensor:
        val = node.meta.get("val")
        return isinstance(val, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in val)
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if target.namespace not in ("aten", "prims") or target._schema.name.split("::")[-1] in _UNINITIALIZED:
        return False
    schema = target._schema
    if schema.is_mutable or len(schema.returns) != 1 or str(schema.returns[0].type) != "Tensor":
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return isinstance(node.meta.get("val"), torch.Tensor)


def _storage(node: torch.fx.Node) -> Any:
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)) and val:  # a split's views: their one storage
        val = val[0]
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return StorageWeakRef(val.untyped_storage())
    except (NotImplementedError, RuntimeError):
        return None


def _key(value: Any) -> Any:
    """A hashable stand-in for an argument: nodes by identity, numbers with their type (1 vs 1.0 vs True)."""
    if isinstance(value, torch.fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _key(v)) for k, v in value.items())))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", id(value.node))
    if isinstance(value, float):
        # by its bits: 0.0 == -0.0 (and they hash alike), so keyed by value `a / 0.0` and `a / -0.0` were one node,
        # the second computed as the first (+inf for -inf); nan != nan: two nan arguments are still one argument
        return (float, "nan" if value != value else value.hex())
    if isinstance(value, complex):
        return (complex, _key(value.real), _key(value.imag))
    return (type(value), value)
