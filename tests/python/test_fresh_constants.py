"""Note [A constant only read is not copied]: `lift_fresh_copy(constant)` runs only where its copy could be written
or handed out; each case is called twice, its results written between calls, and compared with eager."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same, compile_graphex, newest_capture

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)

LIFT = "aten::lift_fresh_copy.default"


def _targets() -> list[str]:
    return [t for _, t in newest_capture().executor.node_names()]


def _twice(f, *args, write_results: bool = True):
    """Compiled and eager, called twice on other inputs; every tensor result is overwritten after the first call, so
    a result that is the constant itself (or a view of it), or a write into the constant, would change what the
    second call returns."""
    compiled = compile_graphex(f)
    with torch.no_grad():
        for call in range(2):
            args = tuple(a * 2 + 1 for a in args) if call else args
            got, want = compiled(*args), f(*args)
            assert_same(got, want)
            if write_results:
                for r in (got if isinstance(got, tuple) else (got,)):
                    r.fill_(-7)
    return _targets()


def test_a_constant_used_as_an_index_is_read_without_a_copy():
    def f(x):
        return x[:, torch.tensor([0, 2])] * 2  # Falcon's key/value columns

    assert LIFT not in _twice(f, torch.randn(3, 4))


def test_a_constant_read_by_arithmetic_is_read_without_a_copy():
    def f(x):
        return x * torch.tensor([1.5, -0.0, 2.0]) + torch.tensor(3.0)

    assert LIFT not in _twice(f, torch.randn(2, 3))


def test_a_constant_returned_is_still_copied():
    def f(x):
        return x + 1, torch.tensor([1.0, 2.0])

    assert LIFT in _twice(f, torch.randn(2))


def test_a_view_of_a_constant_returned_is_still_copied():
    def f(x):
        t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        return x + t[0], t[1]

    assert LIFT in _twice(f, torch.randn(2))


def test_a_constant_written_in_place_is_still_copied():
    def f(x):
        t = torch.tensor([1.0, 2.0, 3.0])
        t.add_(x)
        t.mul_(2)
        return t.sum(0, keepdim=True)

    _twice(f, torch.randn(3))


def test_a_constant_written_through_a_view_is_still_copied():
    def f(x):
        t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        t[0].copy_(x)
        return t * 1

    _twice(f, torch.randn(2))


def test_a_constant_read_then_written_through_a_view_is_still_copied():
    def f(x):
        t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        before = t.sum()  # the constant's own values, on every call
        t[0].copy_(x)
        return before + t.sum()

    assert LIFT in _twice(f, torch.randn(2))


def test_a_constant_read_then_written_keeps_what_was_read():
    def f(x):
        t = torch.tensor([5.0, 6.0])
        y = x * t  # read first
        t.zero_()
        return y + t

    _twice(f, torch.randn(2))


def test_a_constant_of_each_dtype_is_read_bitwise():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool):
        def f(x, dtype=dtype):
            c = torch.tensor([1, 0, 1], dtype=dtype)
            return x * c.to(x.dtype) if dtype is not torch.bool else torch.where(c, x, -x)

        assert LIFT not in _twice(f, torch.randn(3))


def test_a_constant_given_to_a_custom_op_is_still_copied():
    """A custom op's schema is its author's: one that writes an argument it declares read-only would write the constant
    for every later call, so the copy stays (eager writes the copy too, and each call starts from the constant)."""
    lib = torch.library.Library("graphex_test_fresh", "FRAGMENT")  # noqa: TOR901
    lib.define("scale_in_place_undeclared(Tensor x) -> Tensor")
    lib.impl("scale_in_place_undeclared", lambda x: x.mul_(2).clone(), "CPU")
    lib.impl("scale_in_place_undeclared", lambda x: torch.empty_like(x), "Meta")

    def f(x):
        return torch.ops.graphex_test_fresh.scale_in_place_undeclared(torch.tensor([1.0, 2.0])) + x

    assert LIFT in _twice(f, torch.randn(2))
