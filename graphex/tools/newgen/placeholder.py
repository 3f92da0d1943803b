"""The bodies every generated op starts with: a trivial kernel and a fake function that agree.

The kernel is a placeholder the user replaces (marked `<your implementation>` / TODO): it
writes each mutated input in place (`x.mul_(2)`) and returns new tensors made from one
tensor input, the source (`x * 2`, `x * 3`, ...). The fake computes only shapes, dtypes and
devices: `empty_like(source)` per output, None for an op that returns nothing. When the
outputs follow from the inputs (one Tensor output, a Tensor input) the fake is final;
otherwise it is marked TODO and still matches the placeholder, so everything generated runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import OpSpec
from .text import WIDTH, comment_lines, commented

IMPL_TODO = "<your implementation>  TODO: replace this placeholder"


@dataclass(frozen=True)
class Source:
    expr: str        # "x", or "z[0]" for a Tensor[] (the same in Python and C++)
    derived: bool    # the fake follows from the schema alone (one Tensor out, from a Tensor in): no TODO


def source(spec: OpSpec) -> Source:
    """The tensor the placeholder outputs are made from: preferably an input the op does not write."""
    plain = [a for a in spec.args if a.type == "Tensor"]
    read_only = [a for a in plain if not a.mutable] or plain
    if read_only:
        return Source(read_only[0].name, derived=spec.returns == ("Tensor",))
    first_list = next(a for a in spec.args if a.type == "Tensor[]")
    return Source(f"{first_list.name}[0]", derived=False)


def describe(spec: OpSpec) -> str:
    """What the placeholder does, for the comment above it."""
    parts = []
    if spec.mutated:
        parts.append(f"doubles {_written(spec)} in place")
    if spec.returns:
        made = "new tensors" if _count(spec) > 1 else "a new tensor"
        parts.append(f"returns {made} made from {source(spec).expr}")
    return " and ".join(parts)


def py_impl(spec: OpSpec) -> list[str]:
    lines = comment_lines(f"{IMPL_TODO}, which {describe(spec)}.")
    for arg in spec.mutated:
        if arg.type == "Tensor":
            lines.append(f"{arg.name}.mul_(2)")
        elif arg.type == "Tensor?":
            lines += [f"if {arg.name} is not None:", f"    {arg.name}.mul_(2)"]
        else:
            lines += [f"for t in {arg.name}:", "    t.mul_(2)"]
    if spec.returns:
        src = source(spec).expr
        lines.append(_py_return(spec, [f"{src} * {k + 2}" for k in range(_count(spec))]))
    return lines


def py_fake(spec: OpSpec) -> list[str]:
    if not spec.returns:
        return commented("return None", f"{_written(spec)} written in place: no output to describe")
    src = source(spec)
    if src.derived:
        return commented(f"return torch.empty_like({src.expr})", f"like {src.expr}: change this if your output differs")
    return [_FAKE_TODO, _py_return(spec, [f"torch.empty_like({src.expr})"] * _count(spec))]


def cpp_impl(spec: OpSpec) -> list[str]:
    lines = comment_lines(f"{IMPL_TODO}, which {describe(spec)}.", "//", room=WIDTH - 2)
    for arg in spec.mutated:
        if arg.type == "Tensor":
            lines.append(f"{arg.name}.mul_(2);")
        elif arg.type == "Tensor?":
            lines.append(f"if ({arg.name}.has_value()) {{ {arg.name}->mul_(2); }}")
        else:
            lines.append(f"for (const at::Tensor& t : {arg.name}) {{ t.mul_(2); }}")
    if spec.returns:
        src = source(spec).expr
        lines.append(_cpp_return(spec, [f"{src}.mul({k + 2})" for k in range(_count(spec))]))
    return lines


def cpp_meta(spec: OpSpec) -> list[str]:
    if not spec.returns:
        return [f"// {_written(spec)} written in place: no output to describe."]
    src = source(spec)
    if src.derived:
        return commented(f"return at::empty_like({src.expr});", f"like {src.expr}: change this if your output differs",
                         "//")
    return ["// " + _FAKE_TODO[2:], _cpp_return(spec, [f"at::empty_like({src.expr})"] * _count(spec))]


_FAKE_TODO = "# TODO: derive each output's shape and dtype from the inputs (these match the placeholder)."


def _count(spec: OpSpec) -> int:
    """Tensors the placeholder returns: one per Tensor, two for a Tensor[]."""
    return 2 if spec.returns == ("Tensor[]",) else len(spec.returns)


def _py_return(spec: OpSpec, outs: list[str]) -> str:
    return f"return [{', '.join(outs)}]" if spec.returns == ("Tensor[]",) else f"return {', '.join(outs)}"


def _cpp_return(spec: OpSpec, outs: list[str]) -> str:
    return f"return {outs[0]};" if spec.returns == ("Tensor",) else f"return {{{', '.join(outs)}}};"


def _written(spec: OpSpec) -> str:
    names = [a.name for a in spec.mutated]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
