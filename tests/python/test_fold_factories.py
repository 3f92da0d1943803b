"""Note [Folding what reads no input] (graphex/lowering/fold.py): a chain from factory calls that reads no input is
computed once when the program is lowered, in every mode, and stays eager's value on every call; what could change
between calls, or be written by the graph or the caller, is never folded."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_same, compile_graphex, newest_capture

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)


def _targets() -> list[str]:
    return [t for _, t in newest_capture().executor.node_names()]


def _run(fn, *args, calls: int = 3, write_results: bool = True, **options):
    """Compiled and eager on fresh inputs each call; every tensor result is written after each call, so a result
    that is a kept value (or a view of one) would change what the next call returns."""
    compiled = compile_graphex(fn, **options)
    with torch.no_grad():
        for call in range(calls):
            inputs = tuple(a * (call + 1) for a in args)
            got, want = compiled(*inputs), fn(*inputs)
            assert_same(got, want)
            if write_results:
                for t in (got if isinstance(got, tuple) else (got,)):
                    t.fill_(7) if t.dtype != torch.bool else t.fill_(True)
    return _targets()


def _alibi(x):
    """Bloom's slopes: closest power of two below the head count, then `base ** arange`."""
    heads = 4
    closest = 2 ** math.floor(math.log2(heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    powers = torch.arange(1, 1 + closest, dtype=torch.int32)
    slopes = torch.pow(base, powers)
    positions = torch.arange(16)
    bias = slopes[:, None, None] * positions[None, None, :]
    return x + bias


def _causal(x):
    n = x.shape[-1]
    rows, cols = torch.arange(n), torch.arange(n)
    mask = cols[None, :] <= rows[:, None]
    return torch.where(mask, x, torch.full((), -math.inf))


@pytest.mark.parametrize("frozen", [False, True])
def test_a_chain_from_factories_is_computed_once_and_stays_eagers(frozen):
    targets = _run(_alibi, torch.randn(4, 1, 16), frozen_parameter=frozen)
    assert not {"aten::pow.Tensor_Tensor", "aten::arange.start", "aten::arange.default"} & set(targets), targets
    targets = _run(_causal, torch.randn(8, 8), frozen_parameter=frozen)
    assert "aten::arange.default" not in targets and "aten::le.Tensor" not in targets, targets


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.bool, torch.bfloat16])
def test_other_dtypes_fold_to_eagers_values(dtype):
    def fn(x):
        table = (torch.arange(12).reshape(3, 4) % 3).to(dtype)
        return x + table.to(x.dtype), table.sum(-1)

    targets = _run(fn, torch.randn(3, 4, dtype=torch.float64))
    assert "aten::remainder.Scalar" not in targets, targets


def test_a_factory_returned_or_viewed_by_an_output_is_new_on_every_call():
    def fn(x):
        a = torch.arange(6, dtype=torch.float32)
        return a.view(2, 3), torch.ones(3).t(), torch.zeros(2, 2)[0], x + a.sum()

    targets = _run(fn, torch.randn(3))
    assert targets.count("aten::arange.start_step") + targets.count("aten::arange.default") + \
        targets.count("aten::arange.start") == 1, targets


def test_a_factory_the_graph_writes_is_made_on_every_call():
    def fn(x):
        acc = torch.zeros(4)
        acc.add_(1)  # functional: ones, made from the kept zeros on every call ...
        acc[1:3] += x[:2]  # ... because the graph writes it here, in place
        return x * acc

    targets = _run(fn, torch.randn(4))
    assert "aten::zeros.default" not in targets and "aten::add.Tensor" in targets, targets

    def fn(x):
        acc = torch.arange(4.0)
        acc.mul_(x.sum())  # functionalized: a new value from the kept arange on every call
        acc[0] = 5.0  # ... written here, in place
        return acc + 1

    targets = _run(fn, torch.randn(4))
    assert not any(t.startswith("aten::arange") for t in targets) and "aten::mul.Tensor" in targets, targets


def test_a_factory_given_to_a_custom_op_is_made_on_every_call():
    """A custom op that writes an argument its schema calls read-only would write a kept value: eager's op writes a
    new tensor each call, so the value is made on every call (through a view too)."""
    lib = torch.library.Library("graphex_test_fold", "FRAGMENT")  # noqa: TOR901
    lib.define("scale_in_place_undeclared(Tensor x) -> Tensor")
    lib.impl("scale_in_place_undeclared", lambda x: x.mul_(2).clone(), "CPU")
    lib.impl("scale_in_place_undeclared", lambda x: torch.empty_like(x), "Meta")

    def fn(x):
        made = torch.arange(8.0) + 1
        return torch.ops.graphex_test_fold.scale_in_place_undeclared(made.view(2, 4)[0]) + x

    for frozen in (False, True):
        targets = _run(fn, torch.randn(4), frozen_parameter=frozen)
        assert "aten::add.Tensor" in targets, targets


def test_random_and_uninitialized_factories_are_never_folded():
    def fn(x):
        noise = torch.rand(4)  # seeded by the generator: a new value each call
        return x + noise * 0, torch.empty(4).fill_(2.0) + x

    compiled = compile_graphex(fn)
    with torch.no_grad():
        for _ in range(2):
            torch.manual_seed(0)
            got = compiled(torch.ones(4))
            torch.manual_seed(0)
            want = fn(torch.ones(4))
            assert_same(got, want)
    targets = _targets()
    assert "aten::rand.default" in targets or any("rand" in t for t in targets), targets


def test_a_large_factory_value_is_not_kept_between_calls():
    """FOLD_FACTORY_LIMIT: a 256 KiB causal mask (512 x 512 booleans) is made on every call, as eager makes it; a small
    one is kept."""
    targets = _run(_causal, torch.randn(512, 512))
    assert "aten::le.Tensor" in targets, targets
    targets = _run(_causal, torch.randn(64, 64))
    assert "aten::le.Tensor" not in targets, targets


def test_dynamic_shapes_fold_only_what_has_a_static_shape():
    def fn(x):
        return x + torch.arange(x.shape[0]) * torch.ones(()).exp()

    compiled = compile_graphex(fn, dynamic=True)
    with torch.no_grad():
        for n in (5, 9, 13):
            x = torch.randn(n)
            assert_same(compiled(x), fn(x))
    targets = _targets()
    assert any(t.startswith("aten::arange") for t in targets), targets
