"""Shape arithmetic the engine knows: `torch.sym_sum` as a chain of additions.

Note [sym_sum is a chain of adds]
With dynamic shapes, torch may add several sizes at once with `torch.sym_sum([s0, s1, ...])` (e.g. the
numel of an expanded slice passed to a custom op; found by the fuzzer, seed 4400). The engine's shape
expressions have a binary `add`, so the pass rewrites it as `((s0 + s1) + ...)`, which computes the
same int.
"""

from __future__ import annotations

import operator

import torch
import torch.fx


def expand_sym_sums(graph: torch.fx.Graph) -> None:
    for node in list(graph.find_nodes(op="call_function", target=torch.sym_sum)):
        terms = list(node.args[0]) if node.args else []
        if len(terms) < 2:
            continue  # 0 or 1 term: left as is (torch never emits these)
        with graph.inserting_before(node):
            total, value = terms[0], _val(terms[0])
            for term in terms[1:]:
                total = graph.call_function(operator.add, (total, term))
                total.meta.update({k: v for k, v in node.meta.items() if k != "val"})
                value = value + _val(term) if value is not None and _val(term) is not None else None
                total.meta["val"] = value
        total.meta["val"] = node.meta.get("val", value)
        node.replace_all_uses_with(total)
        graph.erase_node(node)


def _val(x: object) -> object:
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x
