"""Note [In-place means in place] for chains of in-place updates of an input: `cache.mul_(a).add_(x)`.

Functionalization makes `add(mul(cache, a), x)` plus a copy back; the copy-back pass folds the whole chain
(mul_ then add_ on the caller's tensor) when no other argument and no later node reads the old value.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same, captures, compile_graphex

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def _run(f, force_eager: bool):
    """Two calls compiled and eager; the one graph this compile made (another file's graphs may still be alive in the
    same xdist worker)."""
    torch._dynamo.reset()
    before = {id(g) for g in captures()}
    compiled = compile_graphex(f, force_eager=force_eager)
    cache, x = torch.randn(4, 5), torch.randn(4, 5)
    ref = cache.clone()
    ptr = cache.data_ptr()
    for _ in range(2):
        assert_same(compiled(cache, x), f(ref, x))
        assert_same(cache, ref)
    assert cache.data_ptr() == ptr
    (graph,) = [g for g in captures() if id(g) not in before]
    return graph


@pytest.mark.parametrize("force_eager", [False, True], ids=["engine", "fx"])
def test_a_chain_of_in_place_updates_writes_the_input_with_no_copy(force_eager):
    graph = _run(lambda c, x: (c.mul_(0.5).add_(x).sub_(1.0), c.sum())[1], force_eager)
    assert graph.kept_copies == []
    targets = [n.target for n in graph.gm.graph.nodes if n.op == "call_function"]
    assert aten.copy_.default not in targets
    assert {aten.mul_.Tensor, aten.add_.Tensor, aten.sub_.Tensor} <= set(targets)


@pytest.mark.parametrize("force_eager", [False, True], ids=["engine", "fx"])
def test_a_chain_that_reads_the_old_value_through_another_argument_keeps_its_copy(force_eager):
    graph = _run(lambda c, x: (c.copy_(c * 0.5 + c), c.sum())[1], force_eager)
    (kept,) = graph.kept_copies
    assert kept.cause == "unproven"


@pytest.mark.parametrize("force_eager", [False, True], ids=["engine", "fx"])
def test_an_intermediate_of_the_chain_read_elsewhere_is_not_overwritten(force_eager):
    def f(c, x):
        m = c * 0.5
        c.copy_(m + x)
        return m.sum() + c.sum()

    graph = _run(f, force_eager)
    assert len(graph.kept_copies) == 1
