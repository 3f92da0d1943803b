"""Everything graphex needs from torch's private modules that may differ between versions.

graphex supports torch 2.11 through 2.15 (pyproject.toml). Private APIs are reached
through this module, so a version difference is handled in one place, each branch
with a note of what differs and since which version. Nothing here changes torch:
Note [graphex never patches torch] (no module attribute, class method or table of
torch's is replaced; what graphex changes is scoped to its own compile on the
compiling thread).

Checked on: 2.13.0 (CI), 2.14.1 (`make test-torch TORCH=2.14.1`); 2.11 by the GPU
check script where a GPU is available.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.fx

TORCH_VERSION: tuple[int, int] = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])  # type: ignore[assignment]
SUPPORTED = ((2, 11), (2, 15))  # inclusive; pyproject.toml says the same


# -- inductor's reinplacing pass, with a table of our own ---------------------------------------

def inplaceable_ops_table(scatter_check: Callable[[torch.fx.Node], bool]) -> dict[Any, Any]:
    """A copy of inductor's table of functional ops and their in-place forms.

    The generalized scatter's `should_reinplace_scatter` check (a fusion heuristic: with no
    fusion, in place always wins; since 2.15 it also declines a scatter whose source is a view
    of its own base) is replaced by `scatter_check`. Built per call: inductor extends its table
    at import time (collectives), so a copy taken once could miss entries.
    """
    from torch._inductor.fx_passes import reinplace as inductor_reinplace

    table = dict(inductor_reinplace.inplaceable_ops)
    scatter = inductor_reinplace._generalized_scatter
    if scatter in table:
        op = table[scatter]
        table[scatter] = inductor_reinplace.InplaceableOp(op.inplace_op, op.mutated_arg, extra_check=scatter_check)
    return table


@functools.cache
def _core_code() -> tuple[types.CodeType, dict[str, Any], Any, Any]:
    from torch._inductor.fx_passes import reinplace as inductor_reinplace

    core = inductor_reinplace.reinplace_inplaceable_ops_core
    return core.__code__, core.__globals__, core.__defaults__, core.__closure__


def reinplace_inplaceable_ops(fake_tensor_updater: Any, graph: torch.fx.Graph, table: dict[Any, Any]) -> None:
    """inductor's `reinplace_inplaceable_ops`, reading `table` instead of its module-level table.

    The pass looks its table up as a module global; rather than swap that global
    for every thread, we run the same code with a globals mapping of our own in
    which `inplaceable_ops` is `table`. Same steps as inductor's driver (2.11-2.15):
    canonicalize view scatters, refresh fake tensors, reinplace, decompose scatters.
    """
    from torch._dispatch.python import enable_python_dispatcher
    from torch._inductor.fx_passes import reinplace as inductor_reinplace

    code, module_globals, defaults, closure = _core_code()
    scoped_globals = dict(module_globals, inplaceable_ops=table)
    core = types.FunctionType(code, scoped_globals, code.co_name, defaults, closure)
    with enable_python_dispatcher():
        inductor_reinplace.canonicalize_view_scatter_ops(graph)
        fake_tensor_updater.incremental_update()
        core(graph)
        inductor_reinplace.decompose_generalized_scatter(graph)


def fake_tensor_updater(gm: torch.fx.GraphModule) -> Any:
    """inductor's FakeTensorUpdater over `gm` (it re-runs fake propagation on the nodes a pass changed).

    It took the graph until torch 2.12 and takes the GraphModule since 2.13 (to update subgraphs too):
    handed a GraphModule, 2.11-2.12 fail inside on `gm.nodes`. Up to 2.12 it also told a changed node
    by `id(node.args)`, which a new args tuple can reuse once the old one is freed (then the node's fake
    value is silently left stale); 2.13 hashes the arguments themselves, and so does our 2.11-2.12 form.
    """
    if _updater_takes_module():
        from torch._inductor.fx_utils import FakeTensorUpdater

        return FakeTensorUpdater(gm)
    return _graph_updater_by_content()(gm.graph)


@functools.cache
def _graph_updater_by_content() -> type:
    from torch._inductor.fx_utils import FakeTensorUpdater
    from torch.utils import _pytree as pytree

    def content(args: Any) -> tuple[Any, ...]:
        leaves, spec = pytree.tree_flatten(args)
        out: list[Any] = [str(spec)]
        for leaf in leaves:
            try:
                hash(leaf)
                out.append(leaf)  # held, so a Node's id cannot be reused while we compare
            except TypeError:  # a slice (unhashable before Python 3.12), a list: by what it says
                out.append((type(leaf).__name__, repr(leaf)))
        return tuple(out)

    class UpdaterByContent(FakeTensorUpdater):  # type: ignore[misc, valid-type]
        def hash_node(self, node: torch.fx.Node) -> Any:
            return (node, node.target, content(node.args), content(node.kwargs))

    return UpdaterByContent


@functools.cache
def _updater_takes_module() -> bool:
    import inspect

    from torch._inductor.fx_utils import FakeTensorUpdater

    params = list(inspect.signature(FakeTensorUpdater.__init__).parameters)
    if params[1:2] == ["gm"]:
        return True
    if params[1:2] == ["graph"]:
        return False
    raise RuntimeError(f"graphex: torch {torch.__version__}'s FakeTensorUpdater takes {params[1:]}; graphex knows "
                       "(graph) (torch <= 2.12) and (gm) (torch >= 2.13): graphex/compat.py needs updating")


# -- custom ops without a fake (graphex/custom_ops/checks.py) --------------------------------------------------------

def trivial_fake(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """(True, result) when torch can fake `op` without a registered fake, as its own custom_op does.

    torch <= 2.12: only a mutating op that returns nothing (its fake returns None). 2.13 added
    out= and in-place ops (`generate_trivial_fake_impl`)."""
    from torch._library import utils

    if not utils.can_generate_trivial_fake_impl(op):
        return False, None
    generate = getattr(utils, "generate_trivial_fake_impl", None)
    return True, (generate(op, *args, **kwargs) if generate is not None else None)


# -- torch.fx: where a pass inserts a node ---------------------------------------------------------

@contextlib.contextmanager
def on_node_created(gm: torch.fx.GraphModule, hook: Callable[[torch.fx.Node], None]) -> Iterator[None]:
    """Call `hook(node)` for every node created in `gm`'s graph while the block runs (this graph only).

    GraphModule's create-node hooks (2.5+) run as the node is made, before it is linked in.
    """
    gm._register_create_node_hook(hook)
    try:
        yield
    finally:
        gm._unregister_create_node_hook(hook)


def insertion_successor(graph: torch.fx.Graph) -> torch.fx.Node | None:
    """The node a node created now will be inserted before (None at the end of the graph).

    The graph's insertion point is `anchor.prepend` (inserting_before, the default
    with the root) or `anchor.append` (inserting_after); both 2.0+.
    """
    insert = graph._insert
    anchor = getattr(insert, "__self__", None)
    if not isinstance(anchor, torch.fx.Node):
        return None
    node = anchor if getattr(insert, "__name__", "") == "prepend" else anchor.next
    return None if node.op == "root" else node


# -- Dynamo: which backend is tracing on this thread ----------------------------------------------

def current_dynamo_backend() -> Callable[..., Any] | None:
    """The backend of the Dynamo trace running on this thread, unwrapped, or None outside a trace.

    Dynamo keeps the instruction translator of the frame it traces in a thread-local
    (`InstructionTranslator.current_tx()`, 2.1+); its output graph holds the backend,
    wrapped by torch.compile (`_TorchCompileWrapper.compiler_fn`), by the debug wrapper
    (`_torchdynamo_orig_backend`) and by partials.
    """
    from torch._dynamo import symbolic_convert

    tx = getattr(symbolic_convert.tls, "current_tx", None)
    fn = getattr(getattr(tx, "output", None), "compiler_fn", None)
    for _ in range(16):  # unwrap, bounded
        if fn is None:
            return None
        inner = (getattr(fn, "_torchdynamo_orig_backend", None) or getattr(fn, "compiler_fn", None)
                 or (fn.func if isinstance(fn, functools.partial) else None) or getattr(fn, "__wrapped__", None))
        if inner is None or inner is fn:
            return fn
        fn = inner
    return fn


def in_graphex_trace() -> bool:
    """True while Dynamo traces, on this thread, for a graphex backend (Note [graphex never patches torch])."""
    return bool(getattr(current_dynamo_backend(), "_graphex_backend", False))


def recompile_limit() -> int:
    """Dynamo's per-code recompile limit (config `recompile_limit`; called `cache_size_limit` before 2.6)."""
    config = torch._dynamo.config
    return int(getattr(config, "recompile_limit", getattr(config, "cache_size_limit", 8)))


