"""The built-in patterns' search graphs, traced once per torch minor version and shipped as Python source.

    __init__.py   BuiltinGraphs: a built-in's first trace, the shipped graph of the running torch where there is one
    writer.py     traces every built-in group and writes the graphs as source (the generator, and its test)
    __main__.py   python -m graphex.fusion.serialized --write | --check   (make fusion-patterns)
    torch_X_Y.py  generated, one per torch minor version: a function per built-in registration that rebuilds its graph

Note [Built-in patterns ship as traced graphs]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Registering a built-in pattern traces its search function (make_fx over real example tensors, in torch's
register_replacement): the common group took 2.4-3.8 s in a process that had traced nothing yet, and 1.7-1.9 s of
the shipped decoder's 3.6-3.7 s first fused call; each reduced dtype's group 0.7-0.8 s more (2026-12-07, a loaded
2-core machine: docs/fused-mode.md, "Capture cost"). What that first trace gives, the search graph, depends on the
search function, its example inputs and torch alone. So `python -m graphex.fusion.serialized --write` traces every
group once and writes each graph as the torch.fx calls that rebuild it, node for node (names, targets, arguments):
torch_2_13.py, a module imported like any other (no pickle, nothing else read from disk). At registration the
rebuilt graph is what torch's register_replacement gets back from its first call of the trace function
(compat.register_replacement's `first_trace`); torch makes the pattern from it as from its own trace
(fx_to_pattern, the duplicate check on the graph's text), so the pattern registered is the traced one, at the same
place in the registration order. Registering the common group then takes 0.25 s, and 0.5-0.8 s of that first call
(both first-call figures with importing the pattern modules).

Not torch's `search_fn_pattern` (what inductor's serialized_patterns use): given one, torch also stops re-tracing the
search function on each match's own shapes, and that re-trace is what compares the sizes, dims and view shapes the
general pattern ignores (a softmax over another dim, rotary_complex's `-1`: Note in rotary_patterns.py). Here every
match is still re-traced from the search function itself and compared before it is replaced, as before: that
per-match cost stays (most of what remains of a first fused call).

The shipped graphs are used when the module of the running torch's minor version exists, has this FORMAT and was
generated from the sources the built-ins have now (manager._builtins_identity). Otherwise (another torch, or a
checkout whose patterns changed since) each search function is traced, exactly as without this module, only slower;
GRAPHEX_LOG=1 says which and why. tests/python/test_fusion_serialized.py traces every group again and fails on any
difference, naming the pattern and the command that regenerates the file. SOURCES names the pattern modules only: a
change to how they are traced (registration.py's decompositions, compat.register_replacement) is caught by that
test, not at run time.
"""

from __future__ import annotations

import collections
import functools
import importlib
import inspect
from typing import Any, Callable

import torch

from ...base import log as _log

FORMAT = 1  # of the generated modules: what GRAPHS maps to (a function rebuilding one graph into a torch.fx.Graph)
REGENERATE = "python -m graphex.fusion.serialized --write (make fusion-patterns)"


def module_name(version: str | None = None) -> str:
    """The generated module for a torch version ('2.13.0+cpu' -> 'torch_2_13'): one per minor version."""
    major, minor = (version or torch.__version__).split("+")[0].split(".")[:2]
    return f"torch_{major}_{minor}"


def group_label(group: Any) -> str:
    """A BUILTIN_GROUPS key as keys name it: 'common' (None) or the dtype ('bfloat16')."""
    return "common" if group is None else str(group).removeprefix("torch.")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        strides = "" if value.is_contiguous() else f" strides {list(value.stride())}"
        return f"{dtype}{list(value.shape)}{strides}"
    return repr(value)


def registration_key(group: Any, search_fn: Callable[..., Any], example_inputs: list[Any],
                     scalar_workaround: dict[str, Any] | None) -> str:
    """What one built-in registration traces, as text: its group, search function and example inputs (shape, dtype,
    strides where not contiguous) and scalar_workaround, e.g. `common: rms_norm(x=float32[2, 3, 16],
    weight=float32[16], eps=1e-06)`."""
    names = list(inspect.signature(search_fn).parameters)
    args = [f"{n}={_describe(v)}" for n, v in zip(names, example_inputs)]
    args += [f"{n}={v!r}" for n, v in (scalar_workaround or {}).items()]
    return f"{group_label(group)}: {getattr(search_fn, '__qualname__', repr(search_fn))}({', '.join(args)})"


