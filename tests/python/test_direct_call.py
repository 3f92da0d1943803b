"""Dynamo calls graphex's DirectCall where AOTAutograd's per-call wrapper would only bump version counters and turn
grad mode off (Note [A plain inference graph skips AOTAutograd's wrapper], csrc/python/direct_call.cpp;
graphex/compat/aot.py decides). Each case compiles the same code twice, with and without `direct_call`, and
compares what a caller can see: outputs (bitwise, and which are inputs or views of them), the inputs' values and
version counters, grad mode and requires_grad. Where the wrapper has more to do, it must be kept.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import graphex
import graphex._C as C
from graphex.compile import compile_dynamo_graph
from graphex.options import Options


def _compiled(fn, direct: bool):
    """fn compiled with graphex (direct_call on or off), and the list of what the backend handed Dynamo."""
    handed = []

    def backend(gm, example_inputs):
        out = compile_dynamo_graph(gm, example_inputs, Options.from_user({"direct_call": direct}))
        handed.append(out)
        return out

    backend._graphex_backend = True
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False), handed


def _fresh(make_inputs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in make_inputs()]


def _observed(fn, direct, make_inputs, calls=3, grad=False):
    """Everything a caller sees over `calls` calls on fresh inputs: per call the outputs and, per input, its value
    and how far its version counter moved; plus what the backend handed Dynamo."""
    compiled, handed = _compiled(fn, direct)
    inputs = _fresh(make_inputs)
    seen = []
    with torch.set_grad_enabled(grad):
        for _ in range(calls):
            before = [x._version if isinstance(x, torch.Tensor) else None for x in inputs]
            out = compiled(*inputs)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            seen.append({
                "grad_mode": torch.is_grad_enabled(),
                "outs": [o.clone() for o in outs],
                "requires_grad": [o.requires_grad for o in outs],
                "is_input": [any(o is x for x in inputs) for o in outs],
                "views_input": [o._base is not None and any(o._base is x for x in inputs) for o in outs],
                "views_output": [next((j for j, p in enumerate(outs) if o._base is p), None) for o in outs],
                "inputs": [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs],
                "bumped": [x._version - b if b is not None else None for x, b in zip(inputs, before)],
            })
    return seen, handed


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if k in ("outs", "inputs"):
                for u, v in zip(x[k], y[k]):
                    if isinstance(u, torch.Tensor):
                        assert u.dtype == v.dtype and u.shape == v.shape and u.stride() == v.stride()
                        assert torch.equal(u, v), k
                    else:
                        assert u == v
            elif k == "bumped":
                # AOTAutograd bumps a mutated input once more than eager (its wrapper and the engine's in-place op
                # both do); what must hold is that a mutated input moves iff it moves under AOTAutograd
                assert [None if d is None else d > 0 for d in x[k]] == [None if d is None else d > 0 for d in y[k]]
            else:
                assert x[k] == y[k], k


class Cache(torch.nn.Module):
    """A decode step that writes its cache argument in place (a KV cache), and reads the new row back."""

    def forward(self, x, cache, pos):
        cache.index_copy_(0, pos, x)
        return (cache * 2).sum(0), x + 1


def _cache_inputs():
    return [torch.randn(1, 4), torch.zeros(5, 4), torch.tensor([2])]


PLAIN = {
    # frozen weights: with grad on, a parameter that requires grad makes it a training graph (kept below)
    "linear + relu": (lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval().requires_grad_(False),
                      lambda: [torch.randn(3, 8)]),
    "in-place cache write": (Cache, _cache_inputs),
    "two outputs, a reshape": (lambda: (lambda a, b: ((a @ b).reshape(-1), torch.tanh(b))),
                               lambda: [torch.randn(3, 4), torch.randn(4, 5)]),
    # AOTAutograd calls a view of an intermediate that is an output too a plain output in inference: nothing to do
    "an output that views another": (lambda: _returns_a_view_of_an_intermediate, lambda: [torch.randn(3, 4)]),
}


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad_on"])
@pytest.mark.parametrize("case", list(PLAIN))
def test_a_plain_inference_graph_gets_a_direct_call_that_behaves_as_aotautograds_wrapper(case, grad):
    make, make_inputs = PLAIN[case]
    torch.manual_seed(0)
    inputs = make_inputs()
    fn = make()
    direct, handed_direct = _observed(fn, True, lambda: inputs, grad=grad)
    torch._dynamo.reset()
    kept, handed_kept = _observed(fn, False, lambda: inputs, grad=grad)
    assert [type(h) for h in handed_direct] == [C.DirectCall]
    assert not any(isinstance(h, C.DirectCall) for h in handed_kept)
    _assert_same(direct, kept)
    # and both are eager's, bit for bit
    eager_inputs = _fresh(lambda: inputs)
    with torch.set_grad_enabled(grad):
        for step in direct:
            want = fn(*eager_inputs)
            want = list(want) if isinstance(want, (tuple, list)) else [want]
            for got, w in zip(step["outs"], want):
                assert torch.equal(got, w)
            for got, w in zip(step["inputs"], eager_inputs):
                assert torch.equal(got, w) if isinstance(w, torch.Tensor) else got == w


def test_the_direct_call_runs_the_engine_and_skips_the_wrapper_after_the_first_call():
    fn = torch.nn.Linear(4, 4).eval()
    compiled, handed = _compiled(fn, True)
    x = torch.randn(2, 4)
    runs = C.total_run_count()
    with torch.no_grad():
        compiled(x)  # the first call: AOTAutograd's own callable (its first-call checks run once)
        (direct,) = handed
        assert isinstance(direct, C.DirectCall) and callable(direct.aot)
        for _ in range(3):
            assert torch.equal(compiled(x), fn(x))
    assert C.total_run_count() - runs == 4


def test_a_version_counter_moves_when_the_graph_writes_the_input():
    compiled, handed = _compiled(Cache(), True)
    x, cache, pos = _cache_inputs()
    with torch.no_grad():
        for _ in range(3):
            v = cache._version
            compiled(x, cache, pos)
            assert cache._version > v
    assert isinstance(handed[0], C.DirectCall)


def test_grad_mode_is_off_inside_and_restored_after_an_error():
    def f(x, i):
        return torch.index_select(x, 0, i) * 2  # an index past the end fails in the engine

    compiled, handed = _compiled(f, True)
    x = torch.randn(4)
    with torch.enable_grad():
        assert not compiled(x, torch.tensor([1])).requires_grad
        compiled(x, torch.tensor([1]))
        with pytest.raises(IndexError):
            compiled(x, torch.tensor([9]))
        assert torch.is_grad_enabled()
    assert isinstance(handed[0], C.DirectCall)


def _returns_its_input(x):
    x.add_(1)
    return x


def _returns_a_view(x):
    return x.view(-1) * 1, x.t()


def _returns_a_view_of_an_intermediate(x):
    y = x + 1
    return y, y.view(-1)


# Each: the function, and per output whether eager returns the input itself / a view of it.
KEPT = {
    "an output that is the input": (_returns_its_input, [True], [False]),
    "an output that views the input": (_returns_a_view, [False, False], [False, True]),
}


@pytest.mark.parametrize("case", list(KEPT))
def test_aotautograds_wrapper_is_kept_where_it_has_work(case):
    fn, is_input, views_input = KEPT[case]
    torch.manual_seed(0)
    inputs = [torch.randn(3, 4)]
    seen, handed = _observed(fn, True, lambda: inputs, calls=1)
    assert handed and not any(isinstance(h, C.DirectCall) for h in handed)
    (step,) = seen
    eager_inputs = _fresh(lambda: inputs)
    want = fn(*eager_inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    for got, w in zip(step["outs"], want):
        assert got.shape == w.shape and got.stride() == w.stride() and torch.equal(got, w)
    for got, w in zip(step["inputs"], eager_inputs):
        assert got.shape == w.shape and torch.equal(got, w)
    assert step["is_input"] == is_input and step["views_input"] == views_input


def test_the_same_tensor_twice_is_one_input():
    # Dynamo passes a tensor given twice once (one placeholder), so AOTAutograd has nothing to dedupe per call and the
    # direct call is right; a graph whose inputs AOTAutograd rearranges keeps its wrapper (compat/aot.py).
    def f(a, b):
        a.mul_(2)
        return a + b

    compiled, handed = _compiled(f, True)
    x, ref = torch.ones(3), torch.ones(3)
    with torch.no_grad():
        for _ in range(3):
            out = compiled(x, x)
            want = f(ref, ref)
            assert torch.equal(out, want) and torch.equal(x, ref)


def test_autocast_at_compile_keeps_the_wrapper():
    fn = torch.nn.Linear(4, 4).eval()
    compiled, handed = _compiled(fn, True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    assert not any(isinstance(h, C.DirectCall) for h in handed)


def test_a_graph_that_needs_autograd_keeps_the_wrapper():
    fn = torch.nn.Linear(4, 4)
    compiled, handed = _compiled(fn, True)
    out = compiled(torch.randn(2, 4))
    out.sum().backward()
    assert fn.weight.grad is not None
    assert not any(isinstance(h, C.DirectCall) for h in handed)


def test_direct_call_false_keeps_aotautograds_wrapper_everywhere():
    compiled, handed = _compiled(torch.nn.Linear(4, 4).eval(), False)
    with torch.no_grad():
        compiled(torch.randn(2, 4))
    assert handed and not any(isinstance(h, C.DirectCall) for h in handed)


def test_a_keyword_call_goes_through_aotautograd():
    seen = []

    def aot(*args, **kwargs):
        seen.append((args, kwargs))
        return ["aot"]

    graph = lambda args: ["graph"]  # noqa: E731
    d = C.DirectCall(graph, aot, (), torch._C._increment_version)
    assert d(1) == ["aot"]  # the first call
    assert d(1) == ["graph"]
    assert d(1, k=2) == ["aot"] and seen[-1] == ((1,), {"k": 2})
    assert d(2) == ["graph"]


def test_the_graphs_result_is_the_list_the_wrapper_returns():
    for result, want in (([1, 2], [1, 2]), ((1, 2), [1, 2]), (7, [7])):
        d = C.DirectCall(lambda args, r=result: r, lambda *a: None, (), torch._C._increment_version)
        d()
        assert d() == want


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError):
        C.DirectCall(1, lambda: None, (), torch._C._increment_version)
    with pytest.raises(TypeError):
        C.DirectCall(lambda a: a, lambda: None, ("0",), torch._C._increment_version)
    d = C.DirectCall(lambda a: a, lambda *a: None, (3,), torch._C._increment_version)
    d()
    with pytest.raises(TypeError, match="more than"):
        d(torch.zeros(1))


def test_a_direct_call_and_its_graph_are_collected():
    fn = torch.nn.Linear(4, 4).eval()
    compiled, handed = _compiled(fn, True)
    with torch.no_grad():
        compiled(torch.randn(2, 4))
    ref = weakref.ref(handed[0].graph)
    del compiled, handed
    torch._dynamo.reset()
    gc.collect()
    assert ref() is None


def test_the_backend_hands_a_direct_call_through_torch_compile():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    x = torch.randn(2, 8)
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(compiled(x), model(x))
    assert graphex.Options.from_user(None).direct_call is True


def test_grad_enabled_inside_the_graph_keeps_autograd():
    # Found by a helper: under no_grad a function that re-enables grad gets AOTAutograd's training graph although
    # grad mode was off at compile time; a direct call ran its forward without autograd (no grad_fn from the 2nd call).
    def f(x, w):
        with torch.enable_grad():
            return x @ w

    compiled, handed = _compiled(f, True)
    x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
    for _ in range(3):
        with torch.no_grad():
            out = compiled(x, w)
        assert out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    assert w.grad is not None
    assert not any(isinstance(h, C.DirectCall) for h in handed)


def test_a_tensor_subclass_output_keeps_the_wrapper():
    # Found by a helper: plain inputs, a traceable subclass built and returned; AOTAutograd compiles the unwrapped
    # graph and wraps its outputs per call, which a direct call skipped (a plain tensor from the 2nd call).
    from torch.testing._internal.two_tensor import TwoTensor

    def f(a, b):
        return TwoTensor(a + 1, b * 5) * 3

    compiled, handed = _compiled(f, True)
    with torch.no_grad():
        for _ in range(3):
            out = compiled(torch.ones(3), torch.ones(3))
            assert type(out) is TwoTensor and torch.equal(out.a, torch.full((3,), 6.0))
            assert torch.equal(out.b, torch.full((3,), 15.0))
    assert not any(isinstance(h, C.DirectCall) for h in handed)
