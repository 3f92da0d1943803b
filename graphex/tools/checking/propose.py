"""Propose a fake for an op from its real kernel: probe it on varied shapes, infer the shape rule.

Note [How a fake is inferred]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Probes are the recorded inputs with sizes changed, dtypes kept: every distinct
size mapped to a fresh one at once (keeps equal dims equal), doubled (keeps
even sizes even), each distinct size alone, each dim of each tensor alone (to
one more, and to 1, which tells "same as x" from a broadcast); one probe casts
floating inputs to another float dtype, to tell "dtype of x" from a fixed
dtype, and int arguments get probes of their own (+1), to tell a size taken
from one from a fixed size. Probe data is the recorded data tiled into the new
shape, so index-like inputs keep their values. The real kernel runs on each
probe; probes it refuses (raises) are skipped. shape_rules.py then finds the
first candidate rule that fits every probe.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Iterator

import torch

from . import values
from .shape_rules import is_int, rule_for_output

_MAX_PROBES = 40
_MAX_NUMEL = 1 << 20


@dataclasses.dataclass
class Proposal:
    body: str | None    # the fake's body (indented lines), or None when no rule fits
    rule: str           # what the body computes, or why no rule fits
    probes: int         # inputs the rule was verified on
    refused: int        # probes the real kernel raised on (skipped)
    seen: str = ""      # what the kernel returned on some probes, when no rule fits

    @property
    def unknown(self) -> str | None:
        """Why no fake could be inferred (what was seen), or None when a rule fits."""
        if self.body is not None:
            return None
        return f"{self.rule}; {self.seen}" if self.seen else self.rule

    def note(self) -> str:
        if self.body is None:
            return f"no shape rule fits: {self.unknown}; the fake below is a TODO to finish by hand"
        refused = f"; {self.refused} probe(s) refused by the kernel, skipped" if self.refused else ""
        return f"inferred: {self.rule} (verified on {self.probes} input shape(s){refused})"


def propose(op: torch._ops.OpOverload, args: tuple, kwargs: dict | None = None) -> Proposal:
    schema = op._schema
    if not schema.returns:
        return Proposal("    return None  # in place: the (a!) arguments keep their shapes", "returns nothing", 1, 0)
    bound = values.bind(schema, values.clone(args), values.clone(kwargs or {}))
    results, refused = [], 0
    for probe in _probes(bound):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                call_args, call_kwargs = values.unbind(schema, values.clone(probe))
                out = op(*call_args, **call_kwargs)
        except Exception:  # noqa: BLE001  (a shape the kernel refuses is simply not a probe)
            refused += 1
            continue
        results.append((probe, values.outputs_list(out)))
    if not results:
        return Proposal(None, "the kernel raised on every probe, even the recorded inputs", 0, refused)
    optional = {a.name for a in schema.arguments if isinstance(a.type, torch.OptionalType)}
    exprs, rules = [], []
    for j, ret in enumerate(schema.returns):
        found = rule_for_output(bound, results, j, optional)
        if found is None:
            kind = "a tensor" if isinstance(ret.type, torch.TensorType) else str(ret.type)
            return Proposal(None, f"output {j} ({kind}) follows none of the candidate rules", len(results), refused,
                            _seen(schema, results, j))
        exprs.append(found[0])
        rules.append(f"output {j}: {found[1]}" if len(schema.returns) > 1 else found[1])
    value = exprs[0] if len(exprs) == 1 else "(" + ", ".join(exprs) + ")"
    return Proposal(f"    return {value}", "; ".join(rules), len(results), refused)


def _seen(schema: torch._C.FunctionSchema, results: list, j: int) -> str:
    """'on x=f32[3, 5] it returned f32[7]; on x=f32[4, 5]: f32[9]' for the first probes."""
    shown = []
    for probe, outs in results[:3]:
        inputs = ", ".join(f"{k}={values.short(v)}" for k, v in probe.items()
                           if isinstance(v, torch.Tensor) or is_int(v))
        out = values.short(outs[j]) if j < len(outs) else "nothing"
        shown.append(f"on {inputs} it returned {out}" if not shown else f"on {inputs}: {out}")
    return "; ".join(shown)


# -- probes --------------------------------------------------------------------------------------
def _probes(bound: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The recorded inputs, then variations (see the Note); built one at a time, at most _MAX_PROBES."""
    slots = list(values.named_tensors(bound))
    yield bound
    if any(t.is_floating_point() for _, t in slots):
        yield _recast(bound)
    for name, value in bound.items():  # sizes given as int arguments
        if is_int(value) or (isinstance(value, (list, tuple)) and value and all(is_int(v) for v in value)):
            yield dict(bound, **{name: value + 1 if is_int(value) else type(value)(v + 1 for v in value)})
    sizes = sorted({s for _, t in slots for s in t.shape if s > 1})
    maps = [{v: v + i + 1 for i, v in enumerate(sizes)}, {v: 2 * v for v in sizes}]
    for v in sizes:
        maps += [{v: v + 1}, {v: 2 * v}]
    variants = [{name: tuple(m.get(s, s) for s in t.shape) for name, t in slots} for m in maps if m]
    for slot, t in slots:
        for d, size in enumerate(t.shape):
            for new_size in ([1] if size > 1 else []) + [size + 2 if size == 1 else size + 1]:
                # size 1 tells "same as x" from "broadcast of x, y"
                variants.append({name: tuple(new_size if (name == slot and i == d) else s
                                             for i, s in enumerate(u.shape)) for name, u in slots})
    seen, count = {tuple(tuple(t.shape) for _, t in slots)}, 2
    for shapes in variants:
        key = tuple(shapes.values())
        if key in seen or any(math.prod(shape) > _MAX_NUMEL for shape in key):
            continue
        seen.add(key)
        yield _reshaped(bound, shapes)
        count += 1
        if count >= _MAX_PROBES:
            return


def _reshaped(bound: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    new: dict[str, Any] = {}
    for name, value in bound.items():
        if isinstance(value, torch.Tensor):
            new[name] = _tiled(value, shapes[name])
        elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            new[name] = type(value)(_tiled(v, shapes[f"{name}[{i}]"]) if isinstance(v, torch.Tensor) else v
                                    for i, v in enumerate(value))
        else:
            new[name] = value
    return new


def _tiled(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The recorded data repeated into `shape` (keeps index-like values valid)."""
    n = math.prod(shape)
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(shape, dtype=t.dtype, device=t.device)
    return flat.repeat(-(-n // flat.numel()))[:n].reshape(shape).clone()


def _recast(bound: dict[str, Any]) -> dict[str, Any]:
    def cast(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t.clone()
        return t.to(torch.float32 if t.dtype == torch.float64 else torch.float64)

    return values.map_tensors(cast, bound)
