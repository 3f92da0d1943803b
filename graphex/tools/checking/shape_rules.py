"""Which shape/dtype rule a real kernel follows on a set of probes (the probes: propose.py).

A candidate rule is a Python expression over the argument names, exactly the
line the fake will contain; it is evaluated on meta copies of each probe and
must give the real output's shape and dtype on every one. Candidates go from
simple to specific (same as an input, broadcast, reduced dim, a dim taken from
another input, concatenation, transpose, sizes from int arguments, fixed
shape); the first that fits wins. A `Tensor?` argument appears only inside a
broadcast, where None counts as shape (), so the fake also works without it.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from . import values


def rule_for_output(bound: dict[str, Any], results: list, j: int, optional: set[str]) -> tuple[str, str] | None:
    outs = [r[1][j] if j < len(r[1]) else None for r in results]
    if all(isinstance(o, torch.Tensor) for o in outs):
        return _tensor_rule(bound, [(p, o) for (p, _), o in zip(results, outs)], optional)
    if all(isinstance(o, (list, tuple)) for o in outs) and len({len(o) for o in outs}) == 1:
        exprs, rules = [], []
        for k in range(len(outs[0])):
            pairs = [(p, o[k]) for (p, _), o in zip(results, outs)]
            if not all(isinstance(o, torch.Tensor) for _, o in pairs):
                return None
            found = _tensor_rule(bound, pairs, optional)
            if found is None:
                return None
            exprs.append(found[0])
            rules.append(f"[{k}] {found[1]}")
        return "[" + ", ".join(exprs) + "]", "a list: " + "; ".join(rules)
    return None


def _tensor_rule(bound: dict[str, Any], pairs: list, optional: set[str]) -> tuple[str, str] | None:
    envs = [_meta_env(p) for p, _ in pairs]
    slots = [(name, t) for name, t in values.named_tensors(bound) if name not in optional]
    for shape_expr, base, kind, desc in _shape_candidates(bound, pairs[0][1], optional):
        if not all(_evals_to(shape_expr, env, tuple(o.shape)) for env, (_, o) in zip(envs, pairs)):
            continue
        dtype = _dtype_expr(base, slots, envs, [o for _, o in pairs])
        if dtype is None:
            return None
        expr = _render(shape_expr, base, kind, dtype, dict(slots))
        if all(_fits(expr, env, o) for env, (_, o) in zip(envs, pairs)):
            dtype_desc = f"dtype of {dtype[:-6]}" if dtype.endswith(".dtype") else f"dtype {dtype}"
            return expr, f"{desc}, {dtype_desc}"
    return None


def _shape_candidates(bound: dict[str, Any], out: torch.Tensor,
                      optional: set[str]) -> Iterator[tuple[str, str | None, str, str]]:
    """(shape expression, base tensor, kind, description), simplest first; a `Tensor?` argument
    only in a broadcast, where None counts as shape ()."""
    slots = [(name, t) for name, t in values.named_tensors(bound) if name not in optional]
    top = [name for name, _ in values.named_tensors(bound) if "[" not in name]
    rank = {name: t.dim() for name, t in slots}
    for name, _ in slots:
        yield f"{name}.shape", name, "same", f"same shape as {name}"
    if len(top) >= 2:
        base = next((n for n in top if n not in optional), top[0])
        yield (f"torch.broadcast_shapes({', '.join(_shape_of(n, optional) for n in top)})", base, "broadcast",
               f"broadcast of {', '.join(top)}")
        for i, a in enumerate(top):
            for b in top[i + 1:]:
                if len(top) > 2:
                    yield (f"torch.broadcast_shapes({_shape_of(a, optional)}, {_shape_of(b, optional)})",
                           b if a in optional else a, "broadcast", f"broadcast of {a}, {b}")
    for keepdim in (False, True):
        for name, _ in slots:
            for d in range(rank[name]):
                expr = _with_dim(name, d, rank[name], "1" if keepdim else None)
                shown = -1 if d == rank[name] - 1 else d
                yield expr, name, "new", f"{name} with dim {shown} reduced" + (" (keepdim)" if keepdim else "")
    for name, _ in slots:
        for d in range(rank[name]):
            for other, _ in slots:
                if other == name:
                    continue
                for d2 in range(rank[other]):
                    src = f"{other}.shape[{d2 - rank[other] if d2 == rank[other] - 1 else d2}]"
                    shown = -1 if d == rank[name] - 1 else d
                    yield _with_dim(name, d, rank[name], src), name, "new", f"{name} with dim {shown} = {src}"
    yield from _concat_candidates(bound, slots, rank)
    for name, _ in slots:
        for d1 in range(rank[name]):
            for d2 in range(d1 + 1, rank[name]):
                yield f"{name}.transpose({d1}, {d2}).shape", name, "new", f"{name} transposed ({d1}, {d2})"
    base = slots[0][0] if slots else None
    for arg, value in bound.items():
        if isinstance(value, (list, tuple)) and value and all(is_int(v) for v in value):
            yield arg, base, "new", f"the shape given by {arg}"
        elif is_int(value):
            for name, _ in slots:
                for d in range(rank[name]):
                    shown = -1 if d == rank[name] - 1 else d
                    yield _with_dim(name, d, rank[name], arg), name, "new", f"{name} with dim {shown} = {arg}"
    yield f"{tuple(out.shape)}", base, "new", f"fixed shape {tuple(out.shape)}"


def _concat_candidates(bound, slots, rank) -> Iterator[tuple[str, str, str, str]]:
    for name, value in bound.items():
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            for d in range(value[0].dim()):
                total = f"sum(t.shape[{d}] for t in {name})"
                yield (_with_dim(f"{name}[0]", d, value[0].dim(), total), f"{name}[0]", "new",
                       f"concatenation of {name} along dim {d}")
    top = [name for name, _ in slots if "[" not in name]
    for i, a in enumerate(top):
        for b in top[i + 1:]:
            if rank[a] == rank[b]:
                for d in range(rank[a]):
                    yield (_with_dim(a, d, rank[a], f"{a}.shape[{d}] + {b}.shape[{d}]"), a, "new",
                           f"concatenation of {a}, {b} along dim {d}")


def is_int(value: Any) -> bool:
    """An int argument (a bool is not a size)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _shape_of(name: str, optional: set[str]) -> str:
    return f"({name}.shape if {name} is not None else ())" if name in optional else f"{name}.shape"


