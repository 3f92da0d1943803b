"""Everything graphex needs from torch's private modules that may differ between versions.

graphex supports torch 2.11 through 2.15 (pyproject.toml). Private APIs are reached
through this package, so a version difference is handled in one place, each branch
with a note of what differs and since which version; one module per area of torch:

  _base        the torch version; TorchInternalChanged
  fx           torch.fx: the create-node hook, the insertion point
  inductor     the reinplacing pass and its table, the fake-tensor updater, the no-op
               registry, the pattern matcher's register_replacement
  library      torch.library: trivial fakes, effectful ops, where an op was registered
  dynamo       the backend tracing on this thread, config, sources, guards, side effects
  aot          what AOTAutograd's runtime wrapper would do per call, from its metadata
  distributed  the process groups of this process
  devices      the graph class a device captures with, streams, traced side streams

Callers use the package (`compat.on_stream`, `from ..compat import fake_tensor_updater`);
every public name is re-exported here (and `_device_graph_class`, which the device tests read). Nothing here changes torch:
Note [graphex never patches torch] (no module attribute, class method or table of
torch's is replaced; what graphex changes is scoped to its own compile on the
compiling thread).

Checked on every release of the range by the whole suite (`make test-torch TORCH=X`; the
docs/backend.md's support table), and each private name by tests/python/test_torch_internals.py.
"""

from __future__ import annotations

from ._base import (  # noqa: F401
    TORCH_VERSION,
    SUPPORTED,
    TorchInternalChanged,
)

from .fx import (  # noqa: F401
    on_node_created,
    insertion_successor,
)

from .inductor import (  # noqa: F401
    inplaceable_ops_table,
    is_foreach_entry,
    view_scatter_ops,
    around_reinplacing,
    may_overlap,
    fake_tensor_updater,
    noop_source,
    register_replacement,
)

from .library import (  # noqa: F401
    trivial_fake,
    register_ordered_effect,
    operator_registrations,
)

from .dynamo import (  # noqa: F401
    current_dynamo_backend,
    raised_by_traced_code,
    in_graphex_trace,
    recompile_limit,
    source_name,
    guard_recorder,
    treespec_children,
    opaque_guard_fn,
    SideEffect,
    dynamo_side_effects,
)

from .aot import (  # noqa: F401
    why_aot_wrapper_is_needed,
    mutated_in_graph,
    new_outputs,
)

from .distributed import (  # noqa: F401
    process_groups,
    process_group_by_name,
    process_group_timeout,
)

from .devices import (  # noqa: F401
    _device_graph_class,
    has_device_graphs,
    new_device_graph,
    on_stream,
    wait_stream,
    entry_stream,
    traces_side_streams,
)
