"""graphex for transformers' generate(): one call gives the CompileConfig that works on every device.

    from graphex.integrations.transformers import compile_config
    model.generate(ids, cache_implementation="static", compile_config=compile_config())
    model.generate(ids, cache_implementation="static", compile_config=compile_config({"pattern_fusion_pass": True}))

transformers' generate() compiles the model's forward for the decode steps when the cache is a static one and
`compile_config` is given (its prefill stays eager). Two things of transformers' own make the plain
`CompileConfig(backend="graphex")` surprising, and compile_config() answers both:

- Note [generate() compiles on the CPU only when asked]: transformers compiles only on cuda, xpu, neuron and tpu
  devices unless the config's `_compile_all_devices` is set; elsewhere it logs "unable to meet the criteria for
  compilation" (visible only at transformers' warning level) and runs every step eagerly. graphex's engine is
  what a CPU user wants there, so compile_config() sets the flag. tests/python/test_transformers_generate.py
  fails if transformers renames it (no graph would be captured).
- torch.compile refuses `mode=` together with `options=`, and CompileConfig's default mode is "reduce-overhead"
  (which graphex accepts: it is what graphex always does). compile_config() passes mode only when there are no
  options, so fused mode needs no `mode=None` from the user.

The config names graphex's backend function rather than the string "graphex": torch looks a name up without a lock,
and threads whose first generate() calls overlap would fail with "duplicate name: graphex" (Note [Two threads' first
lookup of a name], graphex/backend.py). transformers never writes a CompileConfig to disk (save_pretrained drops it).

The options are checked here, when the config is made (an OptionsError names the bad key), not at the first
generate() step. transformers is imported only when compile_config() is called: graphex's runtime dependency
stays torch alone.
"""

from __future__ import annotations

from typing import Any

from ..backend import graphex_backend
from ..options import Options


def compile_config(options: dict[str, Any] | None = None, *, fullgraph: bool = True, dynamic: bool | None = False) -> Any:
    """A `transformers.CompileConfig` for generate() that compiles with graphex on any device.

    options: graphex's backend options (`graphex options` lists them), e.g. {"pattern_fusion_pass": True}.
    fullgraph, dynamic: as torch.compile's; the defaults are graphex's (one graph, static shapes: a static cache
    keeps the decode step's shapes fixed, so it is compiled once).
    """
    from transformers import CompileConfig

    Options.from_user(options)  # a bad key fails here, naming it
    return compile_on_every_device(CompileConfig(fullgraph=fullgraph, dynamic=dynamic, backend=graphex_backend,
                                                 mode=None if options else "reduce-overhead",
                                                 options=dict(options) if options else None))


def compile_on_every_device(config: Any) -> Any:
    """`config` (a transformers.CompileConfig, any backend) with generate() compiling on the CPU too: the one place
    that sets transformers' private flag (Note [generate() compiles on the CPU only when asked]); the benchmark and
    the coverage sweep use it for their inductor and Dynamo-only configs."""
    config._compile_all_devices = True
    return config
