"""Bitwise comparison of results: what "equal to eager" means in the sweeps.

Note [Bitwise means the bytes]
torch.equal says NaN != NaN and -0.0 == 0.0; the sweeps compare the bytes of each
tensor instead (after making it contiguous), plus dtype and shape, so a NaN in the same
place with the same payload is equal and a sign flip of zero is not. Non-tensor results
(ints, floats, shapes, None) compare with ==, NaN equal to NaN.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8)


def difference(actual: Any, expected: Any, path: str = "output", *, values: bool = True) -> str | None:
    """None when `actual` is bitwise `expected` (Note [Bitwise means the bytes]); else where and how they differ.
    With values=False, tensors compare by dtype, shape and strides only (outputs no kernel writes)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{path}: expected a tensor, got {type(actual).__name__}"
        if actual.dtype != expected.dtype:
            return f"{path}: dtype {actual.dtype} != {expected.dtype}"
        if actual.shape != expected.shape:
            return f"{path}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        if not values:
            same = actual.layout != torch.strided or actual.stride() == expected.stride()
            return None if same else f"{path}: strides {actual.stride()} != {expected.stride()}"
        if actual.layout != torch.strided or expected.layout != torch.strided:
            if actual.layout != expected.layout:
                return f"{path}: layout {actual.layout} != {expected.layout}"
            actual, expected = actual.to_dense(), expected.to_dense()
        if actual.is_quantized or expected.is_quantized:
            actual, expected = actual.int_repr(), expected.int_repr()
        if not torch.equal(_bytes(actual), _bytes(expected)):
            return f"{path}: values differ ({_max_diff(actual, expected)})"
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: {type(actual).__name__} of {_len(actual)} vs {type(expected).__name__} of {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            found = difference(a, e, f"{path}[{i}]", values=values)
            if found:
                return found
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            return f"{path}: keys differ"
        for k in expected:
            found = difference(actual[k], expected[k], f"{path}[{k!r}]", values=values)
            if found:
                return found
        return None
    if isinstance(expected, float) and isinstance(actual, float) and math.isnan(expected) and math.isnan(actual):
        return None
    if actual != expected:
        return f"{path}: {actual!r} != {expected!r}"
    return None


def _len(x: Any) -> str:
    return str(len(x)) if isinstance(x, (list, tuple)) else "?"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    try:
        if a.is_floating_point() or a.is_complex():
            d = (a.to(torch.complex128 if a.is_complex() else torch.float64)
                 - b.to(torch.complex128 if b.is_complex() else torch.float64)).abs()
            d = d[~d.isnan()]
            return f"max abs diff {d.max().item() if d.numel() else 'nan only'}"
        return f"{int((a != b).sum())} elements differ"
    except Exception:  # noqa: BLE001 - a description only
        return "bytes differ"


def close(actual: Any, expected: Any) -> bool:
    """Equal up to rounding (the tolerance torch.testing uses for the dtype): what aot_eager also gets."""
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, check_stride=False, check_device=False)
        return True
    except Exception:  # noqa: BLE001 - any mismatch is "not close"
        return False


def clone_tree(x: Any, _storages: dict[int, Any] | None = None) -> Any:
    """A deep copy of the tensors in `x` with the same storage offset, sizes and strides (a copy of the
    whole storage, re-viewed), so every run starts from the same inputs, expanded ones included; tensors
    that share memory in `x` share the copied memory (a cache and a view of it stay aliased)."""
    storages = {} if _storages is None else _storages
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided or x.is_quantized:
            return x.clone()
        key = x.untyped_storage().data_ptr()
        if key not in storages or key == 0:
            storages[key] = x.detach().untyped_storage().clone()
        out = torch.empty(0, dtype=x.dtype, device=x.device).set_(storages[key], x.storage_offset(), x.size(), x.stride())
        out.requires_grad_(x.requires_grad)
        return out
    if isinstance(x, list):
        return [clone_tree(v, storages) for v in x]
    if isinstance(x, tuple):
        return tuple(clone_tree(v, storages) for v in x)
    if isinstance(x, dict):
        return {k: clone_tree(v, storages) for k, v in x.items()}
    return x


def aliasing(result: tuple[Any, list[torch.Tensor]]) -> list[tuple[bool, int | None, int | None]]:
    """What a call's outputs say about memory, per output tensor (in flattening order): whether it is a view
    (`_is_view()`), the first input whose storage it shares and the first earlier output whose storage it
    shares (None: none). `result` is (outputs, the inputs after the call). Empty tensors share nothing."""
    outputs, inputs = result
    leaves = [t for t in torch.utils._pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]

    def storage(t: torch.Tensor) -> int | None:
        if t.layout != torch.strided or t.is_quantized or t.untyped_storage().nbytes() == 0:
            return None
        return t.untyped_storage().data_ptr()

    ins = [storage(t) if isinstance(t, torch.Tensor) else None for t in inputs]
    seen: list[int | None] = []
    found = []
    for t in leaves:
        s = storage(t)
        found.append((t._is_view(), next((i for i, p in enumerate(ins) if s is not None and p == s), None),
                      next((j for j, p in enumerate(seen) if s is not None and p == s), None)))
        seen.append(s)
    return found


def alias_difference(actual: tuple[Any, list[torch.Tensor]], expected: tuple[Any, list[torch.Tensor]],
                     path: str = "outputs") -> str | None:
    """None when every output is a view, shares an input's memory or another output's exactly where the expected
    call's does (`aliasing`); else the first output that differs, and how."""
    got, want = aliasing(actual), aliasing(expected)
    if len(got) != len(want):
        return f"{path}: {len(got)} tensors vs {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            what = ("a view" if g[0] else "not a view", g[1], g[2]), ("a view" if w[0] else "not a view", w[1], w[2])
            return (f"{path}[{i}]: (view, shares input, shares output) {what[0]} where eager's is {what[1]}")
    return None
