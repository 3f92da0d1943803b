"""Note [A scatter is not reinplaced onto its own source]: `x[1:] = x[:-1].clone()` and its spellings.

No-op removal drops the clone; reinplaced, the scatter would copy memory onto itself. graphex raised
ATen's "some elements of the input tensor and the written-to tensor refer to a single memory location"
where eager runs (torch 2.11-2.14; 2.15's inductor check, which graphex's table replaces, is now ours).
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same, compile_graphex, newest_capture

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)


def _shift_rows_of_an_intermediate(x):
    y = x * 1.0
    y[1:] = y[:-1].clone()
    return y


def _shift_by_two(x):
    y = x + 1
    y[2:] = y[:-2].clone()
    return y


def _shift_through_narrow_and_copy(x):
    y = x - 1
    y.narrow(0, 1, 5).copy_(y.narrow(0, 0, 5).clone())
    return y


def _shift_a_graph_input(x):
    x[1:] = x[:-1].clone()
    return x.sum()


def _shift_then_read_the_old_rows(x):
    y = x * 3
    old = y[:-1].clone()
    y[1:] = old
    return y, old + 0


@pytest.mark.parametrize("fn", [_shift_rows_of_an_intermediate, _shift_by_two, _shift_through_narrow_and_copy,
                                _shift_a_graph_input, _shift_then_read_the_old_rows])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_a_shift_within_one_tensor_matches_eager(fn, dtype):
    torch._dynamo.reset()
    compiled = compile_graphex(fn)
    for _ in range(2):
        x = torch.arange(24).reshape(6, 4).to(dtype)
        ours, theirs = x.clone(), x.clone()
        with torch.no_grad():
            assert_same(compiled(ours), fn(theirs))
        assert_same(ours, theirs)


def test_a_scatter_from_another_tensor_is_still_in_place():
    """The check declines only a source on the scatter's own memory: `y[1:] = x[:-1]` still writes `y` with no copy."""
    def f(x, y):
        y[1:] = x[:-1]
        return y.sum()

    torch._dynamo.reset()
    compiled = compile_graphex(f)
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    ref = y.clone()
    with torch.no_grad():
        assert_same(compiled(x, y), f(x, ref))
    assert_same(y, ref)
    graph = newest_capture()  # this test's (the newest)
    assert graph.kept_copies == []
