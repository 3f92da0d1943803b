"""The backend as users reach it: names, entry points, and every option."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import graphex
from conftest import ROOT, assert_same, captures, compile_graphex, engine_runs, newest_capture
from graphex.options import option_docs


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=300)


def test_backend_names_are_registered_after_import():
    names = torch._dynamo.list_backends(exclude_tags=())
    assert "graphex" in names and "npugraph_ex" in names


@pytest.mark.parametrize("name", ["graphex", "npugraph_ex"])
def test_backend_works_without_importing_graphex(name):
    """The torch_dynamo_backends entry point makes the name known to torch.compile on its own."""
    result = run_python(f"""
        import sys, torch
        f = torch.compile(lambda x: torch.sin(x) * 2, backend="{name}", fullgraph=True, dynamic=False)
        x = torch.randn(5)
        with torch.no_grad():
            assert torch.equal(f(x), torch.sin(x) * 2)
        assert "graphex" in sys.modules, "the backend did not come from graphex"
        print("ok")
    """)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


_THREADS_FIRST_COMPILE = """
    import sys, threading, torch
    import graphex
    from graphex.inference.uncached import remember_compiled
    from graphex.options import Options

    barrier, errors, made = threading.Barrier(4), [], []

    def f(x):
        return torch.sin(x) * 2

    def make():  # torch.compile looks the backend up here, when it is called, not at the first run
        barrier.wait()
        try:
            if sys.argv[1] == "documented":
                made.append(torch.compile(f, backend=graphex.graphex_backend, fullgraph=True, dynamic=False))
            else:  # cache_compile's uncached path (autograd needed, or a call it cannot cache)
                made.append(remember_compiled(f, None, Options(), False))
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=make) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors and len(made) == 4, errors
    x = torch.randn(5)
    with torch.no_grad():  # run from one thread: torch 2.11's Dynamo crashes when threads trace at once, any backend
        assert all(torch.equal(compiled(x), f(x)) for compiled in made)
    print("ok")
"""


@pytest.mark.parametrize("how", ["documented", "cache_compile"])
def test_threads_first_compiles_at_once(how):
    """Note [Two threads' first lookup of a name]: torch's lookup of the name "graphex" is not thread-safe, so the
    way docs/backend.md gives threaded code (the backend function) and graphex's own compiles never look it up."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(_THREADS_FIRST_COMPILE), how],
                            capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ})
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_import_graphex_is_quiet():
    """Note [import graphex is quiet]: no torch, no argv, no registration until a name is used; then the backend
    works through the entry point, and a custom op without a fake still gets graphex's error in that compile."""
    result = run_python("""
        import sys
        sys.argv = ["graphex", "--help"]  # what the old import looked at: must not print help or exit
        import graphex
        assert "torch" not in sys.modules and "graphex.backend" not in sys.modules, sorted(sys.modules)
        import torch
        assert "graphex.backend" not in sys.modules
        assert not any(type(getattr(d, "_abstract_fn", None)).__name__ == "_MissingFake"
                       for d in torch._library.custom_ops.OPDEFS.values())  # no stand-in fakes at import

        @torch.library.custom_op("quiet_import::double", mutates_args=())
        def double(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        f = torch.compile(lambda x: double(x) + 1, backend="graphex", fullgraph=True, dynamic=False)
        try:
            f(torch.randn(3))
        except Exception as e:
            assert "quiet_import::double" in str(e) and "register_fake" in str(e), str(e)[:2000]
            assert "graphex" in str(e), str(e)[:2000]
        else:
            raise AssertionError("a custom op without a fake compiled")
        print("ok", graphex.Options.__name__, graphex.inference.__name__)
    """)
    assert result.returncode == 0 and "ok Options graphex.inference" in result.stdout, result.stderr[-3000:]


def test_unknown_option_is_a_value_error_listing_the_valid_ones():
    f = compile_graphex(lambda x: x + 1, frozen_parmeter=True)
    with pytest.raises(ValueError) as info:
        f(torch.randn(2))
    message = str(info.value)
    assert "frozen_parmeter" in message
    for name, _, _ in option_docs():
        assert name in message
    assert isinstance(info.value, graphex.OptionsError)


@pytest.mark.parametrize("options", [{"capture_limit": 0}, {"capture_limit": "8"}, {"force_eager": 1},
                                     {"post_grad_custom_pre_pass": "not callable"}, {"capture_error_mode": "strict"},
                                     {"data_dump_stage": "both"}, {"data_dump_calls": 0}, {"use_graph_pool": (1,)},
                                     {"dump_dir": 3}])
