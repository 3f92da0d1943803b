"""The code to paste: fixes for custom-op problems, written in the user's own registration style."""

from __future__ import annotations

import re
import textwrap

import torch

from .registration import Registration


# Note [A printed fix pastes twice]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Every fix that adds code is complete where it is pasted (its imports included) and
# can be pasted again, or once per op of a namespace, and still work:
#  - Python registrations go on one torch.library.Library per namespace, made the
#    first time and kept in the module's globals (`_graphex_libs`), so no fix binds a
#    name the script already uses (rebinding `lib` or `meta_lib` would collect the
#    Library it held, and everything registered on it with it) and a second paste
#    reuses the Library instead of making another. Registering the same function
#    again overrides the first (`lib.impl(..., allow_override=True)`: the default only
#    since torch 2.13), and register_fake likewise.
#  - A C++ Meta kernel sits inside an #ifndef of its own, so pasted twice it is
#    compiled once; TORCH_LIBRARY_IMPL(ns, Meta, m) may appear once per op.
#  - A line that replaces one of the user's (a schema, a decorator) uses the user's
#    own names: the variable their define is called on (registration.defining_library).
# tests/python/test_fixes_apply.py pastes each one once and twice, and for two ops of
# one namespace, runs the script and compiles it with backend='graphex'.
def namespace_library(namespace: str) -> tuple[str, str]:
    """(the lines that make and keep the one Library of `namespace` fixes register on, the expression for it)."""
    expr = f'_graphex_libs["{namespace}"]'
    lines = ("import torch\n\n"
             "# one torch.library.Library per namespace, made once and kept alive (a collected Library unregisters\n"
             "# everything registered on it); pasted again, or for another op, this reuses it\n"
             '_graphex_libs = globals().setdefault("_graphex_libs", {})\n'
             f'if "{namespace}" not in _graphex_libs:\n'
             f'    {expr} = torch.library.Library("{namespace}", "FRAGMENT")\n')
    return lines, expr


def python_meta(reg: Registration, function: str) -> str:
    """`function` (a def) registered as the Meta kernel of `reg`, on its namespace's one Library."""
    lines, lib = namespace_library(reg.namespace)
    name = re.match(r"\s*def (\w+)\(", function)
    assert name is not None, function
    return f"{lines}\n\n{function.rstrip()}\n\n\n{meta_registration(lib, _overload_name(reg), name.group(1))}\n"


def meta_registration(lib: str, op: str, function: str) -> str:
    """The line that registers `function` as the Meta kernel of `op` on the Library `lib`; pasted again, it
    replaces the first (allow_override: torch <= 2.12 refuses a second Python kernel for one key without it)."""
    return f'{lib}.impl("{op}", {function}, "Meta", allow_override=True)  # pasted again, it replaces the first'



def _library_var(reg: Registration) -> str:
    """The name of the user's Library that defines `reg` (for a line that replaces their define)."""
    from .registration import defining_library

    return defining_library(reg) or "lib"


def params(schema: torch._C.FunctionSchema) -> str:
    return ", ".join(a.name for a in schema.arguments)


def _annotated_params(reg: Registration) -> str:
    """The parameters of a custom_op's function as the user wrote them (custom_op needs their annotations)."""
    import inspect

    from torch._library.custom_ops import OPDEFS

    fn = getattr(OPDEFS.get(reg.qualname), "_init_fn", None)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return params(reg.schema)
    out: list[str] = []
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not any(o.startswith("*") for o in out):
            out.append("*")
        text = ("*" if p.kind is p.VAR_POSITIONAL else "") + p.name
        if p.annotation is not p.empty:
            ann = p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)
            text += f": {ann}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        out.append(text)
    return ", ".join(out)


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


def unknown_fake_body(schema: torch._C.FunctionSchema, unknown: str, *, indent: str = "    ") -> str:
    """The body when no shape rule could be inferred: a marked TODO that stops, not a guess."""
    del unknown  # shown next to the fix (the report's note), not repeated in the code
    return (f"{indent}# TODO: graphex could not infer the output shape of {schema.name} (see the note).\n"
            f"{indent}# Compute it from the inputs' shapes and non-tensor arguments, never their data, e.g.\n"
            f"{indent}#   return x.new_empty((x.shape[0], n))\n"
            f'{indent}raise NotImplementedError("TODO: the fake of {schema.name}")')


