"""graphex: capture a model's ATen graph once with torch.compile and replay it from C++.

    import torch, graphex
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)

See docs/ (README.md links each page) for the options, custom operators, the compile cache and the tools.
"""

# Note [import graphex is quiet]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `import graphex` runs nothing: no torch import, no registration, no look at sys.argv. The backend
# names reach torch.compile through the package's `torch_dynamo_backends` entry points (pyproject.toml),
# which torch loads on the first lookup of "graphex" or "npugraph_ex", with or without `import graphex`;
# loading graphex.backend then registers them, and the custom-op checks (Note [Where custom-op errors
# are caught]), for the compile that asked. Every public name below is imported on first use
# (PEP 562), so `graphex --help` and `python -m graphex --help` answer without importing torch
# (Note [graphex --help does not import torch]). graphex's own operators (torch.ops.graphex*, the
# fused kernels) are registered by the engine, graphex._C: a module that calls them imports it
# itself, and so does a script that calls them directly (`import graphex._C`).

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it (one table: __getattr__, __dir__ and __all__ read it)
_PUBLIC = {
    "graphex_backend": "backend", "npugraph_ex_backend": "backend", "get_backend": "backend",
    "compile_fx": "backend",
    "Options": "options",
    "GraphexError": "errors", "OptionsError": "errors", "CaptureError": "errors", "ProgramError": "errors",
    "SignatureError": "errors", "FrozenInputReplaced": "errors", "ReplayError": "errors",
    "CustomOpError": "errors", "CacheError": "errors",
    "export": "exporting", "ExportError": "exporting",  # graphex.export is the function; the module is graphex.exporting
    "save_tensor": "save_tensor",  # print-like dump that survives replay
    "register_replacement": "fusion",  # fused mode's user patterns, npugraph_ex's API
    "GraphexWarning": "base.warn",  # every warning graphex gives: filter it by this category
}
_SUBPACKAGES = ("inference", "testing", "tools", "custom_ops", "fusion", "passes", "integrations")

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        from .base.warn import import_torch_quietly

        import_torch_quietly()  # Note [No DeprecationWarnings from importing graphex]
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    elif name in _SUBPACKAGES or name == "_C":
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'graphex' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, *_SUBPACKAGES})
