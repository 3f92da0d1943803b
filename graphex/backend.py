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
    """Make "graphex" and "npugraph_ex" known to torch.compile.

    Names declared as entry points are left to torch, which loads them on first
    lookup (registering them here as well would make that lookup fail as a
    duplicate). If another installed package also declares "npugraph_ex" (the
    real torch_npu), its declaration is the one kept.
    """
    from importlib.metadata import entry_points

    from torch._dynamo.backends import registry

    registry._discover_entrypoint_backends()
    others = [ep for ep in entry_points(group="torch_dynamo_backends", name="npugraph_ex")
              if not ep.value.startswith("graphex.")]
    if others and "npugraph_ex" not in registry._COMPILER_FNS:
        registry._BACKENDS["npugraph_ex"] = others[0]
    for name, fn in (("graphex", graphex_backend), ("npugraph_ex", npugraph_ex_backend)):
        if name in registry._COMPILER_FNS or registry._BACKENDS.get(name) is not None:
            continue
        registry.register_backend(fn, name=name)
