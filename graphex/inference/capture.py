"""Cold path of cache_compile: trace once with Dynamo, then describe how to replay without it.

The function is compiled through a flat wrapper (the call's arguments flattened
with pytree), with the graphex backend wrapped to record what the entry needs:
Dynamo's real example inputs (to bind each graph input to a module parameter or
buffer by name, or to an argument by position), the code Dynamo traced (for the
source fingerprints), and the CompiledGraph (its lowered program). The first
call's result tells how outputs map back: a graph output, an argument passed
through, or a constant.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Callable

import torch
import torch.fx
from torch.utils import _pytree as pytree

from .. import compat
from ..program import encode as _spec
from ..compile import compile_dynamo_graph
from ..lowering.streams import uses_side_streams
from ..base.warn import warn_once
from ..options import Options
from ..program import Binding, Leaf
from ..runtime import CompiledGraph
from . import keys, shape_guards
from .fingerprints import global_state as read_global_state
from .guard_records import GUARD_FORMAT, record
from .fingerprints import constant
from .guard_sources import _MISSING, NotCheckable, parse_source, resolve
from .guards import GuardSet
from .entry import Entry
from .flat_call import guards_scope, make_flat


class NotCacheable(Exception):
    """This function or call cannot be replayed from a cache entry; the message says why."""


@dataclasses.dataclass
class _Recording:
    example_inputs: list[Any] = dataclasses.field(default_factory=list)
    sources: list[Any] = dataclasses.field(default_factory=list)
    traced_code: list[Any] = dataclasses.field(default_factory=list)
    graphs: list[CompiledGraph] = dataclasses.field(default_factory=list)
    graph_outputs: list[Any] | None = None
    placeholders: list[Any] = dataclasses.field(default_factory=list)  # fake values, symbolic with dynamic=True
    shape_env: Any = None
    guard_entries: list[Any] | None = None  # Dynamo's guards (Note [cache_compile keys on what the trace read])
    records: list[dict[str, Any]] | None = None  # those guards as records, taken before the first run
    records_error: str | None = None
    side_effects: list[compat.SideEffect] | None = None  # what Dynamo reported (Note [A trace with side effects ...])
    changes_state: list[str] = dataclasses.field(default_factory=list)  # those that are not no-op stores
    flat_call: Callable[..., Any] | None = None


def _traced_code() -> list[Any]:
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    return list(getattr(ctx, "traced_code", []) or [])


# Note [A trace with side effects is not cached]
# Dynamo replays a frame's Python side effects (an attribute set, a list appended to, a global
# written) after its graph; a cache hit runs only the graph. So a trace whose side effects Dynamo
# reports is not cached (logged, and the call still runs compiled through torch.compile), and the
# guards are recorded as the state was before the first run: a mutation Dynamo did not report
# still shows, as a guard that no longer holds right after the call.
# Dynamo's report is read in the backend, where its translator is current (compat.dynamo_side_effects;
# until 2026-12-07 it was read in the guard hook, where it was always empty, so an attribute set to a
# constant that no guard read was cached and dropped on every hit: cache format 4 trusts no older entry).
# One kind of side effect is no change: attribute stores that leave each attribute holding the
# constant it held before the call (transformers' CompileableContextVar sets `compiling` and
# `global_var` and resets them in every forward). Such a trace is cached with an `equals` record per
# attribute, so a hit happens only while each still holds that constant, when the stores change nothing.

def compile_cold(func: Callable[..., Any], flat_args: list[Any], in_spec: pytree.TreeSpec, options: Options,
                 dynamic: bool, key_parts: dict[str, Any], *, with_guards: bool = True
                 ) -> tuple[Any, Entry | None, str | None]:
    """Compile and run once. Returns (result, entry or None, why not cacheable). `with_guards`: record Dynamo's
    guards (a cache entry needs them; an export artifact, run without Python, has no Python state to guard)."""
    rec = _Recording()
    # Note [A cache entry is lowered once]: entries never hold weights (they bind the module's
    # parameters by name), so the cold call runs the very program the entry stores: lowered once,
    # without frozen_parameter (which would lower a second program with the weights as constants).
    if options.frozen_parameter:
        what = "a cache_compile entry" if with_guards else "an exported program"
        warn_once(f"frozen_parameter-ignored:{with_guards}",
                  f"graphex: frozen_parameter has no effect on {what}: it binds the model's parameters by name on "
                  "every call (Note [A cache entry is lowered once]), so a later weight is always read, and "
                  "nothing is folded or prepacked from the weights. Leave it out here; it applies to torch.compile.")
    options = dataclasses.replace(options, frozen_parameter=False)

    def on_capture(compiled: CompiledGraph) -> None:
        rec.graphs.append(compiled)

        def recording(args: list[Any], outs: list[Any]) -> None:  # the cold call's outputs, then unwatched
            rec.graph_outputs = list(outs)
            unwatch()

        unwatch = compiled.watch(recording)

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **_: Any) -> Callable[..., Any]:
        from torch._guards import TracingContext

        rec.example_inputs = list(example_inputs)
        rec.sources = [getattr(n, "_dynamo_source", None) for n in gm.graph.find_nodes(op="placeholder")]
        rec.placeholders = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
        ctx = TracingContext.try_get()
        rec.shape_env = getattr(getattr(ctx, "fake_mode", None), "shape_env", None)
        rec.traced_code = list(getattr(ctx, "traced_code", []) or [])
        # Note [A trace with side effects is not cached]: asked here, while Dynamo's translator is current (the
        # whole frame is traced by now; a guard hook runs after it is gone and would learn nothing)
        rec.side_effects = compat.dynamo_side_effects()
        return compile_dynamo_graph(gm, example_inputs, options, on_capture=on_capture)

    backend._graphex_backend = True  # type: ignore[attr-defined]  (compat.in_graphex_trace)

    def on_guards(entries: list[Any]) -> None:
        # Recorded now, before the compiled frame first runs: a side effect of that run (a list the function
        # appends to) must not become the value the entry expects (Note [A trace with side effects is not cached]).
        rec.guard_entries = entries
        names = [compat.source_name(s) if s is not None else None for s in rec.sources]
        try:
            locals_, globals_ = guards_scope(func, flat_args, rec.flat_call)
            rec.records = record(entries, input_sources={n for n in names if n}, locals_=locals_,
                                        globals_=globals_, global_state=global_state,
                                        traced_code=rec.traced_code or _traced_code())
            rec.changes_state, unchanged = _state_changes(rec.side_effects or [], locals_, globals_)
            rec.records += unchanged
        except NotCheckable as e:
            rec.records_error = str(e)

    rec.flat_call = make_flat(func, in_spec)
    global_state = read_global_state()
    compiled_fn = torch.compile(rec.flat_call, backend=backend, fullgraph=True, dynamic=dynamic,
                                options=compat.guard_recorder(on_guards))
    result = compiled_fn(*flat_args)
    try:
        entry = _describe(func, flat_args, result, rec, options, key_parts, dynamic, with_guards)
        return result, entry, None
    except NotCacheable as e:
        return result, None, str(e)
    finally:
        # Dynamo keeps this trace's backend and guard hook (closures over these names) as long as its code cache
        # lives, until torch._dynamo.reset(): what they name is released here, so the first call's arguments, the
        # function and its module, and Dynamo's guard values are not kept alive after the caller drops them (found
        # by a helper: a 64 MB tensor an argument held stayed alive; torch.compile frees it)
        rec = _Recording()
        func = flat_args = compiled_fn = None  # noqa: F841


_NO_OP_TYPES = (type(None), bool, int, float, str)  # values a store may leave unchanged (Note [A trace with side ...])


def _state_changes(effects: list[compat.SideEffect], locals_: dict[str, Any], globals_: dict[str, Any]
                   ) -> tuple[list[str], list[dict[str, Any]]]:
    """Note [A trace with side effects is not cached]: (the side effects that change Python state, by source name;
    an `equals` record for each attribute a no-op store leaves as it was). Called before the compiled frame first
    runs, so each attribute still holds its value from before the call."""
    changes: list[str] = []
    unchanged: list[dict[str, Any]] = []
    for effect in effects:
        records, changed = [], effect.source
        for attr, value in (effect.stores or {}).items():
            source = f"{effect.source}.{attr}"
            try:
                owner = resolve(parse_source(effect.source), locals_, globals_)
                now = resolve(parse_source(source), locals_, globals_)
                # a no-op only where the store overwrites the very value: an immutable one (a list equal to the
                # old is another object), held by the object itself (a store that shadows a class attribute makes
                # an instance attribute; helper finds)
                if (type(value) not in _NO_OP_TYPES or now is _MISSING or constant(now) != constant(value)
                        or attr not in getattr(owner, "__dict__", {})):
                    changed = source
                    break
            except NotCheckable:
                changed = source
                break
            records.append({"kind": "equals", "source": source, "expect": constant(value)})
        else:
            if effect.stores:
                unchanged += records
                continue
        changes.append(_readable(changed))
    return changes, unchanged


def _readable(source: str) -> str:
    """A source as the user wrote it: the bound method's object is `self` (flat_call names the function `func`)."""
    return source.replace("L['func'].__self__", "self")


