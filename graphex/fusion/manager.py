"""The fusion pass: torch's pattern matcher over the functional ATen graph, before reinplacing.

One PatternMatcherPass holds every pattern, built-in and user's alike (npugraph_ex keeps one pass
too). Patterns are tried where they anchor (the node that computes a pattern's output), nodes from
the last to the first, and at one anchor in the order they were registered: the built-ins that
swallow a smaller built-in (add + RMSNorm, the whole gated MLP) are registered before it.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import hashlib
import inspect
import math
import operator
import threading
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode

from ..base import log as _log
from ..base.warn import warn_once
from ..compat.inductor import one_trace_per_shape
from .checks import REDUCED_DTYPES
from .serialized import Unwanted, call_targets
from .spellings import merge_repeated_views, normalize_arguments

if TYPE_CHECKING:
    from torch._inductor.pattern_matcher import Match, PatternMatcherPass

    from .serialized import BuiltinGraphs


# Note [Fusion's state: one registry, counts per run]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The patterns a process registers are process-wide, like torch.library's operators: they live in
# one object, REGISTRY (the matcher pass, its lock, whether the built-ins are traced, one line per
# pattern for the compile-cache key), and nowhere else. What one rewrite found is not state of the
# module: run_fusion opens a Counter for its graph in a ContextVar, the match checks count into the
# Counter of the run they belong to, and the result is returned (and kept on the compiled graph,
# CompiledGraph.report's `fused`), so two compiles on two threads never count into each other.
class PatternRegistry:
    """Every fusion pattern of this process (built-ins and users'), in one PatternMatcherPass."""

    def __init__(self, graphs: BuiltinGraphs | None = None) -> None:
        self._matcher: PatternMatcherPass | None = None
        self.lock = threading.RLock()
        self.builtin_groups: set[Any] = set()  # the keys of patterns.BUILTIN_GROUPS registered so far
        self.lines: list[str] = []  # one per user's pattern, for compile-cache keys
        # the built-ins' first traces: the shipped ones (serialized.shipped(), read at the first group) unless given
        self.graphs = graphs
        # Note [A built-in pattern is registered once a graph can hold it]
        self.available: frozenset[Any] | None = None  # the ops a graph being fused can hold (None: every op)
        self.deferred: list[_Deferred] = []  # built-ins no graph could hold yet, in their rank's order
        self._ranks: dict[int, tuple[float, int]] = {}  # id(PatternEntry) -> its place in the full registration order
        self._rank: tuple[float, int] = (0, 0)  # the next built-in's place: (its group's index, its index there)
        self._highest: tuple[float, int] = (-1, 0)  # the last place registered in order
        self._unordered = False  # a registration came after a later-ranked one: the anchors' lists are to be sorted
        self._said_waiting = 0  # len(deferred) when GRAPHEX_LOG=2 last said it

    @property
    def matcher(self) -> PatternMatcherPass:
        """The one pass, made at first use: importing inductor's pattern matcher costs most of a second, which a
        process that only reads the compile cache (registered_patterns) need not pay."""
        with self.lock:
            if self._matcher is None:
                from torch._inductor.pattern_matcher import PatternMatcherPass

                self._matcher = PatternMatcherPass(pass_name="graphex_pattern_fusion")
            return self._matcher

    def ensure_builtins(self, dtypes: Any = None, ops: frozenset[Any] | None = None) -> None:
        """Register the built-in patterns, once per group (Note [Built-in patterns are traced per dtype, when
        needed]): the float32 group and the groups of `dtypes` (every group when None). Their search graphs are the
        shipped ones where this torch has them (Note [Built-in patterns ship as traced graphs], serialized/). With
        `ops` (the ops of the graph about to be fused), a built-in whose search graph holds another op waits in
        `deferred` (Note [A built-in pattern is registered once a graph can hold it]); without, none waits."""
        from .patterns import BUILTIN_GROUPS

        with self.lock:
            self.available = None if ops is None else frozenset(ops) | REPLACEMENT_OPS
            try:
                for d in [d for d in self.deferred if self.available is None or d.ops <= self.available]:
                    self.deferred.remove(d)
                    self._ranked(d.rank, d.register)
                for index, (key, register) in enumerate(BUILTIN_GROUPS.items()):
                    wanted = dtypes is None or key is None or key in dtypes
                    if key in self.builtin_groups or not wanted:
                        continue
                    if self.graphs is None:
                        from . import serialized

                        self.graphs = serialized.shipped()
                    self.builtin_groups.add(key)
                    self.graphs.begin_group(key)
                    self._rank = (index, 0)
                    register()
            finally:
                self.available = None
                if self._unordered:
                    self._in_rank_order()
            if len(self.deferred) != self._said_waiting:  # said when it changes, not for every graph
                self._said_waiting = len(self.deferred)
                _log.detail("fused mode: %d built-in patterns wait for a graph holding their ops (Note [A built-in "
                            "pattern is registered once a graph can hold it])", len(self.deferred))

    def register_builtin(self, register: Callable[[Callable[..., Any] | None], bool], first_trace: Callable[..., Any]
                         ) -> None:
        """One built-in registration, `register(first_trace)` (compat.register_replacement's), at its rank; or, when
        its search graph holds an op that `available` lacks, kept to be registered later with the same graph."""
        rank, self._rank = self._rank, (self._rank[0], self._rank[1] + 1)
        available = self.available
        wanted = None if available is None else available.issuperset

        try:  # Unwanted is raised through torch's register_replacement by the first trace, before it registers anything
            self._ranked(rank, lambda: register(functools.partial(first_trace, wanted=wanted)))
        except Unwanted as later:
            make = later.make
            self.deferred.append(_Deferred(rank, later.ops, lambda: register(lambda _trace: make())))

    def register_user(self, register: Callable[[], bool]) -> bool:
        """A user's registration, after every built-in (ensure_builtins() ran first: none waits)."""
        return self._ranked((math.inf, len(self._ranks)), register)

    def _ranked(self, rank: tuple[float, int], register: Callable[[], bool]) -> bool:
        """`register()`, each pattern entry it adds to the matcher remembered at `rank`."""
        before = {key: len(entries) for key, entries in self.matcher.patterns.items()}
        registered = register()
        for key, entries in self.matcher.patterns.items():
            for entry in entries[before.get(key, 0):]:
                self._ranks[id(entry)] = rank
        if rank < self._highest:
            self._unordered = True
        self._highest = max(self._highest, rank)
        return registered

    def _in_rank_order(self) -> None:
        """Each anchor's patterns in the order one registration of everything at once would give them (a stable
        sort: an entry graphex did not register, none today, keeps its place after them)."""
        unranked = (math.inf, math.inf)
        for entries in self.matcher.patterns.values():
            entries.sort(key=lambda e: self._ranks.get(id(e), unranked))
        self._unordered = False


class _Deferred(NamedTuple):
    rank: tuple[float, int]
    ops: frozenset[Any]
    register: Callable[[], bool]


# Note [A built-in pattern is registered once a graph can hold it]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Registering a built-in (torch's fx_to_pattern and duplicate check, on its shipped graph) costs about 2 ms, a
# third of a second for the common group's 125, and each registered pattern is tried at every node of its anchor's
# op. Most cannot match a given model at all: a pattern matches only where the graph has every op of its search graph
# (each pattern node matches a node by its target), and Llama's decode step holds the ops of 40 of the 125, GPT-2's
# 15, the shipped decoder's 24 (the written-out attention forms need softmax, which an SDPA model has none of). So
# run_fusion registers a built-in only once a graph holds its ops; the others wait in `deferred`, and the first graph
# that holds their ops registers them. A waiting built-in's ops are read by running its shipped builder against a
# recorder (serialized._Targets), its graph built only when it registers (a traced one, under a torch with no shipped
# graphs, is kept). Nothing is lost:
#   * torch's matcher anchors on the nodes there when it starts, and a node a replacement inserts during the pass
#     holds a graphex_fused op (which no built-in searches for), an op of the pattern it replaces (which the graph
#     held) or an op of REPLACEMENT_OPS (test_fusion_deferred.py traces every built-in replacement), so `available`,
#     the graph's ops and REPLACEMENT_OPS, covers every node a match could use;
#   * the order is kept: every registration has a rank, its place in the order registering every group at once
#     gives (group by BUILTIN_GROUPS, then its index in the group), and after a registration out of that order each
#     anchor's list is sorted by rank. So at an anchor the patterns are tried in the same order in every process,
#     whatever graphs came before (the dtype groups too, which had followed the order graphs arrived in).
# A user's pattern registers every built-in first (ensure_builtins(), no ops: none waits), and comes after them.
# Only graphs whose run_fusion passes its ops defer anything; the writer of the shipped graphs registers all.
REPLACEMENT_OPS: frozenset[Any] = frozenset({
    operator.getitem,  # a replacement returning several results
    torch.ops.aten.ones.default,  # an unmasked attention's all-attended mask (attention_patterns._all_attended)
    torch.ops.aten.select.int,  # rotary_complex_fused's cos and sin halves
    torch.ops.aten.t.default,  # matvec_kn_fused's weight, stored [K, N], read as its transpose
    torch.ops.aten.clone.default,  # the rotaries' x.contiguous() of an x that is not (a match's shape: no example has it)
})

REGISTRY = PatternRegistry()
_fired: contextvars.ContextVar[collections.Counter[str] | None] = contextvars.ContextVar("graphex_fusion_fired",
                                                                                         default=None)


def pattern_pass() -> PatternMatcherPass:
    return REGISTRY.matcher


def checked(name: str, search_fn: Callable[..., Any], replace_fn: Callable[..., Any],
            extra_check: Callable[[Match], bool],
            count_as: Callable[[Match], str] | None = None) -> Callable[[Match], bool]:
    """The check a match passes before it is replaced: the pattern's own `extra_check`, then
    Note [A replacement keeps the layout]; a match that passes is counted under `name` (or `count_as(match)`)."""
    argnames = list(inspect.signature(search_fn).parameters)

    def check(match: Match) -> bool:
        ignored = _ignored_keyword(match)
        if ignored:
            _log.detail("pattern fusion: %s not applied at %s: %s", name, match.output_nodes()[0], ignored)
            return False
        if not extra_check(match):
            _log.detail("pattern fusion: %s not applied at %s: its check declined the match (a dtype, layout, shape or "
                        "value the kernel does not implement exactly; docs/fused-mode.md lists what each one takes)",
                        name, match.output_nodes()[0])
            return False
        why = _layout_differs(match, argnames, replace_fn) or _place_inputs_before_the_replacement(match)
        if why:
            _log.detail("pattern fusion: %s not applied at %s: %s", name, match.output_nodes()[0], why)
            return False
        fired = _fired.get()
        if fired is not None:  # Note [Fusion's state: one registry, counts per run]
            fired[count_as(match) if count_as is not None else name] += 1
        return True

    return check


# Note [A match reads every argument]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's matcher compares only the keyword arguments a pattern's node has; one the graph's node has
# beyond those is dropped before comparing (inductor's patterns rely on it). So `torch.add(x, r,
# alpha=0.5)` matched `x + r` and add + RMSNorm was fused without the 0.5 (off by ~1), and a rotary
# written with `torch.add(..., alpha=-1.0)` became `rotary` (off by up to 7). A match is declined
# unless each such extra keyword holds its schema's default value (alpha=1 is `x + r`).
def _ignored_keyword(match: Match) -> str:
    """'' or "aten.add.Tensor(..., alpha=0.5)": a keyword argument of a matched node that the pattern did not compare."""
    for pattern, node in match.ctx.pattern_to_node.items():
        compared = getattr(pattern, "kwargs", None)
        if not isinstance(node, torch.fx.Node) or not isinstance(compared, dict) or not hasattr(pattern, "fns"):
            continue  # a leaf (KeywordArg, Arg, Ignored) or a failed try
        for key, value in node.kwargs.items():
            if key not in compared and not _is_default(node.target, key, value):
                return f"{node.target}(..., {key}={value!r}) is not what the pattern computes"
    return ""


def _is_default(target: Any, key: str, value: Any) -> bool:
    schema = getattr(target, "_schema", None)
    for arg in (schema.arguments if schema is not None else ()):
        if arg.name == key:
            if not arg.has_default_value():
                return False
            default = arg.default_value
            return type(value) in (int, float, bool, type(None)) and type(default) in (int, float, bool, type(None)) \
                and value == default and (value is None) == (default is None)
    return False


# Note [A replacement is placed where its inputs exist]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's matcher inserts the replacement before the match's earliest output. An input of the match
# computed after that point (Gemma's RMSNorm weight `1 + w`, written after the residual add that is
# the earliest output of add + RMSNorm) would be used before it is defined: the user's compile failed
# ("Argument 'add_7' of Node 'add_rms_norm_default_4' was used before it has been defined!"). Such an
# input is moved up to the insertion point when it and what it needs after that point are pure ops
# outside the match (moving them changes no value); otherwise the match is declined.
def _place_inputs_before_the_replacement(match: Match) -> str:
    outputs = [n for n in match.output_nodes() if isinstance(n, torch.fx.Node)]
    if not outputs:
        return ""
    graph = outputs[0].graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    point = min(outputs, key=order.__getitem__)
    matched = set(match.nodes)
    late: list[torch.fx.Node] = []
    seen: set[torch.fx.Node] = set()

    def need(node: Any) -> str:
        if not isinstance(node, torch.fx.Node) or node in seen or order[node] < order[point]:
            return ""
        seen.add(node)
        if node in matched or node.op != "call_function" or not _pure(node.target):
            return f"its input {node.name} is computed after the point the replacement goes, and cannot move"
        for arg in node.all_input_nodes:
            why = need(arg)
            if why:
                return why
        late.append(node)
        return ""

    for value in match.kwargs.values():
        for leaf in pytree.tree_leaves(value):
            why = need(leaf)
            if why:
                return why
    if not late:
        return ""
    last = max(order[n] for n in late)
    for node in list(graph.nodes)[order[point]:last]:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and node.target is not operator.getitem and (schema is None or schema.is_mutable):
            return f"its input {late[0].name} is computed after {node.name}, which may write memory it reads"
    for node in sorted(late, key=order.__getitem__):
        point.prepend(node)
    return ""


def _pure(target: Any) -> bool:
    """An ATen-style op that writes nothing, returns no alias and draws no random numbers."""
    schema = getattr(target, "_schema", None)
    return schema is not None and not schema.is_mutable and \
        not any(a.alias_info is not None for a in schema.returns) and \
        torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ())


