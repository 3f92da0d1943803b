"""The torch internals graphex leans on still have the shape graphex expects (issue: the torch range).

graphex supports a range of torch releases (pyproject.toml, graphex/compat/). A private name that moves or
changes shape in a new release should fail here, once, naming the torch version, the internal and the graphex
file that uses it, instead of failing a user's compile deep inside a pass.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os

import pytest
import torch

from graphex import compat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "graphex")
VERSION = f"torch {torch.__version__}"


def _graphex_sources():
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d not in ("_vendor", "fb", "__pycache__")]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                yield os.path.relpath(path, ROOT), ast.parse(open(path).read(), path)


def _private_imports():
    """(file:line, module, name or None) for every `from torch._x import y` and `import torch._x` in graphex."""
    found = []
    for rel, tree in _graphex_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch") \
                    and "._" in "." + node.module.partition(".")[2]:
                found += [(f"{rel}:{node.lineno}", node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [(f"{rel}:{node.lineno}", a.name, None) for a in node.names if a.name.startswith("torch._")]
    return found


def _private_attribute_chains():
    """(file:line, 'torch._C._dynamo.guards.GlobalStateGuard') for every attribute chain from `torch` through a
    private name that graphex reads."""
    found = {}
    for rel, tree in _graphex_sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            parts, cur = [], node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id == "torch" and any(p.startswith("_") for p in parts):
                chain = "torch." + ".".join(reversed(parts))
                found.setdefault(chain, f"{rel}:{node.lineno}")
    # the longest chains only: each prefix is checked on the way
    return sorted((where, c) for c, where in found.items() if not any(o.startswith(c + ".") for o in found))


def test_every_private_import_exists():
    missing = []
    for where, module, name in _private_imports():
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{where}: import {module} ({e})")
            continue
        if name is not None and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{where}: {module}.{name}")
    assert not missing, f"{VERSION} lacks internals graphex imports:\n" + "\n".join(missing)


def _resolve(chain):
    obj = torch
    parts = chain.split(".")[1:]
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            try:
                obj = importlib.import_module(".".join(["torch", *parts[:i + 1]]))
                continue
            except ImportError:
                return False
        obj = getattr(obj, part)
    return True


# attribute chains that exist only with an optional torch feature built in, or are dunder-protocol reads
_OPTIONAL = ("torch._C._distributed", "torch.distributed", "torch._C._cuda", "torch.cuda")


def test_every_private_attribute_chain_resolves():
    missing = [f"{where}: {chain}" for where, chain in _private_attribute_chains()
               if not chain.startswith(_OPTIONAL) and not _resolve(chain)]
    assert not missing, f"{VERSION} lacks internals graphex reads:\n" + "\n".join(missing)


def test_the_scan_sees_the_internals_graphex_is_known_to_use():
    """The two scans above are only as good as what they find."""
    imports = {(m, n) for _, m, n in _private_imports()}
    assert ("torch._inductor.fx_passes.post_grad", "noop_registry") in imports
    assert ("torch._inductor.pattern_matcher", "PatternMatcherPass") in imports
    chains = {c for _, c in _private_attribute_chains()}
    assert any(c.startswith("torch._C._dynamo.guards.GlobalStateGuard") for c in chains)


# -- shapes: what graphex calls, with the arguments and fields it uses ------------------------------------------------
def test_noop_registry_selector_convention_is_known():
    """inductor's noop_registry: {target: (cond, src_index)}; src_index an int or a selector whose calling
    convention changed in 2.15 (compat.noop_source)."""
    from torch._inductor.fx_passes.post_grad import noop_registry

    cond, src_index = noop_registry[torch.ops.aten.cat.default]
    assert callable(cond)
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    cat = graph.call_function(torch.ops.aten.cat.default, ([a],))
    assert compat.noop_source(cat, src_index) is a, VERSION
    clone_entry = noop_registry[torch.ops.aten.clone.default]
    assert len(clone_entry) == 2, VERSION


def test_inductor_reinplace_pieces_graphex_uses():
    """Note [Reinplacing decides and records in one place]: graphex reads inductor's table and calls its scatter
    canonicalization and decomposition around its own decisions, with torch's overlap test."""
    from torch._inductor.fx_passes import reinplace

    op = next(iter(reinplace.inplaceable_ops.values()))
    params = inspect.signature(type(op)).parameters  # compat.inplaceable_ops_table rebuilds one positionally
    assert list(params)[:2] == ["inplace_op", "mutated_arg"], f"{VERSION}: InplaceableOp{inspect.signature(type(op))}"
    assert hasattr(op, "inplace_op") and isinstance(op.mutated_args, tuple) and callable(op.extra_check), VERSION
    assert reinplace._generalized_scatter in reinplace.inplaceable_ops, VERSION
    assert isinstance(getattr(reinplace, "inplaceable_foreach_ops", {}), dict), VERSION
    for name in ("canonicalize_view_scatter_ops", "decompose_generalized_scatter"):
        assert callable(getattr(reinplace, name)), f"{VERSION}: reinplace.{name}"
    assert torch.ops.aten.sym_size.int in reinplace.META_ONLY_OPS, VERSION
    from torch._C._dynamo.guards import compute_overlapping_tensors  # compat.may_overlap

    a = torch.empty(4)
    assert len(compute_overlapping_tensors([a[:2], a[1:]])) == 2 and not compute_overlapping_tensors([a[:2], a[2:]])