def _shape_guards(rec: _Recording) -> str | None:
    """Note [A dynamic entry carries its shape guards]
    With dynamic=True the key holds only ranks and which dims are 0 or 1, but the trace
    may depend on more: a branch on `x.shape[0] > 4`, a dim specialized to a constant by
    broadcasting. Dynamo would guard on that and recompile; a cache hit skips Dynamo, so
    the entry stores the ShapeEnv's guards over its graph inputs (sizes, strides and
    relations, static dims included), written into the program as typed guards
    (shape_guards.py) and checked in C++ on every replay by the one binder (Note [One
    binder]). A call that fails them is another entry's or a new compile's. A guard the
    runtime cannot evaluate makes the entry uncacheable (and the export refused): an entry
    whose guards go unchecked would replay a program traced for other shapes.

    Guards only over symbols that no graph input carries (Dynamo makes the ints of the
    flat wrapper's TreeSpec symbolic too) are about values the key or the load check
    already fixes (the argument structure, globals, closure and module attributes), so
    they are left out; a guard that mixes both kinds cannot be checked from the inputs.
    """
    if rec.shape_env is None or any(p is None for p in rec.placeholders):
        raise NotCacheable("the trace has no shape environment to take dynamic-shape guards from")
    inputs_symbols: set[Any] = set()
    for p in rec.placeholders:
        if isinstance(p, torch.SymInt):
            inputs_symbols |= p.node.expr.free_symbols
        elif isinstance(p, torch.Tensor):
            for v in (*p.shape, *p.stride(), p.storage_offset()):
                if isinstance(v, torch.SymInt):
                    inputs_symbols |= v.node.expr.free_symbols
    guards = []
    for guard in rec.shape_env.guards:
        free = guard.expr.free_symbols
        if free <= inputs_symbols:
            guards.append(guard)
        elif free & inputs_symbols:
            raise NotCacheable(f"a dynamic-shape guard ({guard.expr}) relates an input size to a value that is "
                               "not a graph input; pass that value as an argument or use dynamic=False")
    return rec.shape_env.produce_guards_expression(rec.placeholders, guards=guards, ignore_static=False)


