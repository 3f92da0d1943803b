"""--style cpp: a C++ source (TORCH_LIBRARY_FRAGMENT + CPU and Meta kernels) and the module that loads it.

Note [Generated C++ ops share their namespace]
The schema is defined in a TORCH_LIBRARY_FRAGMENT: a process aborts at the second TORCH_LIBRARY
of one namespace, and two generated ops (graphex new op mylib::a / mylib::b --style cpp) are two
libraries of the namespace mylib, loaded together.

The loader builds the source with torch.utils.cpp_extension.load on first import. The source
includes only <torch/library.h> and narrow ATen headers: <torch/torch.h> or
<torch/extension.h> would pull in all of libtorch's headers and multiply the build time.
"""

from __future__ import annotations

from . import placeholder
from .pystyles import meta_block, unannotated_params
from .spec import OpSpec, SkeletonError
from .text import cpp_fn, cpp_str, indent, join
from ...custom_ops.typemap import TYPES, cpp_return

_META_NOTE = "// Shape, dtype and device only, never data: torch.compile traces the op with this."


def check_cpp(spec: OpSpec) -> None:
    for arg in spec.args:
        if TYPES[arg.type].cpp is None:
            raise SkeletonError(f"graphex new: the cpp style does not generate {arg.type} parameters ({arg.name}; "
                                "a kernel takes bool[N] as std::array<bool, N>). Use --style custom_op or "
                                "library, or write that parameter by hand.")


def cpp_source(spec: OpSpec) -> str:
    params = _params(spec)
    ret = cpp_return(spec.returns)
    includes = ["#include <ATen/core/Tensor.h>"]
    if spec.returns:
        includes.append("#include <ATen/ops/empty_like.h>")
    includes.append("#include <torch/library.h>")
    if len(spec.returns) > 1:
        includes += ["", "#include <tuple>"]
    elif spec.returns == ("Tensor[]",):
        includes += ["", "#include <vector>"]
    return join(
        f"// {spec.op}: schema, CPU kernel and Meta kernel.",
        f"// {spec.module}.py builds and loads this file.",
        "//",
        "// Narrow headers keep the build short: <torch/torch.h> or <torch/extension.h> would pull in",
        "// every libtorch header.",
        includes,
        "",
        "namespace {",
        "",
        cpp_fn(ret, f"{spec.name}_cpu", params),
        indent(placeholder.cpp_impl(spec), 2),
        "}",
        "",
        meta_kernel(spec),
        "",
        "}  // namespace",
        "",
        "// A fragment: a process aborts at a namespace's second TORCH_LIBRARY block, and other ops of",
        f"// {spec.namespace} (another generated file, a Python Library) add to the same namespace.",
        f"TORCH_LIBRARY_FRAGMENT({spec.namespace}, m) {{",
        ["  // An in-place op declares every input it writes (Tensor(a!)) and returns none of them."]
        if spec.inplace else [],
        f"  m.def({cpp_str(spec.schema)});",
        "}",
        "",
        f"TORCH_LIBRARY_IMPL({spec.namespace}, CPU, m) {{",
        f'  m.impl("{spec.name}", &{spec.name}_cpu);',
        "}",
        "",
        meta_registration(spec),
    )


def meta_kernel(spec: OpSpec) -> list[str]:
    return [_META_NOTE, *cpp_fn(cpp_return(spec.returns), f"{spec.name}_meta", _params(spec)),
            *indent(placeholder.cpp_meta(spec), 2), "}"]


def meta_registration(spec: OpSpec) -> list[str]:
    return [f"TORCH_LIBRARY_IMPL({spec.namespace}, Meta, m) {{", f'  m.impl("{spec.name}", &{spec.name}_meta);', "}"]


def loader_module(spec: OpSpec) -> str:
    alternative = ["import torch", "", *meta_block(spec, unannotated_params(spec), "", blank=1)]
    return join(
        f'"""{spec.op} from C++: importing this module builds {spec.module}.cpp and loads it.',
        "",
        "The build is cached in build/ next to this file (under $TORCH_EXTENSIONS_DIR when that is set)",
        "and redone only when the source changes; the first import compiles for a minute or less.",
        '"""',
        "",
        "import os",
        "",
        "from torch.utils import cpp_extension",
        "",
        "_HERE = os.path.dirname(os.path.abspath(__file__))",
        "",
        'if os.environ.get("TORCH_EXTENSIONS_DIR"):',
        f"    _build_dir = None  # torch builds in $TORCH_EXTENSIONS_DIR/{spec.module}",
        "else:",
        f'    _build_dir = os.path.join(_HERE, "build", "{spec.module}")',
        "    os.makedirs(_build_dir, exist_ok=True)",
        "",
        "cpp_extension.load(",
        f'    name="{spec.module}",',
        f'    sources=[os.path.join(_HERE, "{spec.module}.cpp")],',
        '    extra_cflags=["-O1"],  # a small kernel: a quick build matters more than -O3',
        "    build_directory=_build_dir,",
        "    is_python_module=False,  # the library registers its ops itself (TORCH_LIBRARY_FRAGMENT)",
        ")",
        "",
        "# Alternative, the op-plugin style: the C++ library keeps the schema and the CPU kernel and the",
        f"# Meta function is registered from Python. Delete TORCH_LIBRARY_IMPL({spec.namespace}, Meta, m)",
        f"# from {spec.module}.cpp, then add here:",
        "#",
        [f"#   {line}".rstrip() for line in alternative],
    )


def _params(spec: OpSpec) -> list[str]:
    params = []
    for arg in spec.args:
        cpp = "at::Tensor&" if arg.mutable and arg.type == "Tensor" else TYPES[arg.type].cpp
        params.append(f"{cpp} {arg.name}")
    return params
