"""Which files each `graphex new` command writes, and what to run next."""

from __future__ import annotations

from . import cppstyle, mre, pystyles, usage
from .files import File
from .spec import OpSpec

from .styles import STYLES  # noqa: E402,F401  (re-exported: prompts, new)


def op_files(spec: OpSpec, style: str) -> list[File]:
    registered = f"{spec.op}: schema and kernel"
    if style == "custom_op":
        pystyles.check_python(spec, custom_op=True)
        files = [File(f"{spec.module}.py", pystyles.custom_op_module(spec), f"{registered} (custom_op), fake function")]
    elif style == "library":
        pystyles.check_python(spec, custom_op=False)
        files = [File(f"{spec.module}.py", pystyles.library_module(spec), f"{registered} (Library), Meta function")]
    else:
        cppstyle.check_cpp(spec)
        files = [
            File(f"{spec.module}.cpp", cppstyle.cpp_source(spec), f"{registered}, CPU and Meta kernels (C++)"),
            File(f"{spec.module}.py", cppstyle.loader_module(spec), f"builds {spec.module}.cpp on import and loads it"),
        ]
    return files + [
        File("repro.py", usage.repro(spec), "minimal reproducer: the op under graphex vs eager"),
        File(f"test_{spec.name}.py", usage.test_file(spec), "pytest: graphex vs eager, torch.library.opcheck"),
    ]


def op_next_steps(spec: OpSpec) -> list[str]:
    return ["python repro.py", f"python -m pytest test_{spec.name}.py"]


def mre_files(cache: bool) -> list[File]:
    if cache:
        return [File("repro_cache.py", mre.cache_template(), "reproducer with graphex.inference.cache_compile")]
    return [File("repro.py", mre.standard_template(), 'reproducer with torch.compile(backend="graphex")')]


def meta_skeleton(spec: OpSpec, style: str) -> str:
    """The fake/Meta registration alone, for an op that already works in eager: code to paste into the user's
    script, complete (imports included) and pasteable again or per op (Note [A printed fix pastes twice])."""
    if style in ("custom_op", "library"):
        pystyles.check_python(spec, custom_op=style == "custom_op")
    if style == "custom_op":
        return "\n".join([*pystyles.printed_imports(spec), "", "", *pystyles.fake_block(spec)]) + "\n"
    if style == "library":
        return _python_meta(spec) + "\n"
    cppstyle.check_cpp(spec)
    guard = f"GRAPHEX_META_{spec.namespace}_{spec.name}"
    return "\n".join([
        "#include <ATen/ATen.h>", "#include <torch/library.h>", f"#ifndef {guard}  // pasted twice, compiled once",
        f"#define {guard}", *cppstyle.meta_kernel(spec), "", *cppstyle.meta_registration(spec), f"#endif  // {guard}",
        "", "# Or, op-plugin style, from Python (import it before torch.compile runs):", "",
        _python_meta(spec),
    ]) + "\n"


def _python_meta(spec: OpSpec) -> str:
    from graphex.custom_ops.fixes import namespace_library

    lines, lib = namespace_library(spec.namespace)
    typing_lines = [line for line in pystyles.printed_imports(spec) if line and line != "import torch"]
    return "\n".join([*typing_lines, *([""] if typing_lines else []), lines, "", *pystyles.meta_block(spec, lib=lib)])