def _describe(func: Callable[..., Any], flat_args: list[Any], result: Any, rec: _Recording, options: Options,
              key_parts: dict[str, Any], dynamic: bool, with_guards: bool = True) -> Entry:
    if len(rec.graphs) != 1:
        raise NotCacheable("the call did not produce exactly one engine graph (autograd needed? run it under "
                           "torch.no_grad() or torch.inference_mode())")
    graph = rec.graphs[0]
    if options.force_eager:
        raise NotCacheable("option force_eager runs the graph with torch.fx: there is no engine program to store")
    if uses_side_streams(graph.gm):
        raise NotCacheable("the function runs work on side streams: its program names the frame's stream and event "
                           "objects by their place in Dynamo's table of them (Note [Side streams in a program]), "
                           "which only Dynamo's own call fills: torch.compile(backend='graphex') runs it; a cache "
                           "entry or an exported artifact cannot hold it")
    _check_aot_wrappers_are_trivial(graph, len(rec.example_inputs))
    inputs = [_bind_input(i, value, source, func, flat_args)
              for i, (value, source) in enumerate(zip(rec.example_inputs, rec.sources))]
    if with_guards:
        inputs = _with_sources(rec, inputs)
    leaves, out_spec = pytree.tree_flatten(result)
    outputs = _distinct_views([_bind_output(leaf, flat_args, rec.graph_outputs or [], dynamic) for leaf in leaves],
                              leaves)
    sources, problem = keys.source_fingerprints(rec.traced_code, keys.project_root(func))
    if problem:
        raise NotCacheable(problem)
    from ..custom_ops.registration import is_custom

    lowered = graph.lowered  # Note [A cache entry is lowered once]: no frozen inputs
    assert lowered is not None and not lowered.frozen_inputs, "compile_cold turns frozen_parameter off"
    custom = [op for op in lowered.node_ops if op is not None and is_custom(op)]
    dynamo_guards = _dynamo_guards(rec, func, flat_args, inputs) if with_guards else []
    if not with_guards and rec.changes_state:  # an exported program runs without Python: say what it leaves out
        warn_once(f"export-side-effects:{keys.function_identity(func)}",
                  f"graphex: the exported program does not do what {getattr(func, '__qualname__', func)} does to "
                  f"Python state ({'; '.join(rec.changes_state[:3])}): it runs the graph only")
    shape_text = _shape_guards(rec) if dynamic else None
    program_guards, unexportable = None, None
    if dynamic:  # Note [An exported program checks its shape guards]
        try:
            program_guards = shape_guards.from_expression(shape_text, inputs) if shape_text else []
        except shape_guards.Unsupported as e:
            if with_guards:  # a cache entry: Note [A dynamic entry carries its shape guards]
                raise NotCacheable(f"with dynamic=True, {e}; cache it with dynamic=False (one entry per shape)") from None
            unexportable = str(e)
    header = {
        **keys.versions(),
        "key_parts": key_parts,
        "function": keys.function_identity(func),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "signature": keys.describe_signature(flat_args),
        "inputs": [b.to_json() for b in inputs],
        "outputs": {"spec": pytree.treespec_dumps(out_spec), "leaves": [leaf.to_json() for leaf in outputs]},
        "sources": sources,
        "custom_ops": keys.custom_op_fingerprints(custom),
        "num_ops": lowered.num_ops,
        "validate_fake": options.validate_fake and lowered.validates_fakes,
        "guards": shape_text,
        "dynamo_guards": dynamo_guards,
        "guard_format": GUARD_FORMAT,
        # every graph input's dtype, sizes and strides, the parameters' and buffers' too: entries of one key whose
        # held tensors have other layouts (a channels_last weight) sit side by side (cache_compile's file name)
        "graph_inputs": keys.input_signature(rec.example_inputs, dynamic),
    }
    # The program carries its bindings and result leaves too: the same bytes load in C++ (graphex/exporting.py).
    info = {key: header[key] for key in ("graphex", "torch", "spec_format", "function", "signature", "created")
            if key in header}
    info["dynamic"] = dynamic
    if unexportable:
        header["unexportable"] = unexportable
    program = _spec.encode(lowered.program, lowered.constants, bindings=inputs, leaves=outputs,
                           tree=pytree.treespec_dumps(out_spec), info=info, guards=program_guards)
    return Entry(header, program)


