"""The code to paste: fixes for custom-op problems, written in the user's own registration style."""

from __future__ import annotations

import textwrap

import torch

from .registration import Registration


def params(schema: torch._C.FunctionSchema) -> str:
    return ", ".join(a.name for a in schema.arguments)


def _first_tensor(schema: torch._C.FunctionSchema) -> str | None:
    for a in schema.arguments:
        if isinstance(a.type, torch.TensorType):
            return a.name
    return None


def fake_body(schema: torch._C.FunctionSchema, *, indent: str = "    ") -> str:
    """The body of a fake/Meta function: shapes only, never data."""
    returns = schema.returns
    first = _first_tensor(schema) or "x"
    if not returns:
        return f"{indent}return None  # in-place: only the declared (a!) arguments change"
    outs = []
    for r in returns:
        if isinstance(r.type, torch.TensorType):
            outs.append(f"torch.empty_like({first})")
        elif isinstance(r.type, torch.ListType):
            outs.append(f"[torch.empty_like({first})]")
        else:
            outs.append("0")
    value = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    return (f"{indent}# TODO: the shape/dtype {schema.name} really returns; never read tensor data here\n"
            f"{indent}return {value}")


def missing_fake(reg: Registration) -> str:
    s = reg.schema
    if reg.style == "custom_op":
        return (f"@{reg.python_name}.register_fake\n"
                f"def _({params(s)}):\n{fake_body(s)}")
    python_meta = (f'meta_lib = torch.library.Library("{reg.namespace}", "IMPL", "Meta")\n\n'
                   f'@torch.library.impl(meta_lib, "{_overload_name(reg)}")\n'
                   f"def {reg.name}_meta({params(s)}):\n{fake_body(s)}")
    if reg.style == "library":
        return python_meta
    return (f"// in C++, next to TORCH_LIBRARY({reg.namespace}, m):\n"
            f"{cpp_meta_skeleton(reg)}\n\n"
            f"# or from Python (the op-plugin style), before torch.compile runs:\n{python_meta}")


def cpp_meta_skeleton(reg: Registration) -> str:
    s = reg.schema
    first = _first_tensor(s) or "x"
    ret = "void" if not s.returns else ("at::Tensor" if len(s.returns) == 1
                                        else f"std::tuple<{', '.join(['at::Tensor'] * len(s.returns))}>")
    body = "" if not s.returns else (
        f"  return at::empty_like({first});  // TODO: the real output shape/dtype"
        if len(s.returns) == 1 else
        f"  return {{{', '.join(f'at::empty_like({first})' for _ in s.returns)}}};  // TODO: real shapes")
    return (f"{ret} {reg.name}_meta(/* same parameters as the CPU kernel */) {{\n{body}\n}}\n"
            f"TORCH_LIBRARY_IMPL({reg.namespace}, Meta, m) {{\n"
            f'  m.impl("{_overload_name(reg)}", &{reg.name}_meta);\n}}')


def meta_on_real_device(reg: Registration, device: str) -> str:
    s = reg.schema
    first = _first_tensor(s) or "x"
    where = {"custom_op": f"your @{reg.python_name}.register_fake function",
             "library": "your Meta function", "cpp": "your Meta kernel"}[reg.style]
    if reg.style == "cpp":
        return (f"// In {where}, allocate like the inputs instead of on '{device}':\n"
                f"return at::empty_like({first});                  // same shape/dtype/device as {first}\n"
                f"return at::empty(sizes, {first}.options());      // another shape, {first}'s device")
    return (f"# In {where}, allocate like the inputs instead of on '{device}':\n"
            f"return torch.empty_like({first})              # same shape/dtype/device as {first}\n"
            f"return {first}.new_empty(shape)               # another shape, {first}'s device and dtype")


def no_mutated_return(reg: Registration) -> str:
    s = reg.schema
    mutated = [a.name for a in s.arguments if a.alias_info is not None and a.alias_info.is_write]
    schema_text = str(s)
    fixed = schema_text.rsplit(" -> ", 1)[0] + " -> ()"
    fixed = fixed.split("::", 1)[1]
    if "." in fixed.split("(", 1)[0]:
        fixed = fixed.split(".", 1)[0] + "(" + fixed.split("(", 1)[1]
    if reg.style == "custom_op":
        return textwrap.dedent(f"""\
            @torch.library.custom_op("{reg.qualname}", mutates_args=({", ".join(repr(m) for m in mutated)},))
            def {reg.python_name}({params(s)}) -> None:
                ...  # mutate {", ".join(mutated)} in place; return nothing

            @{reg.python_name}.register_fake
            def _({params(s)}) -> None:
                return None""")
    if reg.style == "library":
        return textwrap.dedent(f"""\
            lib.define("{fixed}")          # no return: {", ".join(mutated)} is updated in place

            @torch.library.impl(lib, "{reg.name}", "CPU")
            def {reg.name}({params(s)}):
                ...  # mutate {", ".join(mutated)}; return None

            @torch.library.impl(meta_lib, "{reg.name}")
            def {reg.name}_meta({params(s)}):
                return None""")
    return textwrap.dedent(f"""\
        m.def("{fixed}");   // no return: {", ".join(mutated)} is updated in place
        void {reg.name}(/* ... */) {{ /* mutate {", ".join(mutated)}; return nothing */ }}""")


def fake_mismatch(reg: Registration, output: int, expected: str, actual: str) -> str:
    where = {"custom_op": f"@{reg.python_name}.register_fake", "library": f"the Meta function of {reg.name}",
             "cpp": f"the Meta kernel of {reg.name}"}[reg.style]
    return (f"# {where} must return what the real kernel returns for output {output}:\n"
            f"#   real kernel: {actual}\n#   fake:        {expected}\n"
            f"# e.g. allocate with the real shape/dtype: "
            + ("at::empty(sizes, x.options().dtype(dtype))" if reg.style == "cpp" else
               "x.new_empty(shape, dtype=dtype)"))


def _overload_name(reg: Registration) -> str:
    return reg.name if reg.overload in ("default", "") else f"{reg.name}.{reg.overload}"
