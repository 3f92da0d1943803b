"""The torch.compile backends: "graphex" and its alias "npugraph_ex", and the entry points around them.

    torch.compile(model, backend="graphex", fullgraph=True, dynamic=False, options={...})
    torch.compile(model, backend=graphex.get_backend({...}))          # options bound once
    aot_module_simplified(gm, inputs, fw_compiler=graphex.compile_fx)  # frameworks driving AOTAutograd

Both names are registered as `torch_dynamo_backends` entry points, so they work
without `import graphex` once the package is installed; importing this module
registers them too (through torch's public `register_backend`) and adds the
custom-op checks (Note [import graphex is quiet]).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx

from .base.warn import import_torch_quietly

import_torch_quietly()  # Note [No DeprecationWarnings from importing graphex]: before inductor's modules load

from . import _C  # noqa: E402,F401  (the engine; registers the graphex:: operators)
from .compile import capture, compile_dynamo_graph  # noqa: E402
from .custom_ops import install_trace_checks  # noqa: E402
from .errors import OptionsError  # noqa: E402
from .options import Options  # noqa: E402
from .base.warn import warn_once  # noqa: E402

# torch.compile modes and what they mean here. None and "default" are the plain compile. "reduce-overhead" asks for
# the replay with the least host overhead per call, which is what graphex always does (torchair called its graph mode
# "reduce-overhead"): accepted, and the same compile (transformers' CompileConfig passes it by default).
_MODE_HELP = {
    "max-autotune": "it asks inductor to autotune its generated kernels; graphex runs eager's own kernels "
                    "(bit for bit equal to eager) and generates none",
    "max-autotune-no-cudagraphs": "it asks inductor to autotune its generated kernels; graphex runs eager's own "
                                  "kernels (bit for bit equal to eager) and generates none",
}


def _check_mode(mode: str | None) -> None:
    if mode in (None, "default", "reduce-overhead"):
        return
    why = _MODE_HELP.get(str(mode), "it is not a mode graphex knows")
    raise OptionsError(f"graphex: torch.compile(mode={mode!r}) is not supported by the graphex backend: {why}. "
                       "Remove mode= (graphex's settings go in options={...}; `graphex options` lists them).")


def graphex_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, options: dict[str, Any] | None = None,
                    mode: str | None = None, **kwargs: Any) -> Callable[..., Any]:
    """torch.compile backend: capture the ATen graph once and replay it from C++."""
    _check_mode(mode)
    opts = Options.from_user(options)
    if kwargs:
        raise OptionsError(f"graphex: unexpected backend arguments {sorted(kwargs)}; pass settings as "
                           "torch.compile(..., options={...}).")
    return compile_dynamo_graph(gm, example_inputs, opts)


def npugraph_ex_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
    """The name npugraph_ex scripts use; the same backend as "graphex"."""
    return graphex_backend(gm, example_inputs, **kwargs)


def get_backend(options: dict[str, Any] | Options | None = None) -> Callable[..., Any]:
    """A backend callable with `options` bound: `torch.compile(model, backend=graphex.get_backend({...}))`.

    The options are checked now (an unknown key raises OptionsError here, not at the first call).
    """
    opts = Options.from_user(options)

    def graphex_with_options(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        return compile_dynamo_graph(gm, example_inputs, opts)

    graphex_with_options._graphex_backend = True  # type: ignore[attr-defined]
    return graphex_with_options


def compile_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
               options: dict[str, Any] | Options | None = None) -> Callable[..., Any]:
    """For frameworks that run AOTAutograd themselves: compile one ATen graph it hands its compiler.

        aot_module_simplified(gm, inputs, fw_compiler=graphex.compile_fx)
        aot_module_simplified(gm, inputs, fw_compiler=functools.partial(graphex.compile_fx, options={...}))

    `gm` is the functional ATen graph (what AOTAutograd passes to fw_compiler /
    inference_compiler); the result takes the inputs as one list and returns a list
    (AOTAutograd's boxed calling convention), replayed by the C++ engine.
    """
    return capture(gm, list(example_inputs), Options.from_user(options))


for _fn in (graphex_backend, npugraph_ex_backend):
    _fn._graphex_backend = True  # type: ignore[attr-defined]  (compat.in_graphex_trace)


# Note [Two threads' first lookup of a name]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch looks a backend name up (torch._dynamo.lookup_backend) without a lock: two threads whose first
# torch.compile(backend="graphex") in the process overlap both find the name unregistered, both load the entry point,
# and every thread but the first fails torch's register_backend with "AssertionError: duplicate name: graphex" (any
# backend torch finds through an entry point does; found by a helper, 3 of 4 threads failing). graphex cannot close
# that window from here: the thread that loads the entry point registers the name after our import, and would fail
# itself if the import had registered it. So graphex's own compiles pass the backend function, which torch does not
# look up (cache_compile's uncached path, inference/uncached.py; capture.py passes its own), and docs/backend.md
# tells threaded callers to do the same or to look the name up once before starting threads.
def register() -> None:
    """Make "graphex" and "npugraph_ex" known to torch.compile, through torch's public API.

    Names torch already knows (from our entry points, or "npugraph_ex" from another
    package such as torch_npu) are left alone: torch loads entry points itself on
    first lookup. When another installed package also declares "npugraph_ex", which
    one torch picks is up to importlib's order, so we say so once.
    """
    from importlib.metadata import entry_points

    known = set(torch._dynamo.list_backends(exclude_tags=()))
    for name, fn in (("graphex", graphex_backend), ("npugraph_ex", npugraph_ex_backend)):
        if name not in known:
            torch._dynamo.register_backend(fn, name=name)
    others = [ep for ep in entry_points(group="torch_dynamo_backends", name="npugraph_ex")
              if not ep.value.startswith("graphex.")]
    if others:
        warn_once("npugraph_ex:taken",
                  f"graphex: another package ({others[0].value}) also provides the backend name 'npugraph_ex'; "
                  "torch uses whichever it finds first. Use backend='graphex' to be sure to get graphex.")


register()
install_trace_checks()  # Note [Where custom-op errors are caught]: before the first trace of the compile that asked
