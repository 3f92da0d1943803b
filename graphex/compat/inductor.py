"""inductor's internals graphex reuses: the reinplacing pass and its table, the fake-tensor updater, the
no-op registry, and the pattern matcher's register_replacement."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import struct
import threading
from typing import Any, Callable

import torch
import torch.fx

from ._base import TorchInternalChanged


# -- inductor's pieces around graphex's reinplacing decisions -----------------------------------

def inplaceable_ops_table() -> dict[Any, Any]:
    """A copy of inductor's table of functional ops and their in-place forms (op -> InplaceableOp: inplace_op,
    mutated_args, extra_check), and of its foreach table.

    graphex decides itself whether a node may be written in place (graphex/passes/reinplace.py); it keeps each
    entry's extra_check but the generalized scatter's (`should_reinplace_scatter`: a fusion heuristic of
    inductor's; with no fusion, in place always wins), which graphex replaces by its own test (Note [A scatter is
    not reinplaced onto its own source]). Built per call: inductor extends its table at import time
    (collectives), so a copy taken once could miss entries.
    """
    from torch._inductor.fx_passes import reinplace as inductor_reinplace

    table = dict(inductor_reinplace.inplaceable_ops)
    scatter = inductor_reinplace._generalized_scatter
    if scatter in table:
        op = table[scatter]
        table[scatter] = inductor_reinplace.InplaceableOp(op.inplace_op, op.mutated_arg)
    table.update(getattr(inductor_reinplace, "inplaceable_foreach_ops", {}))
    return table


def view_scatter_ops() -> list[Any]:
    """The scatters of a view (slice_scatter, select_scatter, diagonal_scatter, as_strided_scatter): ops with no
    in-place twin of their own name, which reinplacing writes into their input all the same (as one generalized
    scatter, inductor's table of them)."""
    from torch._inductor.fx_passes import reinplace as inductor_reinplace

    return list(inductor_reinplace._SCATTER_OP_TO_VIEW)


def is_foreach_entry(target: Any) -> bool:
    """True for a foreach op of inductor's table: its mutated argument is a list, each with a copy-back."""
    from torch._inductor.fx_passes import reinplace as inductor_reinplace

    return target in getattr(inductor_reinplace, "inplaceable_foreach_ops", {})


def around_reinplacing(fake_tensor_updater: Any, graph: torch.fx.Graph, decide: Callable[[torch.fx.Graph], None]) -> None:
    """inductor's steps around its reinplacing core (the same in 2.11-2.15), with graphex's `decide` in its place:
    view scatters canonicalized to one generalized scatter, fake tensors refreshed, then `decide`, then the
    generalized scatters decomposed back to ATen ops (Note [A scatter left functional is eager's scatter])."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._inductor.fx_passes import reinplace as inductor_reinplace

    with enable_python_dispatcher():
        inductor_reinplace.canonicalize_view_scatter_ops(graph)
        fake_tensor_updater.incremental_update()
        decide(graph)
        _decompose_generalized_scatters(graph)


def _decompose_generalized_scatters(graph: torch.fx.Graph) -> None:
    """inductor's decompose_generalized_scatter, but for the choice of form.

    Note [A scatter left functional is eager's scatter]
    A scatter written in place becomes its views and a `copy_` into them. One left functional becomes the
    `*_scatter` ops it stands for, each eager's own kernel, which copies its input with the input's strides
    (clone_preserve_strides). inductor writes diagonal and as_strided scatters as a `clone` and a `copy_` even
    when functional (its lowering mutates them anyway); on an input with gaps (`h[:, :4]` of a wider h) that clone
    is contiguous, so the result's strides, and the kernels later ops pick for it, would not be eager's.
    """
    import itertools

    from torch._inductor.fx_passes import reinplace as inductor_reinplace

    functional, in_place = inductor_reinplace._generalized_scatter, inductor_reinplace._inplace_generalized_scatter
    for node in list(itertools.chain(graph.find_nodes(op="call_function", target=functional),
                                     graph.find_nodes(op="call_function", target=in_place))):
        with graph.inserting_before(node):
            if node.target is in_place:
                new_node = inductor_reinplace._decompose_scatter_mutating(graph, node)
            else:
                new_node = inductor_reinplace._decompose_scatter_functional(graph, node)
        node.replace_all_uses_with(new_node)
        graph.erase_node(node)


def may_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one storage may share an element (torch's own test, as inductor's pass uses it);
    True where it cannot tell (a data-dependent size, or a torch without the test)."""
    try:
        from torch._C._dynamo.guards import compute_overlapping_tensors
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    except ImportError:
        return True
    try:
        return len(compute_overlapping_tensors([a, b])) != 0
    except GuardOnDataDependentSymNode:
        return True


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


# -- inductor's no-op registry (graphex/passes/noop.py) -------------------------------------------------------------

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


# Note [A match's re-trace is made once per shape]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's matcher re-traces a pattern's search function on every match, with fresh tensors of the match's sizes,
# strides and dtypes (check_fn's `refresh_arg`), to compare what the general pattern ignores. A decoder's layers
# repeat the same shapes: the shipped decoder's first fused compile made 162 such traces of 26 distinct inputs,
# 0.73 s of its 2.7 s. Within one fusion run (`one_trace_per_shape`: one graph, one fake mode) a re-trace of the
# same search function on inputs of the same metadata is the same graph, so it is made once and reused: torch only
# reads it (makes it a pattern and matches that). So is the replacement's trace, but torch writes the matched node's
# meta into it (`_transfer_meta`) and copies its nodes into the graph, so each match gets its own copy of the graph
# (new nodes, each meta a shallow copy: `_fresh_copy`), not the shared one. The key names the registration (its
# trace function, its decompositions: one search function registered twice, traced two ways, is two patterns; found by
# a helper) besides the function. An input the key cannot state exactly (a symbolic size, an object) is traced every
# time.
_retraces: contextvars.ContextVar[dict[Any, Any] | None] = contextvars.ContextVar("graphex_retraces", default=None)


@contextlib.contextmanager
def one_trace_per_shape() -> Any:
    """Re-traces of a search function on inputs of equal metadata share one graph for the duration (Note [A match's
    re-trace is made once per shape])."""
    token = _retraces.set({})
    try:
        yield
    finally:
        _retraces.reset(token)


def _retrace_key(registration: object, fn: Callable[..., Any], args: Any) -> tuple[Any, ...] | None:
    """What a re-trace of `fn` for one registration (its trace function and decompositions) depends on, or None where
    an input is not stated exactly by its metadata."""
    parts: list[Any] = [registration, fn, torch.is_grad_enabled()]
    for a in args:
        if isinstance(a, torch.Tensor):
            sizes, strides = tuple(a.shape), tuple(a.stride())
            if not all(type(v) is int for v in (*sizes, *strides, a.storage_offset())):
                return None  # a symbolic size: torch's own path renames its placeholders per match
            parts.append(("tensor", sizes, strides, a.storage_offset(), a.dtype, a.device, a.requires_grad))
        elif type(a) is float:
            parts.append(("float", struct.pack("<d", a)))  # by its bits: -0.0 and NaN's sign are their own
        elif a is None or type(a) in (int, bool, str, torch.dtype, torch.device):
            parts.append((type(a).__name__, a))
        else:
            return None
    return tuple(parts)


def _fresh_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule of the same nodes as `gm`'s (new Node objects, each meta a shallow copy), sharing its attributes
    (constants a get_attr node reads) and codegen; its Python code is generated only if something runs it."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen
    copied = graph.graph_copy(gm.graph, {}, return_output_node=True)
    assert copied is not None, "a traced graph has an output node"
    value, output = copied
    graph.output(value, output.type).meta = dict(output.meta)
    return _LazyGraphModule(gm, graph)


def register_replacement(search_fn: Callable[..., Any], replace_fn: Callable[..., Any], example_inputs: list[Any],
                         trace_fn: Callable[..., Any], pass_dict: Any, extra_check: Callable[[Any], bool], *,
                         get_decomp_fn: Callable[[], dict[Any, Any]], scalar_workaround: dict[str, Any] | None,
                         search_fn_pattern: Any, skip_duplicates: bool, pattern_name: str,
                         first_trace: Callable[[Callable[[], Any]], Any] | None = None) -> bool:
    """torch's register_replacement with the same meaning on every supported torch: patterns traced with
    `get_decomp_fn`'s table, and `extra_check` given every argument (Note [A pattern's check sees every
    argument]). `first_trace(trace)`, where given, makes the search function's first trace (the one the pattern is
    made from) in place of `trace()`: a shipped graph (Note [Built-in patterns ship as traced graphs]); torch's
    re-traces of each match are made as always."""
    import inspect

    from torch._inductor import pattern_matcher

    argnames = list(inspect.signature(search_fn).parameters)
    trace_takes_decomp = "get_decomp_fn" in inspect.signature(trace_fn).parameters

    registered = False

    def trace(fn: Callable[..., Any], args: Any, **_ignored: Any) -> Any:
        if not registered and first_trace is not None and fn is search_fn:
            return first_trace(lambda: traced(fn, args))
        memo = _retraces.get()
        key = _retrace_key(trace, fn, args) if registered and memo is not None and fn in (search_fn, replace_fn) \
            else None
        if key is None:
            return traced(fn, args)
        if key not in memo:  # Note [A match's re-trace is made once per shape]
            memo[key] = traced(fn, args)
        else:
            _trace_inputs.last = (fn, list(args))  # what `check` reads a missing argument from, as traced() sets it
        return memo[key] if fn is search_fn else _fresh_copy(memo[key])

    def traced(fn: Callable[..., Any], args: Any) -> Any:
        _trace_inputs.last = (fn, list(args))
        try:
            return trace_fn(fn, args, get_decomp_fn=get_decomp_fn) if trace_takes_decomp else trace_fn(fn, args)
        except RuntimeError:
            raise
        except Exception as e:
            if not registered:
                raise  # tracing the pattern itself failed: the pattern is wrong, say so at registration
            # Note [A pattern that cannot retrace a match declines it]: torch's matcher retraces each match with its
            # real shapes and declines only on a RuntimeError; any other error (a search function dividing by a
            # head count of 0) would fail the user's compile. It declines the match instead.
            raise RuntimeError(f"graphex: pattern {pattern_name} declined a match it cannot retrace: "
                               f"{type(e).__name__}: {e}") from e

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
    before = {id(e) for entries in pass_dict.patterns.values() for e in entries}
    result = bool(pattern_matcher.register_replacement(
        search_fn, replace_fn, example_inputs, trace, pass_dict, extra_check=check,
        scalar_workaround=scalar_workaround, search_fn_pattern=search_fn_pattern, skip_duplicates=skip_duplicates,
        **{k: v for k, v in optional.items() if k in params}))
    registered = True
    for entries in pass_dict.patterns.values():
        for entry in entries:
            if id(entry) not in before:
                entry.extra_check = _declining_on_error(entry.extra_check, pattern_name)
    return result


# Note [A pattern that raises while checking declines the match]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's check of a match (the entry's extra_check: it rebinds the match's arguments, retraces, then calls
# ours) can raise: a search function whose scalar argument its trace folds into a constant (SDPA's math path
# takes sqrt(scale) in Python) leaves that argument out of the match, and torch raises "Not all inputs to
# pattern found" from the matcher, which failed the user's whole compile. Every entry's check runs inside this
# wrapper: an error declines that one match, says so once per pattern (GraphexWarning), and the graph keeps
# eager's ops there.
def _declining_on_error(check: Callable[[Any], bool], pattern_name: str) -> Callable[[Any], bool]:
    def declining(match: Any) -> bool:
        try:
            return check(match)
        except Exception as e:  # noqa: BLE001  (any error in a pattern's check must not fail the compile)
            from ..base.warn import warn_once

            warn_once(f"fusion:check-raised:{pattern_name}",
                      f"graphex: fusion pattern {pattern_name!r} raised while checking a match "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); the match is declined and "
                      "those ops run as eager's. If this is your pattern, make every argument of its search function "
                      "reach the traced graph (a scalar the trace folds into a constant cannot be matched).")
            return False

    return declining