def test_fake_tensor_updater_convention_is_known_and_updates():
    """compat.fake_tensor_updater: FakeTensorUpdater took the graph up to 2.12, the GraphModule since 2.13
    (handed the wrong one, a compile failed deep in no-op removal on 2.11 and 2.12)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._inductor.virtualized import V

    mode = FakeTensorMode()
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    b = graph.call_function(torch.ops.aten.mul.Tensor, (a, 2))
    graph.output(b)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with mode:
        a.meta["val"] = torch.empty(3, 4)
        b.meta["val"] = torch.empty(3, 4)
    with V.set_fake_mode(mode):
        updater = compat.fake_tensor_updater(gm)  # raises naming the version if the convention is new
        b.args = (a, 3)  # a changed node: its fake value is recomputed
        a.meta["val"] = mode.from_tensor(torch.empty(5, 4))
        updater.incremental_update()
    assert tuple(b.meta["val"].shape) == (5, 4), VERSION


def test_pattern_matcher_records_which_node_each_pattern_matched():
    """Note [A match reads every argument] walks Match.ctx.pattern_to_node and each CallFunction's .kwargs;
    torch <= 2.14 matches add(x, y) to add(x, y, alpha=2) (2.15 declines it itself) and graphex declines it."""
    from torch._inductor.pattern_matcher import CallFunction, KeywordArg, MatchContext, is_match

    from graphex.fusion.manager import _ignored_keyword

    def match(**kwargs):
        graph = torch.fx.Graph()
        x, y = graph.placeholder("x"), graph.placeholder("y")
        add = graph.call_function(torch.ops.aten.add.Tensor, (x, y), kwargs)
        graph.output(add)
        pattern = CallFunction(torch.ops.aten.add.Tensor, KeywordArg("x"), KeywordArg("y"))
        return pattern, add, MatchContext([pattern], graph=graph).match(pattern, add)

    pattern, add, plain = match()
    assert is_match(plain) and plain.ctx.pattern_to_node[pattern] is add, VERSION
    assert isinstance(pattern.kwargs, dict) and hasattr(pattern, "fns"), VERSION
    assert _ignored_keyword(plain) == ""
    _, _, default = match(alpha=1)
    assert is_match(default) and _ignored_keyword(default) == "", VERSION
    _, _, scaled = match(alpha=2)
    assert not is_match(scaled) or "alpha=2" in _ignored_keyword(scaled), VERSION


def test_pattern_matcher_register_replacement_takes_what_graphex_passes():
    from torch._inductor.pattern_matcher import Match, PatternMatcherPass, register_replacement

    params = inspect.signature(register_replacement).parameters
    for name in ("search_fn", "replace_fn", "example_inputs", "trace_fn", "pass_dicts", "extra_check"):
        assert name in params, f"{VERSION}: register_replacement has no parameter {name!r} ({list(params)})"
    assert callable(getattr(PatternMatcherPass, "apply", None)), VERSION
    assert callable(getattr(Match, "replace_by_example", None)), VERSION


def test_a_pattern_check_sees_a_scalar_whose_value_differs_from_the_example():
    """Note [A pattern's check sees every argument]: torch <= 2.12 handed extra_check a re-match without a
    scalar_workaround argument whose value differs from the example's (so fused decode_attention never
    fired there); compat.register_replacement gives the check the value and traces with no decompositions."""
    from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only
    from torch.fx.experimental.proxy_tensor import make_fx

    from graphex.fusion.registration import no_decompositions

    seen = []

    def search(x, s):
        return torch.softmax(x * s, -1)  # _softmax stays whole: traced with graphex's (empty) decompositions

    def replace(x, s):
        return torch.softmax(x * s, -1).abs()  # (non-negative already: the same values, a visible op)

    def check(match):
        seen.append(match.kwargs.get("s"))
        return True

    patterns = PatternMatcherPass()
    assert compat.register_replacement(search, replace, [torch.randn(2, 4)], fwd_only, patterns, check,
                                       get_decomp_fn=no_decompositions, scalar_workaround={"s": 0.375},
                                       search_fn_pattern=None, skip_duplicates=False, pattern_name="t"), VERSION
    gm = make_fx(lambda x: torch.softmax(x * 3.0, -1), tracing_mode="fake")(torch.randn(2, 4))
    assert patterns.apply(gm.graph) == 1, f"{VERSION}: the pattern did not match\n{gm.graph}"
    assert seen == [3.0], f"{VERSION}: the check saw s={seen}"
    assert any(n.target is torch.ops.aten.abs.default for n in gm.graph.nodes), VERSION


def test_dynamo_hands_over_guards_with_the_fields_graphex_reads():
    """cache_compile records Dynamo's guards through torch.compile's guard_filter_fn
    (Note [cache_compile keys on what the trace read])."""
    from torch._dynamo.types import GuardFilterEntry

    fields = {f.name for f in dataclasses.fields(GuardFilterEntry)}
    assert {"name", "has_value", "value", "guard_type", "orig_guard"} <= fields, f"{VERSION}: {fields}"
    seen = []

    def backend(gm, inputs, **_):
        return gm.forward

    scale = 2.0
    fn = torch.compile(lambda x: x * scale, backend=backend, fullgraph=True,
                       options=compat.guard_recorder(seen.extend))
    fn(torch.ones(2))
    kinds = {e.guard_type for e in seen}
    assert "TENSOR_MATCH" in kinds and "GLOBAL_STATE" in kinds, f"{VERSION}: {kinds}"
    assert all(isinstance(e.orig_guard.name, str) for e in seen)


def test_global_state_guard_round_trips():
    import json

    guard = torch._C._dynamo.guards.GlobalStateGuard()
    state = json.loads(guard.__getstate__())
    assert {"grad_mode", "num_threads", "default_dtype"} <= set(state), f"{VERSION}: {sorted(state)}"
    other = torch._C._dynamo.guards.GlobalStateGuard()
    other.__setstate__(json.dumps(state))
    assert other.check()
    with torch.no_grad():
        assert not other.check()


def test_dynamo_source_names():
    from torch._dynamo.source import AttrSource, GetItemSource, LocalSource

    src = AttrSource(GetItemSource(LocalSource("flat_args"), 0), "shape")
    assert compat.source_name(src) == "L['flat_args'][0].shape", VERSION


def test_a_contextvar_get_source_is_named_as_graphex_parses_it():
    """Note [A ContextVar is read by its get()]: since 2.15 Dynamo guards what ContextVar.get() returned under a
    source named `<the var>.get()` / `<the var>.get(<default>)`; graphex.inference.guard_sources parses exactly that."""
    from torch._dynamo import source as sources

    from graphex.inference.guard_sources import parse_source

    if not hasattr(sources, "ContextVarGetSource"):
        assert compat.TORCH_VERSION < (2, 15), f"{VERSION}: ContextVarGetSource is gone"
        return
    base = sources.AttrSource(sources.GlobalSource("MODE"), "var")
    for has_default, default, step in ((False, None, ("cv_get", (False, None))), (True, 3, ("cv_get", (True, 3)))):
        src = sources.ContextVarGetSource(base=base, has_default=has_default, default_value=default)
        assert parse_source(compat.source_name(src))[-1] == step, f"{VERSION}: {compat.source_name(src)}"


@pytest.mark.parametrize("name", ["_top_saved_tensors_default_hooks"])
def test_autograd_hooks_query(name):
    assert getattr(torch._C._autograd, name)(True) is None, VERSION


@pytest.mark.skipif(not compat.traces_side_streams(),
                    reason=f"side streams are lowered as fork/join from torch 2.13 (compat.traces_side_streams); this is {VERSION}")
def test_dynamos_stream_tracing_has_the_shape_graphex_lowers():
    """Note [Side streams in a program] (graphex/lowering/streams.py) reads Dynamo's table of a frame's streams (index 0: the
    stream the frame was called on), the `custom["stream"]` annotation, the `streams::*` ops and control_deps."""
    import torch._dynamo.graph_bytecode_inputs as table

    assert table.CURRENT_STREAM_INDEX == 0
    assert isinstance(table.index_to_external_object_weakref, dict)
    for op, args in (("fork", ["from_index", "to_index"]), ("join", ["from_index", "to_index"]),
                     ("record_stream", ["tensor", "stream_index"])):
        schema = getattr(torch.ops.streams, op).default._schema
        assert [a.name for a in schema.arguments] == args, schema
    from torch._inductor.fx_passes.control_dependencies import control_deps
    assert control_deps.name() == "control_deps"
    from torch._dynamo.variables.streams import get_current_stream  # the table's index 0 is registered first
    assert callable(get_current_stream)