def _with_sources(rec: _Recording, inputs: list[Binding]) -> list[Binding]:
    """A parameter or buffer binding records its Dynamo source too: cache_compile resolves it per call."""
    names = [compat.source_name(s) if s is not None else None for s in rec.sources]
    out = []
    for binding, name in zip(inputs, names):
        if binding.kind in ("param", "buffer"):
            if name is None:
                raise NotCacheable(f"graph input {binding.fqn} has no Dynamo source")
            binding = dataclasses.replace(binding, source=name)
        out.append(binding)
    return out


def _dynamo_guards(rec: _Recording, func: Callable[..., Any], flat_args: list[Any],
                   inputs: list[Binding]) -> list[dict[str, Any]]:
    """Note [cache_compile keys on what the trace read]: Dynamo's guards as typed records, each checked here
    against the traced values and the bindings (with their sources: _with_sources)."""
    if rec.guard_entries is None:
        raise NotCacheable("Dynamo handed over no guards for this trace")
    if rec.side_effects is None:  # Note [A trace with side effects is not cached]: fail safe, never assume none
        raise NotCacheable("this torch did not say what the function changes in Python state when it runs "
                           "(graphex.compat.dynamo_side_effects), and a replay of a cached program would drop it")
    if rec.changes_state:  # Note [A trace with side effects is not cached]
        raise NotCacheable(f"the function changes Python state when it runs ({'; '.join(rec.changes_state[:3])}), "
                           "which replaying a cached program would not do")
    if rec.records_error is not None:
        raise NotCacheable(f"a guard of the trace cannot be checked by a cache entry: {rec.records_error}")
    records = rec.records or []
    try:
        problem = GuardSet(records).bind(*guards_scope(func, flat_args, rec.flat_call), inputs=inputs)
    except NotCheckable as e:
        problem = str(e)
    if problem is not None:  # what the trace read changed during the call: a side effect Dynamo did not report
        raise NotCacheable(f"the state the trace read changed while the function ran ({problem}); a function "
                           "with side effects cannot be replayed from a cache entry")
    return records