# Note [A replacement keeps the layout]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The nodes after a match were traced with the strides eager's ops gave the matched outputs, and
# some of them depend on it (a `view` of a transposed result is only valid for one layout). A
# replacement whose outputs are laid out differently (an op returning contiguous memory where eager
# kept its input's layout) would make such a view fail at run time. So the replacement is run on
# the match's fake inputs first, and a match is skipped when an output's shape, dtype or strides
# (over dimensions longer than 1) differ from the original's.
def _layout_differs(match: Match, argnames: list[str], replace_fn: Callable[..., Any]) -> str:
    def val(a: Any) -> Any:
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    args = [pytree.tree_map(val, match.kwargs[n]) for n in argnames if n in match.kwargs]
    fake_mode = detect_fake_mode(args)
    if fake_mode is None or len(args) != len(argnames):
        return ""
    try:
        with fake_mode:
            new = pytree.tree_leaves(replace_fn(*args))
    except Exception as e:  # the replacement does not apply to these inputs: no match, the graph stays exact
        return f"the replacement fails on the match's inputs: {type(e).__name__}: {str(e).splitlines()[0]}"
    old = [val(n) for n in match.output_nodes()]
    if len(new) != len(old):
        return ""  # one packed output replaced by several (torch's matcher handles that case itself)
    for i, (a, b) in enumerate(zip(new, old)):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i}: the replacement gives {a.dtype}{list(a.shape)}, the graph has {b.dtype}{list(b.shape)}"
        if any(sa != sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape) if n > 1):
            return (f"output {i}: the replacement's strides {list(a.stride())} differ from the graph's "
                    f"{list(b.stride())} (Note [A replacement keeps the layout])")
    return ""


