"""graphex: capture a model's ATen graph once with torch.compile and replay it from C++.

    import torch, graphex
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)

See README.md for the options, custom operators, the compile cache and the tools.
"""

from __future__ import annotations

from . import cli as _cli

if _cli.help_requested():  # `graphex --help`: answered before torch loads (Note [graphex --help does not import torch])
    _cli.answer_help()

import torch  # noqa: F401,E402  (loads libtorch before our extension)
from ._warn import import_torch_quietly as _import_torch_quietly  # noqa: E402

_import_torch_quietly()  # Note [No DeprecationWarnings from importing graphex]

from . import _C  # noqa: F401
from .backend import compile_fx, get_backend, graphex_backend, npugraph_ex_backend, register as _register
from .custom_ops import install_trace_checks as _install_trace_checks
from .errors import (
    CacheError,
    CaptureError,
    CustomOpError,
    GraphexError,
    OptionsError,
    ProgramError,
    ReplayError,
    SignatureError,
    FrozenInputReplaced,
)
from .options import Options
from ._warn import GraphexWarning  # noqa: E402  (every warning graphex gives: filter it by this category)
from .save_tensor import save_tensor  # noqa: E402  (print-like dump that survives replay)
from .exporting import ExportError, export  # graphex.export is the function; the module is graphex.exporting
from . import inference  # noqa: E402  (graphex.inference.cache_compile)
from .fusion import register_replacement  # noqa: E402  (fused mode's user patterns, npugraph_ex's API)

__version__ = "0.1.0"

_register()
_install_trace_checks()

__all__ = [
    "graphex_backend", "npugraph_ex_backend", "get_backend", "compile_fx", "Options", "GraphexError", "OptionsError", "CaptureError",
    "ProgramError", "SignatureError", "FrozenInputReplaced", "ReplayError", "CustomOpError", "CacheError", "export", "ExportError", "__version__",
    "save_tensor", "register_replacement", "GraphexWarning",
]