class BuiltinGraphs:
    """The first trace of each built-in search function in one registry: the shipped graph where `builders` has one
    (Note [Built-in patterns ship as traced graphs]), else the trace itself. With `record`, `recorded` keeps every
    one given out, by key, in registration order (what the writer writes); a process's registry keeps none."""

    def __init__(self, builders: dict[str, Callable[[torch.fx.Graph], None]] | None = None,
                 why_traced: str = "", record: bool = False) -> None:
        self.builders = builders
        self.why_traced = why_traced  # why there are no builders (GRAPHEX_LOG=1)
        self.record = record
        self.recorded: dict[str, torch.fx.GraphModule] = {}
        self.traced: list[str] = []  # keys traced although builders were given (a registration the module lacks)
        self._group: Any = None
        self._seen: collections.Counter[str] = collections.Counter()

    def begin_group(self, group: Any) -> None:
        """The registrations that follow are `group`'s (keys count repeats within one group, in its order)."""
        self._group, self._seen = group, collections.Counter()

    def first_trace(self, search_fn: Callable[..., Any], example_inputs: list[Any],
                    scalar_workaround: dict[str, Any] | None, trace: Callable[[], torch.fx.GraphModule],
                    wanted: Callable[[frozenset[Any]], bool] | None = None) -> torch.fx.GraphModule:
        """The search graph of one registration: rebuilt from its shipped source, or `trace()`. With `wanted`, a graph
        whose ops (call_function targets) it refuses raises Unwanted instead, a shipped one before it is built."""
        key = registration_key(self._group, search_fn, example_inputs, scalar_workaround)
        self._seen[key] += 1
        if self._seen[key] > 1:  # the same search function and inputs registered again in this group (none today)
            key = f"{key} #{self._seen[key]}"
        build = self.builders.get(key) if self.builders is not None else None
        if build is None:
            if self.builders is not None:
                self.traced.append(key)
                _log.info("fused mode: traced %s: the shipped patterns (%s) lack it; %s", key, module_name(),
                          REGENERATE)
            gm = trace()
            if wanted is not None and not wanted(ops := call_targets(gm)):
                raise Unwanted(ops, lambda: gm)
        else:
            if wanted is not None and not wanted(ops := _build_targets(build)):
                raise Unwanted(ops, functools.partial(rebuild, build))
            gm = rebuild(build)
        if self.record:
            self.recorded[key] = gm
        return gm


class Unwanted(Exception):
    """BuiltinGraphs.first_trace's graph, refused by `wanted` for its ops: the ops, and `make()`, which gives the graph
    later without counting the registration again (a traced one is kept, a shipped one is built then)."""

    def __init__(self, ops: frozenset[Any], make: Callable[[], torch.fx.GraphModule]) -> None:
        super().__init__("graphex: a built-in's search graph was not wanted yet")
        self.ops, self.make = ops, make


def call_targets(gm: torch.fx.GraphModule) -> frozenset[Any]:
    return frozenset(n.target for n in gm.graph.nodes if n.op == "call_function")


class _Targets:
    """What a shipped builder (placeholder, create_node, output calls only: writer.py) would put in a graph's
    call_function targets, without building the graph: a tenth of the cost, for a pattern that may never register."""

    def __init__(self) -> None:
        self.found: set[Any] = set()

    def placeholder(self, name: str) -> str:
        return name

    def create_node(self, op: str, target: Any, args: Any, kwargs: Any, name: str) -> str:
        if op == "call_function":
            self.found.add(target)
        return name

    def output(self, value: Any) -> None:
        pass


def _build_targets(build: Callable[[Any], None]) -> frozenset[Any]:
    targets = _Targets()
    build(targets)
    return frozenset(targets.found)


def rebuild(build: Callable[[torch.fx.Graph], None]) -> torch.fx.GraphModule:
    """The graph `build` makes, in a GraphModule (what torch's fx_to_pattern takes) whose Python code is generated
    only if something runs it: nothing does (a quarter of the registration's time otherwise)."""
    graph = torch.fx.Graph()
    build(graph)
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # pragma: no cover  (every torch graphex supports has it)
        return torch.fx.GraphModule(torch.nn.Module(), graph)
    return _LazyGraphModule(torch.nn.Module(), graph)


def tracing(why: str, record: bool = False) -> BuiltinGraphs:
    """Graphs traced one by one, as without shipped ones (the writer's, and a torch with no module)."""
    return BuiltinGraphs(None, why, record)


def shipped() -> BuiltinGraphs:
    """The graphs shipped for the running torch, or tracing where none apply (Note [Built-in patterns ship as traced
    graphs]); GRAPHEX_LOG=1 says which."""
    from ..manager import _builtins_identity

    name = module_name()
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        return _traced_because(f"no shipped patterns for torch {torch.__version__} (graphex/fusion/serialized/"
                               f"{name}.py); {REGENERATE} writes them")
    if getattr(module, "FORMAT", None) != FORMAT:
        return _traced_because(f"{name}.py has format {getattr(module, 'FORMAT', None)}, this graphex reads {FORMAT}; "
                               f"{REGENERATE}")
    try:
        sources = _builtins_identity()
    except (OSError, TypeError) as e:  # an installation without the .py sources: nothing to compare SOURCES with
        return _traced_because(f"the built-in patterns' sources cannot be read ({type(e).__name__}: {e}), so "
                               f"{name}.py cannot be shown to match them")
    if module.SOURCES != sources:
        return _traced_because(f"{name}.py was generated from other sources of the built-in patterns than these; "
                               f"{REGENERATE}")
    return BuiltinGraphs(module.GRAPHS)


def _traced_because(why: str) -> BuiltinGraphs:
    _log.info("fused mode: the built-in patterns are traced: %s", why)
    return tracing(why)