def missing_fake(reg: Registration, body: str | None = None, *, unknown: str | None = None) -> str:
    """The fake to add; `body` (indented lines) replaces the TODO skeleton when the shape rule is known;
    `unknown` (what was seen) says that it could not be inferred."""
    s = reg.schema
    proposed = body is not None
    if body is None:
        body = unknown_fake_body(s, unknown) if unknown is not None and s.returns else fake_body(s)
    if reg.style == "custom_op":
        return (f"import torch\n\n\n@{reg.python_name}.register_fake\n"
                f"def _({params(s)}):\n{body}")
    hint = vanished_meta_hint(reg)
    if hint:
        return hint
    meta = python_meta(reg, f"def {reg.name}_meta({params(s)}):\n{body}")
    if reg.style == "library":
        return meta
    line = body.strip()
    rule = line[len("return "):].split("  #")[0] if line.startswith("return ") and "\n" not in line else None
    return (f"// in C++, next to TORCH_LIBRARY({reg.namespace}, m):\n"
            f"{cpp_meta_skeleton(reg, rule if proposed else None, unknown=unknown)}\n\n"
            f"# or from Python (the op-plugin style), before torch.compile runs:\n{meta}")


def vanished_meta_hint(reg: Registration) -> str | None:
    """When the user's code did register a Meta function for the op on a `Library` that has since been
    collected (Note [A Meta registration that vanished], registration.py): what to change instead."""
    from .registration import vanished_meta

    found = vanished_meta(reg)
    if found is None:
        return None
    function = found.function or (f"def {reg.name}_meta({params(reg.schema)}):\n"
                                  f"    ...  # your Meta function, unchanged")
    return (f"# {found.where}: a Meta function for {reg.qualname} is registered on `{found.var}`,\n"
            f"# a torch.library.Library that was garbage-collected since"
            + (f" (`{found.var}` is bound to a new Library at {found.rebound})" if found.rebound else "")
            + ",\n# and a collected Library unregisters everything registered on it. Register it on a Library "
            f"that stays alive\n# instead (this replaces your @impl({found.var}, ...) registration):\n"
            + python_meta(reg, function))


def cpp_meta_skeleton(reg: Registration, rule: str | None = None, *, unknown: str | None = None) -> str:
    """A complete Meta kernel (Note [A C++ Meta skeleton compiles]). `rule`: the Python expression the
    fake returns, when known (translated where it is simple); `unknown`: why no rule could be inferred."""
    s = reg.schema
    first = _first_tensor(s) or "x"
    ret = "void" if not s.returns else ("at::Tensor" if len(s.returns) == 1
                                        else f"std::tuple<{', '.join(['at::Tensor'] * len(s.returns))}>")
    body = "" if not s.returns else (
        f"  // TODO: the shape/dtype {s.name} really returns; never read tensor data here\n"
        + (f"  return at::empty_like({first});" if len(s.returns) == 1 else
           f"  return {{{', '.join(f'at::empty_like({first})' for _ in s.returns)}}};"))
    todo = None
    if unknown is not None and s.returns:
        todo = f"TODO: the output shape of {s.name}; graphex could not infer it"
    elif rule is not None and s.returns:
        cpp = _cpp_empty_like(rule)
        body = f"  return {cpp};" if cpp else ""
        todo = None if cpp else f"TODO: in ATen, the shape rule graphex inferred: {rule}"
    if todo is not None:
        # No guess that would compile and return the wrong shape: a loud stop until it is written.
        body = (f"  // {todo}\n"
                f'  TORCH_CHECK(false, "{_c_string(todo)}");\n'
                f"  return {{}};")
    guard = re.sub(r"\W", "_", f"GRAPHEX_META_{reg.qualname}_{reg.overload}")
    return (f"#include <ATen/ATen.h>\n#include <torch/library.h>\n"
            f"#ifndef {guard}  // pasted twice, compiled once\n#define {guard}\n"
            f"{ret} {reg.name}_meta({cpp_params(s)}) {{\n{body}\n}}\n"
            f"TORCH_LIBRARY_IMPL({reg.namespace}, Meta, m) {{\n"
            f'  m.impl("{_overload_name(reg)}", &{reg.name}_meta);\n}}\n'
            f"#endif  // {guard}")


# Note [A C++ Meta skeleton compiles]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The C++ fix is a whole function: the schema's parameters with the C++ types the
# dispatcher passes (typemap.TYPES, the table `graphex new --style cpp` uses; a
# written `Tensor(a!)` is `at::Tensor&`), and a body that either follows a rule
# graphex verified or stops with TORCH_CHECK(false, "TODO ...") -- never an
# `empty_like` guess that compiles and then plans the wrong shape.
# tests/python/test_fixes_apply.py compiles one.
def cpp_params(schema: torch._C.FunctionSchema) -> str:
    from .typemap import TYPES

    text = str(schema).split("(", 1)[1].rsplit(") ->", 1)[0]
    out = []
    for arg in _split_top(text):
        type_, sep, name = arg.partition(" ")
        if not sep:  # `*`: keyword-only from here; C++ takes them in order
            continue
        written = "!" in type_
        base = re.sub(r"\([a-z]!?\)", "", type_)
        info = TYPES.get(base)
        cpp = "at::Tensor&" if written and base == "Tensor" else (info.cpp if info and info.cpp else None)
        out.append(f"{cpp or '/* ' + base + ' */ auto'} {name.split('=', 1)[0]}")
    return ", ".join(out)