def _check_aot_wrappers_are_trivial(graph: CompiledGraph, num_dynamo_inputs: int) -> None:
    """The engine must be the whole story: AOTAutograd's runtime wrappers must have nothing to add."""
    meta = graph.aot_metadata
    if len(graph.lowered.program.inputs) != num_dynamo_inputs:  # type: ignore[union-attr]
        raise NotCacheable("AOTAutograd merged or split graph inputs (aliased or duplicate arguments)")
    if meta is None:
        return
    if getattr(meta, "num_intermediate_bases", 0):
        raise NotCacheable("an output is a view of an intermediate tensor")
    if any(getattr(info, "mutates_metadata", False) for info in getattr(meta, "input_info", [])):
        raise NotCacheable("the function changes an input's metadata in place (e.g. t_(), resize_())")
    if getattr(meta, "tokens", None):
        raise NotCacheable("the graph has side-effect tokens")


def _param_owners(module: torch.nn.Module) -> dict[int, Binding]:
    owners: dict[int, Binding] = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        for kind, table in (("param", sub._parameters), ("buffer", sub._buffers)):
            for name, t in table.items():
                if t is not None:
                    owners.setdefault(id(t), Binding(kind, owner=path, name=name))  # type: ignore[arg-type]
    return owners


def _bind_input(i: int, value: Any, source: Any, func: Callable[..., Any], flat_args: list[Any]) -> Binding:
    """Note [A program input is bound by one typed Binding]."""
    module = getattr(func, "__self__", None)
    if isinstance(value, torch.Tensor):
        for j, a in enumerate(flat_args):
            if a is value:
                return Binding("arg", index=j)
        if isinstance(module, torch.nn.Module):
            owner = _param_owners(module).get(id(value))
            if owner is not None:
                return owner
        held = _held_by_arg(source, flat_args)
        if held is not None:
            return held
    elif isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
        size = _size_of_arg(source)  # dynamic=True: a size of an argument is a SymInt input
        if size is not None:
            return size
        j = _arg_index(source)
        if j is not None and j < len(flat_args):
            return Binding("arg", index=j)
    where = getattr(source, "name", None) or f"input {i}"
    raise NotCacheable(f"graph input {where} is neither an argument nor a registered parameter/buffer of the "
                       "module (e.g. a global tensor or a plain tensor attribute); make it a buffer "
                       "(register_buffer) or pass it as an argument")


