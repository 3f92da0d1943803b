"""Note [A new output stays new] (graphex/passes/fresh_outputs.py): an output eager returns as new memory is new
memory from graphex too, whatever the passes removed or merged on the way; writing one output never changes an
input or another output. Each case is a program the fuzzer shrank once it took copies of values (sweeps/fuzz_gen.py
`snapshot`); each is compared with eager over three calls: values bitwise, and what each output is in memory
(sweeps/compare.aliasing). Where the output is a view in eager, it must stay one: no-op removal keeps the copies
that keep an output apart from an input (Note [A copy that keeps an output apart stays])."""

from __future__ import annotations

import pytest
import torch

import sweeps.fuzz_ops  # noqa: F401 - torch.ops.graphex_fuzz
from conftest import compile_graphex, newest_capture
from sweeps.compare import alias_difference, clone_tree, difference


def _copy_of_a_copy_of_an_input(a):
    return (a.contiguous().clone().detach().clone(),)


def _two_copies_of_one_value(a):
    v = torch.neg(a)
    return v.clone(), torch.clone(v)


def _copy_of_a_row_of_a_custom_op_result(a):
    v = torch.ops.graphex_fuzz.scale(a, 2)
    return (torch.clone(v.select(0, 0)),)


def _copy_of_an_input_after_it_is_written(a, b):
    a.copy_(b)
    b.zero_()
    return (a.detach().clone(),)


def _copy_of_an_input_written_through_a_split(a):
    part = a.split(1, 0)[1]
    part.index_put_((torch.tensor([0]),), (part[:1] * 2).clone(), accumulate=True)
    return (a.clone(),)


def _copy_written_by_a_custom_op(a):
    v = a.clone()
    torch.ops.graphex_fuzz.add_one_(v)
    return (v,)


def _copy_of_a_reshape(a):
    v = torch.add(a, -1).reshape(-1)
    return (v.contiguous().clone(), v.unsqueeze(0).clone())


def _view_of_a_copy_of_a_copy(a):
    return (a.clone().detach().clone().reshape(-1),)  # eager: a view of the second copy


def _item_of_a_split_of_a_copy_of_a_row(a):
    v = torch.sqrt(a.abs())
    v.copy_(a)
    return (v.select(0, 2).contiguous().clone().split(1, 0)[1],)


def _empty_slice_of_a_copy_written_in_place(a):
    v = a[:1].contiguous().clone()
    return v[1:], v.index_put((torch.tensor([0]),), v[:1] * 2)  # the slice is empty: eager's is still a view


CASES = [_empty_slice_of_a_copy_written_in_place, _view_of_a_copy_of_a_copy, _item_of_a_split_of_a_copy_of_a_row,
         _copy_of_a_copy_of_an_input, _two_copies_of_one_value, _copy_of_a_row_of_a_custom_op_result,
         _copy_of_an_input_after_it_is_written, _copy_of_an_input_written_through_a_split,
         _copy_written_by_a_custom_op, _copy_of_a_reshape]


def _inputs(fn):
    torch.manual_seed(0)
    n = fn.__code__.co_argcount
    return [torch.randn(4, 3) for _ in range(n)]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__.strip("_"))
def test_an_output_eager_returns_as_new_memory_is_new_memory(fn):
    compiled = compile_graphex(fn)
    base = _inputs(fn)
    with torch.no_grad():
        for call in range(3):
            mine, theirs = clone_tree(base), clone_tree(base)
            got, want = compiled(*mine), fn(*theirs)
            where = f"{fn.__name__}, call {call}"
            assert difference(got, want) is None, where
            assert difference(mine, theirs) is None, where
            assert alias_difference((got, mine), (want, theirs)) is None, f"{where}: " + str(
                alias_difference((got, mine), (want, theirs)))


def test_aliased_outputs_stay_views_and_a_plain_step_gets_no_copy():
    """The check copies only outputs AOTAutograd calls new memory and only where a pass made them share: an output
    that is a view of an input stays that view, and a graph whose passes left its outputs alone gets no copy."""
    def fn(x):
        h = x * 2
        return x.view(-1), h, h.sum()

    compiled = compile_graphex(fn)
    x = torch.randn(3, 4)
    with torch.no_grad():
        flat, h, _ = compiled(x)
    assert flat._base is x and torch.equal(h, x * 2)
    ops = [target for _, target in newest_capture().executor.node_names()]
    assert "aten::clone.default" not in ops and "aten::copy_.default" not in ops, ops