def _c_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


_ATEN_DTYPES = {"torch.float32": "at::kFloat", "torch.float64": "at::kDouble", "torch.float16": "at::kHalf",
                "torch.bfloat16": "at::kBFloat16", "torch.int64": "at::kLong", "torch.int32": "at::kInt",
                "torch.int16": "at::kShort", "torch.int8": "at::kChar", "torch.uint8": "at::kByte",
                "torch.bool": "at::kBool"}


def _cpp_empty_like(rule: str) -> str | None:
    """`torch.empty_like(x[, dtype=...])` in ATen; None for anything else."""
    m = re.fullmatch(r"torch\.empty_like\((\w+)(?:, dtype=([\w.]+))?\)", rule.strip())
    if m is None:
        return None
    x, dtype = m[1], m[2]
    if dtype is None:
        return f"at::empty_like({x})"
    aten = _ATEN_DTYPES.get(dtype) or (f"{dtype[:-len('.dtype')]}.scalar_type()" if dtype.endswith(".dtype") else None)
    return f"at::empty_like({x}, {x}.options().dtype({aten}))" if aten else None


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


def no_mutated_return(reg: Registration, mutated: list[str] | None = None) -> str:
    """`mutated`: the arguments the kernel writes (default: those the schema marks `(a!)`)."""
    s = reg.schema
    declared = [a.name for a in s.arguments if a.alias_info is not None and a.alias_info.is_write]
    if mutated is None:
        mutated = declared
        fixed = str(s).rsplit(" -> ", 1)[0] + " -> ()"
        fixed = fixed.split("::", 1)[1]
        if "." in fixed.split("(", 1)[0]:
            fixed = fixed.split(".", 1)[0] + "(" + fixed.split("(", 1)[1]
    else:
        mutated = list(dict.fromkeys(declared + list(mutated)))
        fixed = schema_text(s, write=tuple(mutated), returns="()")
    if reg.style == "custom_op":
        return (f"# its decorator and signature (the body as yours, without its return of {', '.join(mutated)}):\n"
                f'@torch.library.custom_op("{reg.qualname}", mutates_args={_mutates_args(mutated)})\n'
                f"def {reg.python_name}({_annotated_params(reg)}) -> None:\n"
                f"    ...  # mutate {', '.join(mutated)} in place; return nothing\n\n\n"
                f"# its fake (it replaces yours):\n"
                f"@{reg.python_name}.register_fake\n"
                f"def _({params(s)}) -> None:\n"
                f"    return None")
    if reg.style == "library":
        old = str(s).split("::", 1)[1]
        return (f"# 1. in the definition of {reg.qualname}, instead of \"{old}\":\n"
                f'{_library_var(reg)}.define("{fixed}")  # no return: {", ".join(mutated)} is updated in place\n'
                f"# 2. its kernel returns None: drop its `return` of {', '.join(mutated)}\n"
                f"# 3. its Meta function (it replaces yours, if you have one):\n"
                + python_meta(reg, f"def {reg.name}_meta({params(s)}):\n    return None"))
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


# -- schema edits (graphex check): declare or drop writes, return a fresh tensor -------------------
def schema_text(schema: torch._C.FunctionSchema, *, write: tuple[str, ...] = (), unwrite: tuple[str, ...] = (),
                returns: str | None = None) -> str:
    """The schema as `define`/`m.def` takes it (no namespace), with `(a!)` added to `write` arguments,
    removed from `unwrite` ones, and the returns replaced when `returns` is given."""
    text = str(schema).split("::", 1)[1]
    head, rest = text.split("(", 1)
    depth, end = 1, 0
    for end, ch in enumerate(rest):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if depth == 0:
            break
    args, ret = rest[:end], rest[end + 1:].split("->", 1)[1].strip()
    used = set(re.findall(r"\(([a-z])!?\)", text))
    free = iter(c for c in "abcdefghijklmnopqrstuvwxyz" if c not in used)
    out = []
    for arg in _split_top(args):
        type_, sep, name = arg.partition(" ")  # types have no spaces; `*` (keyword-only from here) has no name
        if not sep:
            out.append(arg)
            continue
        base = name.split("=", 1)[0]
        if base in unwrite:
            type_ = re.sub(r"\([a-z]!?\)", "", type_)
        if base in write and "!" not in type_ and type_.startswith("Tensor"):
            type_ = f"Tensor({next(free)}!)" + type_[len("Tensor"):]
        name = re.sub(r"=([-+]?[\d.]+[eE][-+]?\d+|[-+]?\d+\.\d+)$", lambda m: f"={float(m[1])!r}", name)
        out.append(f"{type_} {name}")
    return f"{head}({', '.join(out)}) -> {returns if returns is not None else ret}"


