"""The runtime layer: what runs a compiled graph's program once it is lowered.

  compiled_graph  CompiledGraph, the one runner AOTAutograd calls, in explicit phases (Note [A compiled graph
                  runs in explicit phases]); live_graphs; the replay errors graphex._C raises through it
  device_graphs   the program captured into an accelerator's graph and replayed (docs/device-graphs.md)
  dump            GRAPHEX_DUMP: a graph and its program written out for a bug report
  debug_dump      dump_tensor_data: every op's output of a run, for triage

It imports the lowering and passes below it, never the artifact layers (cache_compile, export) or the backend
above (Note [Layers only look down], pyproject.toml).
"""

from .compiled_graph import CompiledGraph, Phase, live_graphs, make_replay_error  # noqa: F401
