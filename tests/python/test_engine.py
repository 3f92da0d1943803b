"""The replay engine: what a captured graph can take, compute and return, checked against eager."""

from __future__ import annotations

import collections
import itertools
import os
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from conftest import assert_same, compile_graphex, engine_runs, newest_capture

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)


def run_both(fn, *args, **options):
    """(eager result, graphex result) of fn on fresh clones of args, plus the graphex args after the call."""
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    graph_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    expected = fn(*eager_args)
    compiled = compile_graphex(fn, **options)
    before = engine_runs()
    actual = compiled(*graph_args)
    assert engine_runs() == before + 1, "the C++ engine did not run"
    return expected, actual, eager_args, graph_args


def copies_of(prof, shape) -> list[str]:
    """Operators the replay itself called (not ones inside other kernels) that clone or copy a tensor of `shape`."""
    shape = list(shape)
    return [f"{e.name}{e.input_shapes}" for e in prof.events()
            if e.name in ("aten::clone", "aten::copy_", "aten::_to_copy") and shape in (e.input_shapes or [])
            and e.cpu_parent is not None and e.cpu_parent.name.startswith("graph_")]


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def test_the_kernel_path_is_the_one_asked_for():
    """make test-default-isa sets ATEN_CPU_CAPABILITY=default: the tests marked default_isa then run on it."""
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    if asked:
        assert torch.backends.cpu.get_cpu_capability() == asked.upper()


def test_multiple_outputs_and_an_int():
    def f(x, y):
        return x + y, x * y, (x - y).sum(), 7

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    expected, actual, *_ = run_both(f, x, y)
    assert_same(actual, expected)


def test_outputs_that_alias_inputs_are_views_of_them():
    def f(x):
        return x.view(-1), x.t(), x[1:], x + 1

    x = torch.randn(4, 5)
    compiled = compile_graphex(f)
    flat, t, tail, fresh = compiled(x)
    assert_same([flat, t, tail, fresh], list(f(x)))
    assert flat.data_ptr() == x.data_ptr() and t.data_ptr() == x.data_ptr()
    assert tail.data_ptr() == x[1:].data_ptr()
    x.add_(1)  # a view sees later writes to its base, as in eager
    assert torch.equal(flat, x.view(-1))


def test_int_inputs_and_scalars():
    def f(x, n: int, scale: float):
        return x * scale + n, x.sum() * 0.5

    x = torch.randn(6)
    expected, actual, *_ = run_both(f, x, 3, 2.5)
    assert_same(actual, expected)


def test_tensor_lists_cat_split_unbind_and_none():
    def f(x, y):
        a, b, c = torch.split(x, [1, 2, 3], dim=0)
        parts = torch.unbind(y, dim=1)
        joined = torch.cat([c, a, b], dim=0)
        stacked = torch.stack(parts[::-1], dim=0)
        return joined, stacked, None

    expected, actual, *_ = run_both(f, torch.randn(6, 2), torch.randn(3, 4))
    assert_same(actual, expected)