def _split_top(args: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in args:
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + ([cur.strip()] if cur.strip() else [])


def _mutates_args(names: list[str]) -> str:
    return "(" + ", ".join(f'"{n}"' for n in names) + ("," if len(names) == 1 else "") + ")"


def declare_mutation(reg: Registration, names: list[str]) -> str:
    """The kernel writes `names` but the registration does not say so."""
    s = reg.schema
    if reg.style == "custom_op":
        declared = [a.name for a in s.arguments if a.alias_info is not None and a.alias_info.is_write]
        return (f'@torch.library.custom_op("{reg.qualname}", mutates_args={_mutates_args(declared + names)})\n'
                f"def {reg.python_name}({params(s)}):  # writes {', '.join(names)} in place\n    ...")
    text = schema_text(s, write=tuple(names))
    why = f"(a!): the kernel writes {', '.join(names)} in place"
    if reg.style == "library":
        return f'{_library_var(reg)}.define("{text}")  # {why}'
    return f'm.def("{text}");  // {why}'


def undeclare_mutation(reg: Registration, names: list[str]) -> str:
    """The registration declares writes to `names` that the kernel never made."""
    s = reg.schema
    note = (f"never written on the recorded calls: {', '.join(names)}; if the kernel writes them only on "
            f"other inputs, keep the declaration")
    if reg.style == "custom_op":
        declared = [a.name for a in s.arguments
                    if a.alias_info is not None and a.alias_info.is_write and a.name not in names]
        return (f'@torch.library.custom_op("{reg.qualname}", mutates_args={_mutates_args(declared)})\n'
                f"def {reg.python_name}({params(s)}):  # {note}\n    ...")
    text = schema_text(s, unwrite=tuple(names))
    if reg.style == "library":
        return f'{_library_var(reg)}.define("{text}")  # {note}'
    return f'm.def("{text}");  // {note}'


def return_clone(reg: Registration, output: int, arg: str) -> str:
    """Output `output` is `arg` itself or a view of it: return new memory instead."""
    s = reg.schema
    aliased_return = any(r.alias_info is not None for r in s.returns)
    # Read-only alias annotations (Tensor(a)) go from the arguments too; written ones (a!) stay.
    views = tuple(a.name for a in s.arguments if a.alias_info is not None and not a.alias_info.is_write)
    fixed_schema = schema_text(s, unwrite=views, returns=_plain_returns(s))
    if reg.style == "cpp":
        fix = f"return {arg}.clone();  // output {output}: new memory, not {arg} or a view of it"
        return fix + (f'\nm.def("{fixed_schema}");' if aliased_return else "")
    fix = (f"# in the kernel of {reg.qualname}, output {output}:\n"
           f"return {arg}.clone()  # new memory, not {arg} or a view of it (e.g. {arg}.view(...).clone())")
    if aliased_return and reg.style == "library":
        fix += f'\n{_library_var(reg)}.define("{fixed_schema}")  # no alias annotations: a new tensor comes back'
    return fix


def _plain_returns(s: torch._C.FunctionSchema) -> str:
    types = ["Tensor" if isinstance(r.type, torch.TensorType) else str(r.type) for r in s.returns]
    return types[0] if len(types) == 1 else "(" + ", ".join(types) + ")"


def fake_reads_data(reg: Registration) -> str:
    """The fake reads tensor values (.item(), .tolist(), numpy): fakes have shapes, not data."""
    s = reg.schema
    first = _first_tensor(s) or "x"
    size = next(n for n in ("size", "n_out", "dyn_size") if n not in {a.name for a in s.arguments})
    body = ("    # compute the output shape from shapes and non-tensor arguments, never from tensor values;\n"
            "    # when it truly depends on values (like nonzero), use an unbacked size:\n"
            f"    {size} = torch.library.get_ctx().new_dynamic_size()\n"
            f"    return {first}.new_empty(({size}, *{first}.shape[1:]))  # the value-dependent dim first, "
            f"the others as {first}'s: check that yours are")
    if reg.style == "custom_op":
        return f"import torch\n\n\n@{reg.python_name}.register_fake\ndef _({params(s)}):\n{body}"
    return (f"# a Meta function cannot create unbacked sizes; register a fake instead of the Meta function:\n"
            f"import torch\n\n\n"
            f'@torch.library.register_fake("{reg.qualname}")\n'
            f"def {reg.name}_fake({params(s)}):\n{body}")
