"""What every built-in fusion admits: the dtypes the fused kernels compute (one definition), and the match
checks the pattern files build their extra checks from (patterns.py, attention_patterns.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from torch._inductor.pattern_matcher import Match

# The dtypes of the fused kernels' fast paths (csrc/fused/rows.h: Note [Reduced precision runs the float32 rows]),
# read by the patterns, the element-wise chains (chains.py) and max pooling (pooling.py).
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
REDUCED_DTYPES = (torch.bfloat16, torch.float16)


def fake_value(a: Any) -> Any:
    """What a graph node computes, as its fake tensor (node.meta["val"]); None for a node without one or a
    non-node argument. One definition for the fusion passes."""
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None


def val(match: Match, name: str) -> Any:
    node = match.kwargs[name]
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def float_cpu(*names: str) -> Callable[[Match], bool]:
    """Admit a match when the named inputs are CPU tensors of one dtype, float32, bfloat16 or float16 (the
    fast paths of the kernels; Note [Reduced precision runs the float32 rows]), of static shapes: the checks
    compare sizes, which on a dynamic=True graph's symbolic sizes would add guards that the captured program
    does not check, so those graphs are left exact."""
    def check(match: Match) -> bool:
        dtypes = set()
        for name in names:
            v = val(match, name)
            if not isinstance(v, torch.Tensor) or v.dtype not in FUSED_DTYPES or v.device.type != "cpu":
                return False
            if not all(type(d) is int for d in (*v.shape, *v.stride())):
                return False
            dtypes.add(v.dtype)
        if len(dtypes) > 1:  # mixed dtypes promote: not what a one-dtype kernel computes
            return False
        return True

    return check


def not_dtype(name: str, dtype: torch.dtype) -> Callable[[Match], bool]:
    """The named input is not of `dtype` (a form whose eager arithmetic in that dtype the kernel does not follow)."""
    return lambda match: not (isinstance(val(match, name), torch.Tensor) and val(match, name).dtype == dtype)


def number(name: str) -> Callable[[Match], bool]:
    """A scalar argument is a number in the graph (with dynamic=True it may be a graph input instead)."""
    return lambda match: type(match.kwargs.get(name)) in (float, int)


def all_of(*checks: Callable[[Match], bool]) -> Callable[[Match], bool]:
    return lambda match: all(c(match) for c in checks)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a row-major tensor of `shape` (what a kernel that writes fresh contiguous memory gives)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