# -- torch.distributed: the process groups of this process ---------------------------------------

def process_groups() -> list[tuple[str, Any]]:
    """(name, ProcessGroup) of every group this process belongs to. Names are what functional
    collectives carry in a graph ('0' is the default group). `_world.pg_names` exists in 2.11-2.15."""
    from torch.distributed import distributed_c10d as c10d

    return sorted(((name, pg) for pg, name in c10d._world.pg_names.items()), key=lambda item: item[0])


def process_group_by_name(name: str) -> Any:
    """The ProcessGroup a functional collective's group name resolves to, or None."""
    from torch.distributed import distributed_c10d as c10d

    try:
        return c10d._resolve_process_group(name)
    except (KeyError, RuntimeError, ValueError):
        return None


def process_group_timeout(pg: Any) -> Any:
    """The timeout (datetime.timedelta) the group's CPU backend waits for its peers, or None."""
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return None


# -- effectful custom ops (graphex.save_tensor) ----------------------------------------------------

def register_ordered_effect(op: Any) -> None:
    """Mark `op` as having an ordered side effect: AOTAutograd wraps it in `with_effects` (threading a
    token), so it is neither dead-code eliminated nor reordered. torch 2.11-2.13 name the enum
    `_EffectType`; later versions also export `EffectType` (torch._library.effects)."""
    from torch._higher_order_ops import effects

    kinds = getattr(effects, "EffectType", None) or effects._EffectType
    effects._register_effectful_op(op, kinds.ORDERED)


