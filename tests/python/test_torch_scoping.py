"""Note [graphex never patches torch]: what graphex changes is scoped to its own compile on its own thread.

Also the entry points for code that drives torch itself: graphex.get_backend and graphex.compile_fx.
"""

from __future__ import annotations

import functools
import threading

import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified
from torch._inductor.fx_passes import reinplace as inductor_reinplace

import graphex
from conftest import assert_same, compile_graphex, engine_runs


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def _torch_state() -> dict:
    scatter = inductor_reinplace._generalized_scatter
    return {
        "create_node": torch.fx.Graph.create_node,
        "inplaceable_ops": inductor_reinplace.inplaceable_ops,
        "inplaceable_ops_items": dict(inductor_reinplace.inplaceable_ops),
        "scatter_check": inductor_reinplace.inplaceable_ops[scatter].extra_check,
        "callback_clear": type(torch._dynamo.callback.callback_handler).clear,
        "instance_clear": torch._dynamo.callback.callback_handler.__dict__.get("clear"),
    }


def test_torch_is_unchanged_while_graphex_compiles():
    """Checked from inside the compile (a user pass runs between graphex's passes and lowering)."""
    before = _torch_state()
    seen = {}

    def look(graph: torch.fx.Graph) -> None:
        seen.update(_torch_state())

    def f(cache, pos, v, x):
        cache[pos] = v  # an input update: the reinplacing pass runs
        return x.sin() + cache.sum()

    compiled = compile_graphex(f, post_grad_custom_post_pass=look, post_grad_custom_pre_pass=look)
    cache, expected_cache = torch.zeros(4, 3), torch.zeros(4, 3)
    x, v = torch.randn(3), torch.randn(3)
    assert_same(compiled(cache, 1, v, x), f(expected_cache, 1, v, x))
    assert_same(cache, expected_cache)
    assert seen == before and _torch_state() == before
    assert seen["instance_clear"] is None  # callback_handler.clear is torch's own method