def test_index_put_with_optional_tensor_list():
    def f(x, rows, cols, v):
        return x.index_put((rows, None), v) if False else x.index_put((rows, cols), v, accumulate=True)

    x = torch.randn(5, 4)
    expected, actual, *_ = run_both(f, x, torch.tensor([0, 2, 2]), torch.tensor([1, 3, 3]), torch.ones(3))
    assert_same(actual, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_dtypes(dtype):
    def f(x, y):
        if dtype == torch.bool:
            return x & y, x | ~y, (x ^ y).sum()
        if dtype == torch.int64:
            return x * y + 3, torch.div(x, 2, rounding_mode="floor"), x.max()
        return (x * y + 1.5).relu(), x.to(torch.float32).softmax(-1).to(dtype), x.sum(-1)

    if dtype == torch.bool:
        x, y = torch.rand(4, 8) > 0.5, torch.rand(4, 8) > 0.5
    elif dtype == torch.int64:
        x, y = torch.randint(-50, 50, (4, 8)), torch.randint(-50, 50, (4, 8))
    else:
        x, y = torch.randn(4, 8).to(dtype), torch.randn(4, 8).to(dtype)
    expected, actual, *_ = run_both(f, x, y)
    assert_same(actual, expected)


def test_in_place_update_of_an_input_writes_the_callers_tensor_with_no_copy():
    def f(cache, pos, new):
        cache.index_copy_(0, pos, new)
        cache[pos + 4] = new * 2  # slice assignment of the same cache
        return cache.sum(0)

    cache = torch.zeros(8, 3)
    ptr = cache.data_ptr()
    pos, new = torch.tensor([1]), torch.randn(1, 3)
    expected_cache = cache.clone()
    expected = f(expected_cache, pos, new)
    compiled = compile_graphex(f)
    compiled(cache.clone(), pos, new)  # capture
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = compiled(cache, pos, new)
    assert_same(out, expected)
    assert_same(cache, expected_cache, "cache")
    assert cache.data_ptr() == ptr
    assert copies_of(prof, cache.shape) == [], "the replay copied or cloned the cache"
    names = [e.name for e in prof.events()]
    assert "aten::index_copy_" in names and "aten::index_put_" in names


def test_in_place_update_of_a_view_of_an_input():
    def f(cache, pos, k):
        for layer in range(2):
            cache[layer].index_copy_(1, pos, k * (layer + 1))
        return cache[:, :, :2].clone()

    cache = torch.zeros(2, 3, 6)
    pos, k = torch.tensor([2]), torch.randn(3, 1)
    expected_cache = cache.clone()
    expected = f(expected_cache, pos, k)
    compiled = compile_graphex(f)
    compiled(cache.clone(), pos, k)  # capture
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = compiled(cache, pos, k)
    assert_same(out, expected)
    assert_same(cache, expected_cache, "cache")
    assert copies_of(prof, cache[0].shape) == [], "the replay copied a layer of the cache"
    replay = [e.name for e in prof.events() if e.cpu_parent is not None and e.cpu_parent.name.startswith("graph_")]
    assert "aten::index_copy_" in replay
    assert "aten::index_copy" not in replay, "functional index_copy left in the graph (a full copy)"


def test_without_input_inplace_pass_the_update_is_a_copy_and_the_log_says_why(monkeypatch, capfd):
    monkeypatch.setenv("GRAPHEX_LOG", "1")

    def f(cache, pos, new):
        cache.index_copy_(0, pos, new)
        return cache.sum()

    cache = torch.zeros(6, 2)
    expected, actual, eager_args, graph_args = run_both(f, cache, torch.tensor([2]), torch.ones(1, 2),
                                                        input_inplace_pass=False)
    assert_same(actual, expected)
    assert_same(graph_args[0], eager_args[0], "cache")  # still correct, just not in place
    err = capfd.readouterr().err
    assert "kept a copy of graph input" in err and "input_inplace_pass=False" in err, err


def test_default_passes_keep_no_copy(monkeypatch, capfd):
    monkeypatch.setenv("GRAPHEX_LOG", "1")

    def f(cache, pos, new):
        cache.index_copy_(0, pos, new)
        cache[pos + 1] = new
        return cache.sum()

    run_both(f, torch.zeros(6, 2), torch.tensor([2]), torch.ones(1, 2))
    assert "kept a copy" not in capfd.readouterr().err


def test_outputs_are_never_overwritten_by_a_later_call():
    def f(x, w):
        h = x @ w
        return h.relu(), h.sum(), h

    combos = itertools.product([False, True], [False, True], [False, True])
    for clone_output, frozen_parameter, force_eager in combos:
        torch._dynamo.reset()
        compiled = compile_graphex(f, clone_output=clone_output, frozen_parameter=frozen_parameter,
                                   force_eager=force_eager)
        w = torch.randn(4, 4)
        x1, x2 = torch.randn(2, 4), torch.randn(2, 4)
        first = compiled(x1, w)
        kept = [t.clone() for t in first]
        second = compiled(x2, w)
        for a, b in zip(first, kept):
            assert torch.equal(a, b), f"output overwritten with options {clone_output, frozen_parameter, force_eager}"
        assert_same(list(second), list(f(x2, w)))


def test_no_python_runs_per_op(tmp_path):
    """Python calls made during one replay do not grow with the number of ops in the graph."""
    import importlib.util

    def make(n):
        # A distinct code object per length: Dynamo caches per code object, and a shared one
        # would add a guard check per extra cache entry. In a real file: torch <= 2.12 wraps a function
        # without a source file in one shared frame (external_utils.wrap_inline), which shares the cache.
        path = tmp_path / f"chain_{n}.py"
        path.write_text(f"def chain_{n}(x):\n    for i in range({n}):\n        x = x * 1.5 if i % 2 else x + 1.0\n"
                        "    return x\n")
        spec = importlib.util.spec_from_file_location(f"chain_{n}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, f"chain_{n}")

    def python_calls(fn, x):
        calls = collections.Counter()

        def tracer(frame, event, arg):
            if event == "call":
                calls[f"{frame.f_code.co_filename}:{frame.f_code.co_name}"] += 1

        sys.setprofile(tracer)
        try:
            fn(x)
        finally:
            sys.setprofile(None)
        return calls

    x = torch.randn(16)
    small, large = compile_graphex(make(10)), compile_graphex(make(300))
    small(x), large(x), small(x), large(x)
    calls_large, calls_small = python_calls(large, x), python_calls(small, x)
    strip = lambda c: collections.Counter({k.replace("chain_300", "chain").replace("chain_10", "chain"): v  # noqa: E731
                                           for k, v in c.items()})
    assert strip(calls_large) == strip(calls_small)  # the same Python functions, the same number of times
    assert newest_capture().num_ops == 300


def test_intermediates_are_freed_after_their_last_use():
    """Peak memory of a long chain of large temporaries stays at a few tensors, as in eager."""

    def f(x):
        for _ in range(20):
            x = x * 1.01 + 1.0
        return x

    x = torch.randn(1 << 20)  # 4 MiB per temporary
    compiled = compile_graphex(f)
    compiled(x)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        compiled(x)
    live = peak = 0
    for e in sorted((e for e in prof.events() if e.name == "[memory]"), key=lambda e: e.time_range.start):
        live += e.cpu_memory_usage
        peak = max(peak, live)
    assert peak <= 3 * x.numel() * 4, f"peak {peak / 2**20:.1f} MiB for 4 MiB temporaries"


def test_inference_mode_runs_the_engine():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    x = torch.randn(2, 8)
    with torch.inference_mode():
        expected = model(x)
        compiled = compile_graphex(model)
        before = engine_runs()
        assert_same(compiled(x), expected)
        assert engine_runs() == before + 1


EDGE_CASES = {
    "identity": (lambda x: x, lambda: [torch.randn(3)]),
    "zero-size": (lambda x: x * 2 + 1, lambda: [torch.randn(0, 4)]),
    "0-dim": (lambda x: x.exp() + 1, lambda: [torch.tensor(2.0)]),
    "non-contiguous input": (lambda x: x.t().contiguous() * 2, lambda: [torch.randn(4, 3)[:, ::2]]),
    "complex64": (lambda x: (x * x).abs(), lambda: [torch.randn(4, dtype=torch.complex64)]),
    "uint8": (lambda x: x + 3, lambda: [torch.randint(0, 200, (5,), dtype=torch.uint8)]),
    "random numbers (same seed, same draws)": (lambda x: x + torch.rand(3), lambda: [torch.randn(3)]),
    "dropout in training mode": (lambda x: torch.nn.functional.dropout(x, 0.5, training=True),
                                 lambda: [torch.randn(8)]),
    "scaled_dot_product_attention": (
        lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True),
        lambda: [torch.randn(1, 2, 4, 8)]),
    ".item() used as a scalar": (lambda x: x * x.sum().item(), lambda: [torch.randn(5)]),
    "data-dependent shape (boolean mask)": (lambda x: x[x > 0].sum(), lambda: [torch.randn(6)]),
    "topk: several outputs": (lambda x: torch.topk(x, 2), lambda: [torch.randn(6)]),
    "interpolate": (lambda x: torch.nn.functional.interpolate(x, scale_factor=2.0), lambda: [torch.randn(1, 1, 4, 4)]),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), lambda: [torch.randn(2, 3), torch.randn(3, 4)]),
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_cases_match_eager(name):
    fn, make_inputs = EDGE_CASES[name]
    inputs = make_inputs()
    torch.manual_seed(0)
    expected = fn(*inputs)
    compiled = compile_graphex(fn)
    torch.manual_seed(0)
    assert_same(compiled(*inputs), expected)


def test_update_whose_old_value_is_read_later_keeps_a_copy_and_names_the_reader(monkeypatch, capfd):
    """x.copy_(x.index_put(...)) with a read of the old x in between: the write-back must stay a copy."""
    monkeypatch.setenv("GRAPHEX_LOG", "1")

    def f(x, idx, v):
        updated = x.index_put((idx,), v)
        old_doubled = x * 2  # reads x before it is overwritten
        x.copy_(updated)
        return old_doubled

    x = torch.randn(6)
    expected, actual, eager_args, graph_args = run_both(f, x, torch.tensor([1, 4]), torch.ones(2))
    assert_same(actual, expected)
    assert_same(graph_args[0], eager_args[0], "x")
    err = capfd.readouterr().err
    assert "kept a copy of graph input x" in err, err
    assert "node 'mul' (aten::mul.Tensor) reads its old value later" in err and "old_doubled = x * 2" in err, err