# -- where an operator's schema and kernels were registered (graphex.export's deployability check) --

def operator_registrations(qualname: str) -> dict[str, str] | None:
    """For operator "ns::name" (or "ns::name.overload"): {"schema": file, dispatch key: file, ...} giving
    the file each registration came from (a .py file: registered from Python), or None if the operator
    is unknown. Read from the dispatcher's dump (torch._C._dispatch_dump, text stable since 2.0:
    "debug: registered at FILE:LINE" and "KEY: registered at FILE:LINE :: ...")."""
    try:
        text = torch._C._dispatch_dump(qualname)
    except RuntimeError:
        return None
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(": registered at ")
        if not sep:
            continue
        where = rest.split(" :: ", 1)[0].strip()
        out["schema" if key == "debug" else key.removesuffix("[alias]")] = where.rsplit(":", 1)[0]
    return out


# -- Dynamo's sources and guards (cache_compile: Note [cache_compile keys on what the trace read]) ----------------

def source_name(source: Any) -> str:
    """A Dynamo Source's access path (`L['func'].__self__.scale`). A method up to torch 2.11 (`source.name()`),
    a cached property since 2.12."""
    name = source.name
    return name() if callable(name) else name


def guard_recorder(on_guards: Callable[[list[Any]], None]) -> dict[str, Any]:
    """torch.compile options that hand Dynamo's guards (GuardFilterEntry: name, value, guard_type, orig_guard)
    to `on_guards` and keep every one. `guard_filter_fn` is torch.compile's public option (since 2.6)."""
    def keep_all(entries: Any) -> list[bool]:
        on_guards(list(entries))
        return [True] * len(entries)

    return {"guard_filter_fn": keep_all}