def test_graphex_and_inductor_compile_at_once_on_two_threads():
    """Each compile sees only its own behaviour; both results are right."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))

    def step(cache, idx, v, x):
        cache.index_copy_(0, idx, v)  # a scatter into an input: graphex always reinplaces it
        return model(x) + cache.sum(0)

    results, errors = {}, []
    barrier = threading.Barrier(2)

    def run(name: str, backend: str) -> None:
        try:
            with torch.no_grad():
                compiled = torch.compile(step, backend=backend, fullgraph=True, dynamic=False)
                cache = torch.zeros(6, 8)
                barrier.wait(timeout=60)
                outs = [compiled(cache, torch.tensor([i]), torch.full((1, 8), float(i)), torch.randn(2, 16,
                        generator=torch.Generator().manual_seed(i))) for i in range(3)]
                results[name] = (outs, cache)
        except BaseException as e:  # reported below
            errors.append((name, e))

    threads = [threading.Thread(target=run, args=("graphex", "graphex")),
               threading.Thread(target=run, args=("inductor", "inductor"))]
    # torch 2.11 keeps config overrides in one process-wide value, which two threads compiling at once can leave set
    # (automatic_dynamic_shapes=False, seen by later tests); and two threads entering fake-tensor mode for the first
    # time at once crash its CUDA build's device guard with no GPU. Both are torch's, not what this test checks.
    config = torch._dynamo.config.get_config_copy()
    with torch._subclasses.fake_tensor.FakeTensorMode():
        torch.empty(1)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    finally:
        torch._dynamo.config.load_config(config)
    assert not errors, errors
    cache = torch.zeros(6, 8)
    expected = [step(cache, torch.tensor([i]), torch.full((1, 8), float(i)),
                     torch.randn(2, 16, generator=torch.Generator().manual_seed(i))) for i in range(3)]
    graphex_outs, graphex_cache = results["graphex"]
    assert_same(graphex_outs, expected)  # bit for bit: eager's kernels
    assert_same(graphex_cache, cache)
    inductor_outs, inductor_cache = results["inductor"]
    for got, want in zip(inductor_outs, expected):
        torch.testing.assert_close(got, want)
    assert_same(inductor_cache, cache)


def test_custom_op_without_fake_under_inductor_gets_torchs_own_error():
    @torch.library.custom_op("gx_scope::nofake", mutates_args=())
    def nofake(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    f = lambda x: torch.ops.gx_scope.nofake(x) + 1  # noqa: E731
    with pytest.raises(Exception) as inductor_error:
        torch.compile(f, backend="inductor", fullgraph=True)(torch.randn(3))
    assert not isinstance(inductor_error.value, graphex.GraphexError)
    assert "There was no fake impl registered" in str(inductor_error.value)
    assert "graphex" not in str(inductor_error.value)

    # reset() clears every compile callback, graphex's too: until a graphex backend runs again, a missing fake
    # gets torch's message, which still names the op's fix (Note [Where custom-op errors are caught]).
    torch._dynamo.reset()
    with pytest.raises(Exception) as after_reset:
        compile_graphex(f)(torch.randn(3))
    assert "nofake.register_fake" in str(after_reset.value)
    compile_graphex(lambda x: x + 1)(torch.randn(3))  # a graphex backend ran: its callbacks are back
    with pytest.raises(graphex.CustomOpError) as graphex_error:
        compile_graphex(f)(torch.randn(3))
    assert graphex_error.value.finding.op == "gx_scope::nofake"
    assert "@nofake.register_fake" in graphex_error.value.finding.fix


def test_library_op_without_meta_under_inductor_is_not_graphexs_error():
    lib = torch.library.Library("gx_scope2", "FRAGMENT")
    lib.define("triple(Tensor x) -> Tensor")
    lib.impl("triple", lambda x: x * 3, "CPU")
    f = lambda x: torch.ops.gx_scope2.triple(x) + 1  # noqa: E731
    with pytest.raises(Exception) as inductor_error:
        torch.compile(f, backend="inductor", fullgraph=True)(torch.randn(3))
    assert not isinstance(inductor_error.value, graphex.GraphexError)
    torch._dynamo.reset()
    with pytest.raises(graphex.CustomOpError):
        compile_graphex(f)(torch.randn(3))


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
def test_modes_graphex_does_not_implement_are_refused(mode):
    f = torch.compile(lambda x: x - 1, backend="graphex", mode=mode)
    with pytest.raises(graphex.OptionsError, match=f"mode='{mode}'.*Remove mode="):
        f(torch.ones(2))


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_default_and_reduce_overhead_modes_are_graphex(mode):
    """reduce-overhead is what graphex does anyway (transformers' CompileConfig passes it by default)."""
    before = engine_runs()
    f = torch.compile(lambda x: x - 1, backend="graphex", mode=mode)
    assert_same(f(torch.ones(2)), torch.zeros(2))
    assert engine_runs() == before + 1, "the engine did not run the graph"


def test_get_backend_binds_options_and_checks_them_at_once():
    with pytest.raises(graphex.OptionsError, match="frozen_parmeter"):
        graphex.get_backend({"frozen_parmeter": True})
    seen = []
    backend = graphex.get_backend({"post_grad_custom_post_pass": lambda g: seen.append(len(g.nodes))})
    f = lambda x: torch.cos(x) * 2  # noqa: E731
    compiled = torch.compile(f, backend=backend, fullgraph=True, dynamic=False)
    x = torch.randn(7)
    before = engine_runs()
    assert_same(compiled(x), f(x))
    assert seen and engine_runs() == before + 1


def test_compile_fx_under_a_hand_written_aot_autograd_caller():
    """What a framework that runs AOTAutograd itself (vLLM-style) does: graphex compiles the ATen graph."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    graphs = []

    def my_backend(gm: torch.fx.GraphModule, example_inputs):
        def fw(aten_gm, aten_inputs):
            graphs.append(aten_gm)
            return graphex.compile_fx(aten_gm, aten_inputs, options={"validate_fake": True})

        return aot_module_simplified(gm, example_inputs, fw_compiler=fw,
                                     inference_compiler=functools.partial(graphex.compile_fx))

    compiled = torch.compile(model, backend=my_backend, fullgraph=True, dynamic=False)
    x = torch.randn(3, 8)
    before = engine_runs()
    for _ in range(2):
        assert_same(compiled(x), model(x))
    assert engine_runs() == before + 2
    with pytest.raises(graphex.OptionsError):
        graphex.compile_fx(torch.fx.symbolic_trace(torch.nn.ReLU()), [x], options={"nope": 1})