def test_bad_option_values_are_rejected(options):
    f = compile_graphex(lambda x: x + 1, **options)
    with pytest.raises(graphex.OptionsError, match=next(iter(options))):
        f(torch.randn(2))


def test_force_eager_runs_the_optimized_graph_without_the_engine():
    def f(x, cache):
        cache.add_(x)
        return cache * 2

    x, cache, ref_cache = torch.randn(4), torch.zeros(4), torch.zeros(4)
    compiled = compile_graphex(f, force_eager=True)
    before = engine_runs()
    assert_same(compiled(x, cache), f(x, ref_cache))
    assert_same(cache, ref_cache)
    assert engine_runs() == before


def test_frozen_parameter_binds_parameters_once_and_sees_in_place_updates():
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    compiled = compile_graphex(model, frozen_parameter=True)
    assert_same(compiled(x), model(x))
    graph = newest_capture()
    frozen = graph.lowered.frozen_inputs
    assert len(frozen) == 2  # weight and bias
    assert all(graph.lowered.program.inputs[i].kind == "other" for i in frozen)
    model.weight.data.mul_(2)  # in-place update: same tensor, new values
    assert_same(compiled(x), model(x))


def test_clone_output_copies_computed_outputs_but_keeps_views_of_inputs():
    def f(x):
        return x * 2, x.view(-1)

    x = torch.randn(2, 3)
    doubled, flat = compile_graphex(f, clone_output=True)(x)
    assert_same([doubled, flat], list(f(x)))
    assert flat.data_ptr() == x.data_ptr()


def test_remove_noop_ops_switch():
    def f(x):
        return (x.clone().view(x.shape) + 1).contiguous()

    x = torch.randn(3, 3)
    for enabled in (True, False):
        torch._dynamo.reset()
        assert_same(compile_graphex(f, remove_noop_ops=enabled)(x), f(x))
        ops = newest_capture().num_ops
        if enabled:
            with_removal = ops
        else:
            assert ops > with_removal


def test_custom_passes_run_before_and_after_ours():
    seen = []

    def pre(graph: torch.fx.Graph):
        seen.append(("pre", sum(1 for n in graph.nodes if n.op == "call_function")))

    def post(graph: torch.fx.Graph):
        seen.append(("post", 0))
        for node in graph.nodes:  # a real rewrite: sin -> cos
            if node.target is torch.ops.aten.sin.default:
                node.target = torch.ops.aten.cos.default

    x = torch.randn(5)
    out = compile_graphex(torch.sin, post_grad_custom_pre_pass=pre, post_grad_custom_post_pass=post)(x)
    assert [s[0] for s in seen] == ["pre", "post"]
    assert_same(out, torch.cos(x))


def test_capture_limit_counts_no_shape_of_a_dynamic_cpu_program():
    """Note [capture_limit counts device graphs]: on the CPU one dynamic program serves every shape."""
    def f(x):
        return x * 2 + x.shape[0]

    compiled = compile_graphex(f, dynamic=True, capture_limit=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 4, 5, 6, 7):
            x = torch.randn(n)
            assert_same(compiled(x), f(x))
    messages = [str(w.message) for w in caught if "capture_limit" in str(w.message)]
    assert messages == []
    (graph,) = captures()  # one program served every shape, all of them on the engine
    assert graph.executor.run_count == 5


def test_docs_document_every_option():
    page = open(os.path.join(ROOT, "docs", "backend.md")).read()  # its generated block: `graphex options`
    for name, default, _ in option_docs():
        assert f"| `{name}` | `{default!r}` |" in page, \
            f"docs/backend.md's option table lacks {name} (run `python scripts/update_docs.py`)"


def test_on_capture_hooks_see_each_capture_made_inside_the_block_and_no_other():
    """Note [Tools see captures through one registry]: what graphex triage counts the user's copies with."""
    from graphex.compile import on_capture

    seen = []
    torch._dynamo.reset()
    with on_capture(lambda dynamo_graph, compiled: seen.append((dynamo_graph, compiled))):
        compile_graphex(lambda x: x.clone() * 2)(torch.ones(2))
    compile_graphex(lambda x: x * 3)(torch.ones(2))
    ((dynamo_graph, compiled),) = seen
    assert isinstance(dynamo_graph, torch.fx.GraphModule) and compiled.name.startswith("graph_")
    assert any(n.target == "clone" or n.target is torch.clone for n in dynamo_graph.graph.nodes)
