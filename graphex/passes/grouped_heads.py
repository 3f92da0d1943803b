"""Attention over grouped key/value heads reads them where they are, not a repeated copy.

Note [Attention reads grouped key/value heads directly]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A decoder with fewer key/value heads than query heads (GQA: Llama, Mistral, Qwen) repeats
each key/value head for its group before attention. transformers does it with `repeat_kv`
whenever it is compiled (`x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)`;
eager takes another path for one query), which reaches the ATen graph as
`_unsafe_view(clone(expand(unsqueeze(k, 2))))`: a copy of the whole key and value cache,
n times over, per layer and step (1 MiB per layer for the benchmarked Llama's 256 positions).

ATen's CPU flash attention (`_scaled_dot_product_flash_attention_for_cpu`, what SDPA runs on
the CPU) takes fewer key/value heads natively: query head i reads key/value head i // n,
exactly the head the repeated copy holds at i, with the same per-row products in the same
order, so its result is bit for bit the same (tests/python/test_grouped_heads.py checks it
against eager under every ATEN_CPU_CAPABILITY, masks, dtypes, one query and many). The pass
hands it `k` and `v` themselves when
  * both key and value are such repeats, of the same group size n, and the query has
    h * n heads;
  * the repeated tensors are contiguous (the layout the copy would have had), so the kernel
    reads the same rows with the same strides;
  * nothing between the copy and the attention writes `k`'s or `v`'s memory (the copy froze
    the values the attention read).
The copies then have no reader left and dead-code elimination drops them. Option
`grouped_kv_heads=False` keeps them.
"""

from __future__ import annotations

import torch
import torch.fx

from .aliasing import root, written_args

aten = torch.ops.aten
_FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default
_RESHAPES = (aten._unsafe_view.default, aten.view.default, aten.reshape.default)


def read_grouped_heads_directly(graph: torch.fx.Graph) -> int:
    """Rewrite each CPU flash attention over repeated key/value heads to read the grouped heads; returns how many
    (Note [Attention reads grouped key/value heads directly])."""
    rewritten = 0
    for attention in list(graph.find_nodes(op="call_function", target=_FLASH_CPU)):
        query = attention.args[0]
        if not isinstance(query, torch.fx.Node) or len(attention.args) < 3:
            continue
        sources = [_repeated_source(attention.args[i], attention) for i in (1, 2)]
        if any(s is None for s in sources):
            continue
        (k, n_k), (v, n_v) = sources  # type: ignore[misc]
        q = query.meta.get("val")
        kv = k.meta["val"]
        if n_k != n_v or not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[1] != kv.shape[1] * n_k:
            continue
        attention.args = (query, k, v, *attention.args[3:])
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()
    return rewritten


def _repeated_source(node: object, attention: torch.fx.Node) -> tuple[torch.fx.Node, int] | None:
    """For `reshape(clone(expand(unsqueeze(k, 2), [b, h, n, s, d])), [b, h * n, s, d])` read by `attention`: (k, n)
    when the rewrite keeps the attention's values (the Note's conditions), else None."""
    if not (isinstance(node, torch.fx.Node) and node.target in _RESHAPES):
        return None
    clone = node.args[0]
    if not (isinstance(clone, torch.fx.Node) and clone.target is aten.clone.default
            and clone.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format):
        return None
    expand = clone.args[0]
    if not (isinstance(expand, torch.fx.Node) and expand.target is aten.expand.default):
        return None
    unsqueeze = expand.args[0]
    if not (isinstance(unsqueeze, torch.fx.Node) and unsqueeze.target is aten.unsqueeze.default):
        return None
    k = unsqueeze.args[0]
    if not isinstance(k, torch.fx.Node):
        return None
    kv, out = k.meta.get("val"), node.meta.get("val")
    if not (isinstance(kv, torch.Tensor) and isinstance(out, torch.Tensor) and kv.dim() == 4):
        return None
    if unsqueeze.args[1] not in (2, -3):
        return None
    b, h, s, d = kv.shape
    sizes = list(expand.args[1])
    if len(sizes) != 5 or not all(isinstance(x, int) for x in (*sizes, b, h, s, d)):
        return None  # symbolic sizes (dynamic=True): not rewritten
    n = sizes[2]
    expected = [b, h, n, s, d]
    if any(not (got == want or got == -1 and i != 2) for i, (got, want) in enumerate(zip(sizes, expected))):
        return None
    if tuple(out.shape) != (b, h * n, s, d) or out.dtype != kv.dtype or not kv.is_contiguous():
        return None
    if _written_between(root(k), clone, attention):
        return None
    return k, n


def _written_between(base_root: torch.fx.Node, start: torch.fx.Node, stop: torch.fx.Node) -> bool:
    """Whether a node strictly between `start` and `stop` may write `base_root`'s memory (aliasing.written_args)."""
    node = start.next
    while node is not stop and node.op != "root":
        if any(root(n) is base_root for n in written_args(node)):
            return True
        node = node.next
    return False
