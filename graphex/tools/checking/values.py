"""Tensors inside operator arguments: bound to schema names, cloned, described, compared."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "bool", torch.complex64: "c64", torch.complex128: "c128"}


def bind(schema: torch._C.FunctionSchema, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Argument name -> value, as the kernel sees it (defaults filled in)."""
    bound: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if i < len(args) and not a.kwarg_only:
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def unbind(schema: torch._C.FunctionSchema, bound: dict[str, Any]) -> tuple[tuple, dict]:
    """The (args, kwargs) that call the op with `bound`."""
    args, kwargs = [], {}
    for a in schema.arguments:
        if a.name not in bound:
            continue
        if a.kwarg_only:
            kwargs[a.name] = bound[a.name]
        else:
            args.append(bound[a.name])
    return tuple(args), kwargs


def named_tensors(bound: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """("x", x), and ("z[0]", z[0]) for each element of a Tensor[] argument."""
    for name, value in bound.items():
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if isinstance(v, torch.Tensor):
                    yield f"{name}[{i}]", v


def tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors(o)]
    return []


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_tensors(fn, o) for o in obj)
    if isinstance(obj, list):
        return [map_tensors(fn, o) for o in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(fn, v) for k, v in obj.items()}
    return obj


def clone(obj: Any) -> Any:
    """Detached copies that keep shape, strides and dtype (a recorded input must survive later writes)."""
    with torch.inference_mode(False):
        return map_tensors(lambda t: t.detach().clone(), obj)


def to_meta(obj: Any) -> Any:
    return map_tensors(lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"), obj)


def outputs_list(out: Any) -> list[Any]:
    """A kernel's result as a list of outputs (a single tensor is one output, None is none)."""
    if out is None:
        return []
    return list(out) if isinstance(out, tuple) else [out]


def storage_key(t: torch.Tensor) -> int | None:
    """Identifies the memory behind t; None where there is none to share (meta, empty, sparse)."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr() if storage.nbytes() > 0 and t.device.type != "meta" else None
    except (RuntimeError, NotImplementedError):
        return None


def short(obj: Any) -> str:
    """f32[3, 4] for a tensor; lists and scalars as Python shows them."""
    if isinstance(obj, torch.Tensor):
        dtype = _SHORT.get(obj.dtype, str(obj.dtype).replace("torch.", ""))
        text = f"{dtype}[{', '.join(str(s) for s in obj.shape)}]"
        if not obj.is_contiguous() and obj.dim() > 1:
            text += f" strides {tuple(obj.stride())}"
        return text
    if isinstance(obj, (list, tuple)):
        inner = ", ".join(short(o) for o in obj)
        return f"[{inner}]" if isinstance(obj, list) else f"({inner}{',' if len(obj) == 1 else ''})"
    return repr(obj)


def signature(obj: Any) -> Any:
    """What makes two calls different cases: tensor metadata and the other arguments' values."""
    if isinstance(obj, torch.Tensor):
        return ("T", obj.dtype, tuple(obj.shape), tuple(obj.stride()), obj.device.type)
    if isinstance(obj, (list, tuple)):
        return tuple(signature(o) for o in obj)
    if isinstance(obj, dict):
        return tuple((k, signature(v)) for k, v in sorted(obj.items()))
    try:
        hash(obj)
        return obj
    except TypeError:
        return repr(obj)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and values; NaN equals NaN (a NaN left in place is not a write)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))
    return bool(torch.equal(a, b))


def strides_agree(shape: torch.Size, s1: tuple, s2: tuple) -> bool:
    """Strides of dims with more than one element agree (a size-1 dim's stride means nothing)."""
    return all(a == b for size, a, b in zip(shape, s1, s2) if size > 1)