def treespec_children(spec: Any) -> list[Any]:
    """A TreeSpec's child specs: `children()` (2.13 deprecates the `children_specs` attribute)."""
    children = getattr(spec, "children", None)
    return list(children()) if callable(children) else list(spec.children_specs)


def opaque_guard_fn(cls: type) -> Callable[[Any], Any] | None:
    """The guard_fn torch registered for an opaque object type (a ProcessGroup: OPAQUE_OBJ_GUARD_FN_MATCH guards
    compare what it returns), or None. torch._library.opaque_object exists where Dynamo emits that guard."""
    try:
        from torch._library.opaque_object import get_opaque_obj_info
    except ImportError:
        return None
    info = get_opaque_obj_info(cls)
    return getattr(info, "guard_fn", None) if info else None


# -- inductor's no-op registry (graphex/passes/noop.py) -------------------------------------------------------------

class TorchInternalChanged(RuntimeError):
    """A torch internal graphex wraps no longer has the shape graphex expects; the message names it and the version."""


def noop_source(node: torch.fx.Node, src_index: Any) -> Any:
    """The node a no-op `node` passes through, as inductor's `noop_registry[target] = (cond, src_index)` says:
    an argument position, or a selector function. The selector took the node's args up to torch 2.14
    (`lambda args: args[0][0]` for aten.cat) and takes the node itself from 2.15 (`lambda node:
    node.args[0][0]`); which one this torch uses is found once by asking aten.cat's own selector."""
    if isinstance(src_index, int):
        return node.args[src_index]
    return src_index(node) if _noop_selector_takes_node() else src_index(node.args)


@functools.cache
def _noop_selector_takes_node() -> bool:
    from torch._inductor.fx_passes.post_grad import noop_registry

    entry = noop_registry.get(torch.ops.aten.cat.default)
    if entry is None or isinstance(entry[1], int):
        return False  # no selector to ask: nothing calls one
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    cat = graph.call_function(torch.ops.aten.cat.default, ([a],))
    for takes_node, argument in ((False, cat.args), (True, cat)):
        try:
            if entry[1](argument) is a:
                return takes_node
        except (AttributeError, TypeError, IndexError):
            continue
    raise TorchInternalChanged(
        f"graphex: torch {torch.__version__}: inductor's noop_registry selector for aten.cat takes neither the "
        "node's args nor the node (torch._inductor.fx_passes.post_grad.register_noop_decomp changed); graphex's "
        "no-op pass (graphex/passes/noop.py) needs compat.noop_source updated for this torch")


def dynamo_side_effects() -> list[str] | None:
    """What the frame Dynamo is compiling changes in Python state when it runs (attributes set, lists or dicts
    mutated, cells and globals written), as names; [] for none, None when this torch does not say. Call from a
    backend or guard hook during the compile (InstructionTranslator.current_tx(), SideEffects, 2.11-2.15)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        side_effects = InstructionTranslator.current_tx().output.side_effects
        modified = [v for v in side_effects.id_to_variable.values() if side_effects.is_modified(v)]
    except Exception:  # noqa: BLE001  not inside a compile, or another torch: the guards' own check remains
        return None
    names = []
    for var in modified:
        source = getattr(var, "source", None)
        names.append(source_name(source) if source is not None else type(var).__name__)
    return names


# -- inductor's pattern matcher: register_replacement (graphex/fusion/registration.py) ------------------------------

# Note [A pattern's check sees every argument]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# register_replacement re-traces the search function on each match's real inputs and calls the
# pattern's `extra_check` on that specific re-match. Up to torch 2.12 the re-match's kwargs lack a
# scalar argument (one named in `scalar_workaround`) whose real value differs from its example
# value: the re-trace bakes the real value in as a literal (2.13 puts the general match's value
# back). A check reading the scalar then saw no value and declined: on 2.11 and 2.12 fused
# decode_attention never fired on a model whose 1/sqrt(d) was not the example's. The scalar's value
# is the one the re-trace was given, so graphex's trace function records its inputs and the check
# reads a missing argument from them (the same thread, just before the check).
# Also differing: `pattern_name` (since 2.12) and `get_decomp_fn` (since 2.12; 2.11 traces with
# inductor's decompositions). graphex's trace function passes its own decompositions to the trace
# itself, so every version traces patterns the way graphex's graphs are made.

_trace_inputs = threading.local()


def _traces(fn: Any, search_fn: Callable[..., Any]) -> bool:
    """`fn` is `search_fn`, or torch's wrapper of it that takes symbolic sizes first (`search_fn_new`)."""
    return fn is search_fn or any(getattr(c, "cell_contents", None) is search_fn for c in getattr(fn, "__closure__", None) or ())


