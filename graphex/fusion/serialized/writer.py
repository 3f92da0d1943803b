"""Tracing every built-in group and writing the graphs as Python source (Note [Built-in patterns ship as traced
graphs], __init__.py): what `python -m graphex.fusion.serialized --write` runs, and what the test compares."""

from __future__ import annotations

import math
import operator
import textwrap
from typing import TYPE_CHECKING, Any

import torch

from . import FORMAT, REGENERATE, BuiltinGraphs, module_name, tracing

if TYPE_CHECKING:
    from ..manager import PatternRegistry


def register_builtins(graphs: BuiltinGraphs | None) -> PatternRegistry:
    """A registry of its own holding every built-in group, first traces made by `graphs` (None: the shipped ones);
    the process's REGISTRY is left as it is."""
    from .. import manager

    registry = manager.PatternRegistry(graphs=graphs)
    saved = manager.REGISTRY
    manager.REGISTRY = registry  # register_named registers into manager.REGISTRY
    try:
        registry.ensure_builtins()
    finally:
        manager.REGISTRY = saved
    return registry


def trace_builtins() -> dict[str, torch.fx.GraphModule]:
    """Every built-in registration's first trace, by key, in registration order, each search function traced."""
    graphs = register_builtins(tracing("writing the shipped patterns", record=True)).graphs
    assert graphs is not None
    return graphs.recorded


class UnwritableGraph(Exception):
    """A traced graph holds something the writer cannot write as source (a new kind of target or constant)."""


_RESERVED = {"g", "torch", "aten", "prims", "operator", "inf", "nan"}  # names the generated module itself uses


def _target(target: Any, where: str) -> str:
    if target is operator.getitem:
        return "operator.getitem"
    if isinstance(target, torch._ops.OpOverload):
        namespace = target.namespace
        text = f"{namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
        if namespace in ("aten", "prims"):
            return text
        return f"torch.ops.{text}"
    raise UnwritableGraph(f"{where}: the target {target!r} ({type(target).__name__}) is not an OpOverload or "
                          "operator.getitem; teach graphex/fusion/serialized/writer.py._target to write it")


def _literal(value: Any, where: str) -> str:
    """`value` (an argument of a node) as source; nodes by their variable."""
    if isinstance(value, torch.fx.Node):
        return value.name
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
        return str(value)  # 'torch.float32', 'torch.contiguous_format', 'torch.strided'
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, tuple):
        items = [_literal(v, where) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, list):
        return f"[{', '.join(_literal(v, where) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_literal(v, where)}" for k, v in value.items()) + "}"
    if isinstance(value, slice):
        return f"slice({_literal(value.start, where)}, {_literal(value.stop, where)}, {_literal(value.step, where)})"
    raise UnwritableGraph(f"{where}: the argument {value!r} ({type(value).__name__}) has no source form; teach "
                          "graphex/fusion/serialized/writer.py._literal to write it")


def render_builder(fn_name: str, key: str, graph: torch.fx.Graph) -> str:
    """One graph as a function `fn_name(g)` that rebuilds it node for node (op, target, arguments, name) in `g`."""
    lines = [f"def {fn_name}(g):", f"    # {key}"]
    for node in graph.nodes:
        where = f"{key}, node {node.name}"
        if node.name in _RESERVED or not node.name.isidentifier():
            raise UnwritableGraph(f"{where}: the node's name is one the generated module uses itself")
        if node.type is not None or (node.op == "placeholder" and node.args):
            raise UnwritableGraph(f"{where}: a type annotation or a default value, which the writer does not write")
        if node.op == "placeholder" and node.name == node.target:
            lines.append(f"    {node.name} = g.placeholder({node.target!r})")
        elif node.op == "placeholder":
            lines.append(f"    {node.name} = g.create_node('placeholder', {node.target!r}, (), {{}}, {node.name!r})")
        elif node.op == "call_function":
            lines.append(f"    {node.name} = g.create_node('call_function', {_target(node.target, where)}, "
                         f"{_literal(tuple(node.args), where)}, {_literal(dict(node.kwargs), where)}, {node.name!r})")
        elif node.op == "output":
            lines.append(f"    g.output({_literal(node.args[0], where)})")
        else:
            raise UnwritableGraph(f"{where}: a {node.op} node (a pattern's graph holds placeholders, calls and its "
                                  "output)")
    return "\n".join(lines)


def render_module(graphs: dict[str, torch.fx.GraphModule]) -> str:
    """The generated module for the running torch: a header, FORMAT, TORCH (its minor version: one module serves
    every patch release), SOURCES, a builder per graph, GRAPHS (key -> builder, in registration order)."""
    from ..manager import _builtins_identity

    minor = torch.__version__.split("+")[0].rsplit(".", 1)[0]
    header = textwrap.dedent(f'''\
        # Generated by {REGENERATE}: do not edit.
        # The first trace of every built-in fused-mode pattern's search function (graphex/fusion/patterns.py
        # BUILTIN_GROUPS, each group in registration order) under torch {minor}, each written as the
        # torch.fx calls that rebuild it: Note [Built-in patterns ship as traced graphs] (graphex/fusion/serialized/
        # __init__.py). Used under every torch {minor}.x while SOURCES is manager._builtins_identity() (the
        # sources of the built-ins); tests/python/test_fusion_serialized.py fails when a fresh trace differs.
        # fmt: off
        # ruff: noqa
        import operator

        import torch

        aten = torch.ops.aten
        prims = torch.ops.prims
        inf = float("inf")
        nan = float("nan")

        FORMAT = {FORMAT}
        TORCH = {minor!r}
        SOURCES = {_builtins_identity()!r}
        ''')
    builders = [render_builder(f"_graph_{i}", key, gm.graph) for i, (key, gm) in enumerate(graphs.items())]
    table = "\n".join(f"    {key!r}: _graph_{i}," for i, key in enumerate(graphs))
    return header + "\n\n" + "\n\n\n".join(builders) + "\n\n\nGRAPHS = {\n" + table + "\n}\n"


def module_path() -> str:
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{module_name()}.py")