def _with_dim(name: str, d: int, rank: int, value: str | None) -> str:
    """`name`'s shape with dim d replaced by `value` (removed when None), as a short expression."""
    head = "" if d == 0 else (f"{name}.shape[:-1]" if d == rank - 1 else f"{name}.shape[:{d}]")
    tail = "" if d == rank - 1 else f"{name}.shape[{d + 1}:]"
    if value is None:
        return " + ".join(p for p in (head, tail) if p) or "()"
    parts = [p for p in (f"*{head}" if head else "", value, f"*{tail}" if tail else "") if p]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _dtype_expr(base: str | None, slots, envs, outs) -> str | None:
    names = ([base] if base else []) + [n for n, _ in slots if n != base]
    for name in names:
        if all(_eval(f"{name}.dtype", env) == o.dtype for env, o in zip(envs, outs)):
            return f"{name}.dtype"
    if len({o.dtype for o in outs}) == 1:
        return str(outs[0].dtype)
    return None


def _render(shape: str, base: str | None, kind: str, dtype: str, slots: dict[str, torch.Tensor]) -> str:
    own = dtype == f"{base}.dtype"
    if base is None:
        return f"torch.empty({shape}, dtype={dtype})"
    if kind == "same" and slots[base].is_contiguous():
        return f"torch.empty_like({base})" if own else f"torch.empty_like({base}, dtype={dtype})"
    if kind == "broadcast":
        return f"torch.empty({shape}, dtype={dtype}, device={base}.device)"
    return f"{base}.new_empty({shape})" if own else f"{base}.new_empty({shape}, dtype={dtype})"


def _meta_env(bound: dict[str, Any]) -> dict[str, Any]:
    return dict(values.to_meta(bound), torch=torch)


def _eval(expr: str, env: dict[str, Any]) -> Any:
    try:
        return eval(expr, {"__builtins__": {"sum": sum}}, env)  # noqa: S307  (our own candidate expressions)
    except Exception:  # noqa: BLE001  (a candidate that does not apply to these inputs)
        return None


def _evals_to(expr: str, env: dict[str, Any], shape: tuple[int, ...]) -> bool:
    value = _eval(expr, env)
    try:
        return value is not None and tuple(int(s) for s in value) == shape
    except (TypeError, ValueError):
        return False


def _fits(expr: str, env: dict[str, Any], out: torch.Tensor) -> bool:
    fake = _eval(expr, env)
    return (isinstance(fake, torch.Tensor) and fake.shape == out.shape and fake.dtype == out.dtype
            and (not out.is_contiguous() or values.strides_agree(out.shape, fake.stride(), out.stride())))