def _held_by_arg(source: Any, flat_args: list[Any]) -> Binding | None:
    """Note [A tensor an argument holds is bound through its path]
    transformers passes its KV cache as an object (`past_key_values=StaticCache(...)`, a pytree leaf): the trace
    reads the tensors it holds (`L['flat_args'][1].layers[0].keys`). Such a graph input is bound per call by
    that access path, read by the same generated function that checks the guards (guards.py), which also
    checks what the path goes through (the object's type, the layer list's length). graphex::Module takes
    tensors only: export refuses such a binding."""
    if source is None:
        return None
    name = compat.source_name(source)
    try:
        path = parse_source(name)
    except NotCheckable:
        return None
    if len(path) < 3 or path[0] != ("L", "flat_args") or path[1][0] != "item" or type(path[1][1]) is not int:
        return None
    if not 0 <= path[1][1] < len(flat_args) or isinstance(flat_args[path[1][1]], torch.Tensor):
        return None
    return Binding("attr", index=path[1][1], source=name)


def _arg_index(source: Any) -> int | None:
    """j for a graph input read straight from the flat wrapper's argument j (L['flat_args'][j])."""
    from torch._dynamo.source import GetItemSource, LocalSource

    if isinstance(source, GetItemSource) and isinstance(source.base, LocalSource) and isinstance(source.index, int):
        return source.index
    return None


def _size_of_arg(source: Any) -> Binding | None:
    """A symbolic size input (dynamic=True) read from argument j: L['flat_args'][j].size()[d] and the like."""
    from torch._dynamo.source import GetItemSource, TensorProperty, TensorPropertySource

    if not isinstance(source, TensorPropertySource) or not isinstance(source.base, GetItemSource):
        return None
    prop = {TensorProperty.SIZE: "size", TensorProperty.STRIDE: "stride",
            TensorProperty.STORAGE_OFFSET: "storage_offset"}.get(source.prop)
    if prop is None or not isinstance(source.base.index, int):
        return None
    return Binding(prop, index=source.base.index, dim=source.idx or 0)  # type: ignore[arg-type]


def _bind_output(leaf: Any, flat_args: list[Any], graph_outputs: list[Any], dynamic: bool = False) -> Leaf:
    if not isinstance(leaf, (torch.Tensor, int, float, bool, str, type(None))):
        for j, a in enumerate(flat_args):  # an argument object returned as it came (a KV cache object)
            if a is leaf:
                return Leaf("arg", j)
    if not isinstance(leaf, torch.Tensor):
        if dynamic and isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
            raise NotCacheable(f"with dynamic=True the function returns the number {leaf!r}, which may be computed "
                               "from a size and differ on the next call; return it as a tensor or compute it outside")
        if isinstance(leaf, (int, float, bool, str, type(None))):
            return Leaf("const", value=leaf)
        raise NotCacheable(f"the function returns a {type(leaf).__name__}, which a cache entry cannot hold")
    for j, a in enumerate(flat_args):
        if a is leaf:
            return Leaf("arg", j)
    for k, g in enumerate(graph_outputs):
        if g is leaf:
            return Leaf("graph", k)
    for k, g in enumerate(graph_outputs):  # views regenerated by AOTAutograd: same memory, same layout
        if isinstance(g, torch.Tensor) and _same_view(g, leaf):
            return Leaf("graph", k)
    raise NotCacheable("an output could not be traced back to the captured graph")


def _distinct_views(bound: list[Leaf], leaves: list[Any]) -> list[Leaf]:
    """Note [Two views of one output are two tensors]
    Two leaves can be bound to one program output and be two tensors in eager: `return x.view(-1), x.view(-1)`
    (the graph returns one view, AOTAutograd regenerated one per output). One Python object for both would let an
    in-place change of one's sizes (`a.unsqueeze_(0)`) change the other (found by a helper). So a leaf bound to an
    output that a different tensor took first is a "view" leaf: each call makes `alias()` of that output, a tensor
    of its own naming the same memory, as eager's. A tensor returned twice (`return h, h`) stays one object."""
    first: dict[int, Any] = {}
    out = []
    for leaf, value in zip(bound, leaves):
        if leaf.kind == "graph":
            if first.setdefault(leaf.index, value) is not value:
                leaf = Leaf("view", leaf.index)
        out.append(leaf)
    return out


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.dtype == b.dtype
            and a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset())