def note_registered(name: str, identity: str) -> None:
    REGISTRY.lines.append(f"{name}: {identity}")


@functools.lru_cache(maxsize=None)
def _builtins_identity() -> str:
    """The built-in patterns as the source that defines them (patterns.py, attention_patterns.py, rotary_patterns.py,
    checks.py, spellings.py), and the rules of element-wise chains, pooling and batch norm (chains.py, pooling.py,
    batch_norm.py): known without tracing."""
    from . import attention_patterns, batch_norm, chains, checks, patterns, pooling, rotary_patterns, spellings

    text = "".join(inspect.getsource(m) for m in (patterns, attention_patterns, rotary_patterns, checks, spellings,
                                                  chains, pooling, batch_norm))
    return hashlib.sha256(text.encode()).hexdigest()


def registered_patterns() -> list[str]:
    """What fused mode matches with, for cache keys: the built-ins (by their source) and users' patterns."""
    with REGISTRY.lock:
        return [f"builtins: {_builtins_identity()}", *REGISTRY.lines]


# Note [Built-in patterns are traced per dtype, when needed]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Most built-in patterns match every fused dtype (a pattern's ops do not name a dtype); the
# float32-upcast forms of bfloat16 and float16 models (Llama's norm, a float32 softmax) cast back to
# the model's dtype and are traced once per dtype. Tracing all of them costs about four seconds (where
# this torch has shipped graphs, 0.3 s: Note [Built-in patterns ship as traced graphs], serialized/), so
# run_fusion registers the float32 group at the first fused compile and a reduced dtype's group at the
# first graph holding a tensor of that dtype. A user's register_replacement traces every group first,
# so that at a shared anchor the built-ins are always tried before users' patterns. The compile-cache
# key names the built-ins by their source (registered_patterns), so it needs no tracing and does not
# depend on which groups a process has traced.
def _reduced_dtypes(graph: torch.fx.Graph) -> set[torch.dtype]:
    found = set()
    for node in graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype in REDUCED_DTYPES:
            found.add(val.dtype)
    return found


