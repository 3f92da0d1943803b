"""The registration module for the two pure-Python styles.

    --style custom_op   @torch.library.custom_op + @op.register_fake
    --style library     Library(ns, "FRAGMENT").define + @impl(lib, op, "CPU"),
                        Meta via Library(ns, "IMPL", "Meta") + @impl(meta_lib, op)
"""

from __future__ import annotations

from . import placeholder
from .spec import OpSpec, SkeletonError
from .text import indent, join, py_def, py_str
from ...custom_ops.typemap import TYPES, py_default, py_return, typing_imports

_INPLACE_NOTE = "# An in-place op declares every input it writes ({how}) and returns none of them."
_META_NOTE = "# Shape, dtype and device only, never data: torch.compile traces the op with this."


def custom_op_module(spec: OpSpec) -> str:
    params = _params(spec)
    ret = py_return(spec.returns)
    names = [py_str(a.name) for a in spec.mutated]
    mutates = f"{names[0]}," if len(names) == 1 else ", ".join(names)
    return join(
        _docstring(spec, "torch.library.custom_op", "fake function"),
        "",
        _imports(params + [ret]),
        "",
        "",
        [_INPLACE_NOTE.format(how="mutates_args")] if spec.inplace else [],
        f'@torch.library.custom_op("{spec.qualname}", mutates_args=({mutates}), device_types="cpu")',
        py_def(spec.name, params, ret),
        indent(placeholder.py_impl(spec)),
        "",
        "",
        fake_block(spec, params, ret),
    )


def fake_block(spec: OpSpec, params: list[str] | None = None, ret: str | None = None) -> list[str]:
    """@NAME.register_fake and its function."""
    params = params if params is not None else _params(spec)
    ret = py_return(spec.returns) if ret is None else ret
    return [f"@{spec.name}.register_fake", *py_def("_", params, ret),
            *indent([_META_NOTE, *placeholder.py_fake(spec)])]


def library_module(spec: OpSpec) -> str:
    params = _params(spec)
    ret = py_return(spec.returns)
    return join(
        _docstring(spec, "torch.library.Library", "Meta function"),
        "",
        _imports(params + [ret]),
        "",
        f'lib = torch.library.Library("{spec.namespace}", "FRAGMENT")',
        [_INPLACE_NOTE.format(how="Tensor(a!)")] if spec.inplace else [],
        f"lib.define({py_str(spec.schema)})",
        "",
        "",
        '# "CPU": the kernel for CPU tensors. If the same code works on every device, register it as',
        '# "CompositeExplicitAutograd" instead: one kernel for all backends.',
        f'@torch.library.impl(lib, "{spec.name}", "CPU")',
        py_def(f"{spec.name}_cpu", params, ret),
        indent(placeholder.py_impl(spec)),
        "",
        "",
        meta_block(spec, params, ret),
    )


def meta_block(spec: OpSpec, params: list[str] | None = None, ret: str | None = None, *,
               blank: int = 2, lib: str | None = None) -> list[str]:
    """meta_lib = Library(ns, "IMPL", "Meta") and the Meta function registered on it; with `lib` (an expression for
    a Library that already exists, e.g. the namespace's one Library of a printed fix), registered on that instead."""
    params = params if params is not None else _params(spec)
    ret = py_return(spec.returns) if ret is None else ret
    body = [*py_def(f"{spec.name}_meta", params, ret), *indent([_META_NOTE, *placeholder.py_fake(spec)])]
    if lib is None:
        return [f'meta_lib = torch.library.Library("{spec.namespace}", "IMPL", "Meta")', *[""] * blank,
                f'@torch.library.impl(meta_lib, "{spec.name}")', *body]
    from ...custom_ops.fixes import meta_registration

    return [*body, "", "", meta_registration(lib, spec.name, f"{spec.name}_meta")]


def printed_imports(spec: OpSpec, *, annotate: bool = True) -> list[str]:
    """The imports a printed fake/Meta function of `spec` needs (`import torch`, and typing's names it uses)."""
    return _imports([*_params(spec, annotate=annotate), py_return(spec.returns)])


def check_python(spec: OpSpec, *, custom_op: bool) -> None:
    """Refuse what the Python style cannot express (custom_op infers the schema from annotations)."""
    other = "--style library or cpp" if custom_op else "--style cpp"
    for arg in spec.args:
        if custom_op and not TYPES[arg.type].custom_op:
            raise SkeletonError(f"graphex new: custom_op cannot declare {arg.type} arguments ({arg.name}); "
                                f"use {other} for this signature.")
        if custom_op and arg.is_tensor and arg.kwarg_only:
            raise SkeletonError(f"graphex new: custom_op does not take keyword-only tensors ({arg.name}); move "
                                f"it before the `*`, or use {other}.")
        bad_default = py_default(arg.type, arg.default) is None or (custom_op and isinstance(arg.default, list))
        if arg.has_default and bad_default:
            raise SkeletonError(f"graphex new: {'custom_op' if custom_op else 'Python'} cannot express the "
                                f"default of {arg.name} ({arg.default!r}); drop the default, or use {other}.")


def _params(spec: OpSpec, *, annotate: bool = True) -> list[str]:
    """With the schema's defaults and keyword-only marker: Python kernels are called with the
    arguments as the caller passed them, not filled in from the schema."""
    params: list[str] = []
    for arg in spec.args:
        if arg.kwarg_only and "*" not in params:
            params.append("*")
        text = f"{arg.name}: {TYPES[arg.type].py}" if annotate else arg.name
        if arg.has_default:
            text += f" = {py_default(arg.type, arg.default)}" if annotate else f"={py_default(arg.type, arg.default)}"
        params.append(text)
    return params


def _imports(annotations: list[str]) -> list[str]:
    lines = typing_imports(annotations)
    stdlib = [line for line in lines if line.startswith("from typing")]
    torch_lines = ["import torch", *(line for line in lines if line not in stdlib)]
    return [*stdlib, "", *torch_lines] if stdlib else torch_lines


def _docstring(spec: OpSpec, how: str, fake: str) -> list[str]:
    return [
        f'"""{spec.op}, registered with {how}.',
        "",
        f"Import this module before torch.compile traces a call to the op: the {fake} below",
        "is what the graph is built from.",
        '"""',
    ]


def unannotated_params(spec: OpSpec) -> list[str]:
    """`x, y, eps=1e-06`: for the short Meta function shown in a comment."""
    return _params(spec, annotate=False)
