"""Comparing two runs of one compiled function: its outputs, its inputs after the call (in-place
updates), and the module's parameters and buffers after the call. Bitwise first; the largest
absolute difference and whether it is within torch.testing's default tolerance for the dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree


@dataclasses.dataclass
class RunResult:
    values: dict[str, Any] | None   # "output[0]", "input 1", "state cache" -> value; None when it raised
    error: str = ""
    graphex_error: bool = False     # it raised a GraphexError (reported on its own)
    graphs: int = -1                # graphs graphex captured for this run (-1: not a graphex stage)

    @staticmethod
    def of(outputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any], state: dict[str, torch.Tensor]) -> "RunResult":
        values: dict[str, Any] = {}
        leaves, spec = pytree.tree_flatten(outputs)
        single = spec.is_leaf()
        for i, leaf in enumerate(leaves):
            values["output" if single else f"output[{i}]"] = leaf
        for i, arg in enumerate(args):
            for j, leaf in enumerate(pytree.tree_leaves(arg)):
                if isinstance(leaf, torch.Tensor):
                    values[f"input {i}" + (f"[{j}]" if j else "")] = leaf
        for name, value in kwargs.items():
            for j, leaf in enumerate(pytree.tree_leaves(value)):
                if isinstance(leaf, torch.Tensor):
                    values[f"input {name}" + (f"[{j}]" if j else "")] = leaf
        for name, t in state.items():
            values[f"state {name}"] = t
        return RunResult(values)


@dataclasses.dataclass
class Diff:
    same: bool                 # bitwise equal everywhere (NaN equals NaN)
    close: bool                # within tolerance everywhere
    max_abs: float | None      # the largest absolute difference (None: not comparable)
    where: str = ""            # the first value that differs
    note: str = ""             # "shape (4,) vs (4, 8)", "raised ..."

    def describe(self) -> str:
        if self.same:
            return "bitwise equal"
        if self.where == "the call":
            return self.note
        text = f"{self.where} differs"
        if self.note:
            text += f" ({self.note})"
        elif self.max_abs is not None:
            text += f" (max abs diff {self.max_abs:.3g}{', within tolerance' if self.close else ''})"
        return text


def compare(expected: RunResult, actual: RunResult) -> Diff:
    if actual.values is None:
        return Diff(False, False, None, "the call", f"raised {actual.error}")
    assert expected.values is not None
    worst: Diff | None = None
    for name, e in expected.values.items():
        if name not in actual.values:
            return Diff(False, False, None, name, "missing")
        d = _compare_value(name, e, actual.values[name])
        if d.same:
            continue
        if worst is None or (worst.close and not d.close) or _bigger(d, worst):
            worst = d
    if len(actual.values) != len(expected.values) and worst is None:
        return Diff(False, False, None, "outputs", f"{len(actual.values)} values vs {len(expected.values)}")
    return worst or Diff(True, True, 0.0)


def _bigger(a: Diff, b: Diff) -> bool:
    return a.close == b.close and (a.max_abs or 0.0) > (b.max_abs or 0.0)


def _compare_value(name: str, e: Any, a: Any) -> Diff:
    if not isinstance(e, torch.Tensor):
        same = type(a) is type(e) and a == e
        return Diff(bool(same), bool(same), None, name, "" if same else f"{a!r} vs {e!r}")
    if not isinstance(a, torch.Tensor):
        return Diff(False, False, None, name, f"{type(a).__name__} instead of a tensor")
    if a.shape != e.shape or a.dtype != e.dtype:
        return Diff(False, False, None, name, f"{a.dtype}{list(a.shape)} vs eager's {e.dtype}{list(e.shape)}")
    a, e = a.detach().cpu(), e.detach().cpu()
    if e.is_floating_point() or e.is_complex():
        both_nan = torch.isnan(a) & torch.isnan(e)
        same = bool(((a == e) | both_nan).all())
    else:
        same = torch.equal(a, e)
    if same:
        return Diff(True, True, 0.0, name)
    diff = (a.double() - e.double()).abs() if not e.is_complex() else (a - e).abs().double()
    diff = diff[~torch.isnan(diff)]
    max_abs = float(diff.max()) if diff.numel() else float("nan")
    try:
        torch.testing.assert_close(a, e, equal_nan=True)
        close = True
    except AssertionError:
        close = False
    return Diff(False, close, max_abs, name)
