"""The torch.compile backends: "graphex" and its alias "npugraph_ex".

    torch.compile(model, backend="graphex", fullgraph=True, dynamic=False, options={...})

Both names are registered as `torch_dynamo_backends` entry points, so they work
without `import graphex` once the package is installed; `import graphex`
registers them too (the alias only when no other package has taken the name).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx

from .compile import compile_dynamo_graph
from .options import Options
from ._warn import warn_once

_MODES = (None, "default", "reduce-overhead", "max-autotune-no-cudagraphs")


def graphex_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, options: dict[str, Any] | None = None,
                    mode: str | None = None, **kwargs: Any) -> Callable[..., Any]:
    """torch.compile backend: capture the ATen graph once and replay it from C++."""
    opts = Options.from_user(options)
    if kwargs:
        from .errors import OptionsError

        raise OptionsError(f"graphex: unexpected backend arguments {sorted(kwargs)}; pass settings as "
                           "torch.compile(..., options={...}).")
    if mode not in _MODES:
        warn_once(f"mode:{mode}", f"graphex: torch.compile mode={mode!r} has no meaning for graphex and is ignored.")
    return compile_dynamo_graph(gm, example_inputs, opts)


def npugraph_ex_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
    """The name npugraph_ex scripts use; the same backend as "graphex"."""
    return graphex_backend(gm, example_inputs, **kwargs)


def register() -> None:
    """Register "graphex", and "npugraph_ex" unless another package provides it."""
    from torch._dynamo.backends import registry

    if "graphex" not in registry._COMPILER_FNS:
        registry.register_backend(graphex_backend, name="graphex")
    existing = registry._BACKENDS.get("npugraph_ex")
    ours = existing is None or getattr(existing, "value", "").startswith("graphex.")
    if "npugraph_ex" not in registry._COMPILER_FNS and ours:
        registry.register_backend(npugraph_ex_backend, name="npugraph_ex")