# Note [A fused compile that fused nothing says so]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# pattern_fusion_pass=True on a model no pattern matches (bfloat16, a spelling no pattern knows) runs
# exact at exact mode's speed; a user who asked for fused mode would not learn it without GRAPHEX_LOG.
# The first such graph in a process warns once (GraphexWarning); GRAPHEX_LOG=2 says why each match
# was declined.
def run_fusion(gm: torch.fx.GraphModule, graph_name: str = "") -> dict[str, int]:
    """Replace every match of the registered patterns in `gm`; returns {pattern name: times fired}."""
    counts: collections.Counter[str] = collections.Counter()
    with REGISTRY.lock:
        token = _fired.set(counts)  # Note [Fusion's state: one registry, counts per run]
        try:
            normalize_arguments(gm.graph)  # Note [Arguments are matched in one spelling]
            # Note [A built-in pattern is registered once a graph can hold it]
            REGISTRY.ensure_builtins(_reduced_dtypes(gm.graph), call_targets(gm))
            with one_trace_per_shape():  # Note [A match's re-trace is made once per shape]
                REGISTRY.matcher.apply(gm.graph)
                if merge_repeated_views(gm.graph):  # a view written twice, as one node: the patterns once more
                    REGISTRY.matcher.apply(gm.graph)
        finally:
            _fired.reset(token)
    fired = dict(counts)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    if fired:
        _log.info("%s: pattern fusion: %s", graph_name,
                  ", ".join(f"{name} x{count}" for name, count in sorted(fired.items())))
    else:
        _log.info("%s: pattern fusion: no pattern matched", graph_name)
    return fired


def say_if_nothing_fused(fired: dict[str, int], graph_name: str) -> None:
    """Note [A fused compile that fused nothing says so]: called once fused mode's passes (patterns, element-wise
    chains) have run on a graph."""
    if not fired:
        warn_once("fusion:nothing-fired",
                  f"graphex: pattern_fusion_pass=True, but no fused kernel matched in {graph_name or 'the graph'}: "
                  "it runs exact (eager's kernels). The built-in patterns fuse float32, bfloat16 and float16 tensors on the CPU "
                  "(docs/fused-mode.md); GRAPHEX_LOG=2 logs each match that was declined and why.")