def register_replacement(search_fn: Callable[..., Any], replace_fn: Callable[..., Any], example_inputs: list[Any],
                         trace_fn: Callable[..., Any], pass_dict: Any, extra_check: Callable[[Any], bool], *,
                         get_decomp_fn: Callable[[], dict[Any, Any]], scalar_workaround: dict[str, Any] | None,
                         search_fn_pattern: Any, skip_duplicates: bool, pattern_name: str) -> bool:
    """torch's register_replacement with the same meaning on every supported torch: patterns traced with
    `get_decomp_fn`'s table, and `extra_check` given every argument (Note [A pattern's check sees every
    argument])."""
    import inspect

    from torch._inductor import pattern_matcher

    argnames = list(inspect.signature(search_fn).parameters)
    trace_takes_decomp = "get_decomp_fn" in inspect.signature(trace_fn).parameters

    def trace(fn: Callable[..., Any], args: Any, **_ignored: Any) -> Any:
        _trace_inputs.last = (fn, list(args))
        return trace_fn(fn, args, get_decomp_fn=get_decomp_fn) if trace_takes_decomp else trace_fn(fn, args)

    def check(match: Any) -> bool:
        missing = [n for n in argnames if n not in match.kwargs]
        if missing:
            fn, args = getattr(_trace_inputs, "last", None) or (None, [])
            _trace_inputs.last = None
            if not _traces(fn, search_fn) or len(args) < len(argnames):
                return False  # not the re-trace of this pattern that the check follows: decline rather than guess
            given = dict(zip(argnames, args[len(args) - len(argnames):]))  # sizes first when the shapes are symbolic
            match.kwargs = {**match.kwargs, **{n: given[n] for n in missing}}
        return extra_check(match)

    params = inspect.signature(pattern_matcher.register_replacement).parameters
    optional = {"pattern_name": pattern_name, "get_decomp_fn": get_decomp_fn}
    return bool(pattern_matcher.register_replacement(
        search_fn, replace_fn, example_inputs, trace, pass_dict, extra_check=check,
        scalar_workaround=scalar_workaround, search_fn_pattern=search_fn_pattern, skip_duplicates=skip_duplicates,
        **{k: v for k, v in optional.items() if k in params}))


# -- device graphs (graphex/device_graphs.py) -------------------------------------------------------------------------

# Note [Which graph class a device uses]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Since torch 2.13 torch.accelerator.Graph captures on the current accelerator through the graph
# implementation its backend registered (REGISTER_GRAPH_IMPL). Before, and for a device that is not
# the current accelerator, each backend's module has its own class named after the device type:
# torch.cuda.CUDAGraph, torch.xpu.XPUGraph, torch_npu's torch.npu.NPUGraph, graphex.testing.sim's
# torch.gxsim.GXSIMGraph; all take capture_begin(pool=..., [capture_error_mode=...]).

def _device_graph_class(device_type: str) -> Any:
    accelerator = getattr(torch, "accelerator", None)
    current = accelerator.current_accelerator() if accelerator is not None and accelerator.is_available() else None
    if current is not None and current.type == device_type and hasattr(accelerator, "Graph"):
        return accelerator.Graph
    module = getattr(torch, device_type, None)
    if module is None or not getattr(module, "is_available", lambda: False)():
        return None
    return getattr(module, f"{device_type.upper()}Graph", None)


def has_device_graphs(device_type: str) -> bool:
    """Whether tensors of `device_type` can be captured into a device graph with this torch and backend."""
    return device_type not in ("cpu", "meta") and _device_graph_class(device_type) is not None


class _DeviceGraph:
    """A device graph with one capture_begin(): the pool and the error mode bound at construction."""

    def __init__(self, cls: Any, pool: tuple[int, int] | None, capture_error_mode: str) -> None:
        self._accelerator = cls is getattr(getattr(torch, "accelerator", None), "Graph", None)
        if self._accelerator:
            self._graph = cls(pool=pool, capture_error_mode=capture_error_mode)
        else:
            self._graph = cls()
        self._pool, self._mode = pool, capture_error_mode

    def capture_begin(self) -> None:
        if self._accelerator:
            self._graph.capture_begin()
            return
        import inspect

        kwargs: dict[str, Any] = {"pool": self._pool}
        if self._mode != "default" and "capture_error_mode" in inspect.signature(self._graph.capture_begin).parameters:
            kwargs["capture_error_mode"] = self._mode
        self._graph.capture_begin(**kwargs)

    def capture_end(self) -> None:
        self._graph.capture_end()

    def replay(self) -> None:
        self._graph.replay()

    def reset(self) -> None:
        self._graph.reset()

    def pool(self) -> tuple[int, int]:
        return tuple(self._graph.pool())  # type: ignore[return-value]


def new_device_graph(device: torch.device, pool: tuple[int, int] | None, capture_error_mode: str) -> _DeviceGraph:
    cls = _device_graph_class(device.type)
    if cls is None:
        raise TorchInternalChanged(f"graphex: torch {torch.__version__} has no graph implementation for {device.type}")
    return _DeviceGraph(cls, pool, capture_error_mode)


@contextlib.contextmanager
def on_stream(stream: Any, device: torch.device) -> Iterator[None]:
    """Make `stream` the current stream of `device` for the block (torch.accelerator.set_stream, 2.6+)."""
    previous = torch.accelerator.current_stream(device)
    torch.accelerator.set_stream(stream)
    try:
        yield
    finally:
        torch.accelerator.set_stream(previous)


def wait_stream(waiter: Any, device: torch.device, on: Any = None) -> None:
    """`waiter` waits for the work queued so far on `on` (default: the device's current stream)."""
    on = on if on is not None else torch.accelerator.current_stream(device)
    if on != waiter:
        waiter.wait_stream(on)


@contextlib.contextmanager
def entry_stream(stream: Any) -> Iterator[None]:
    """Note [Side streams in a program] (graphex/lower.py): for the block, index 0 of Dynamo's table of a frame's
    streams and events (torch._dynamo.graph_bytecode_inputs, torch >= 2.13) is `stream`. Dynamo's bytecode fills
    the table with the stream the frame was called on just before it calls the graph; a device-graph capture runs
    the program on the capture stream instead, and the program's stream switches and syncs must name that one."""
    table_module = _stream_tracing_module("torch._dynamo.graph_bytecode_inputs")
    if table_module is None:  # torch < 2.13: no traced streams, nothing names the entry stream
        yield
        return
    table = table_module.index_to_external_object_weakref
    index = table_module.CURRENT_STREAM_INDEX
    before = table.get(index)
    table[index] = weakref.ref(stream)
    try:
        yield
    finally:
        if before is None:
            table.pop(index, None)
        else:
            table[index] = before


def traces_side_streams() -> bool:
    """Whether Dynamo traces `with stream:`, stream waits and events into the graph (torch >= 2.13: the
    `streams::*` ops and the `custom["stream"]` annotation that Note [Side streams in a program] lowers)."""
    streams = _stream_tracing_module("torch._dynamo.variables.streams")
    return streams is not None and hasattr(streams, "fork_stream") and hasattr(torch.ops.streams, "record_stream")


def _stream_tracing_module(name: str) -> Any:
    """One of Dynamo's stream-tracing modules (torch >= 2.13), or None. Imported by name, since older torch lacks
    them; tests/python/test_torch_internals.py checks the names graphex reads in them where torch traces streams."""
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
