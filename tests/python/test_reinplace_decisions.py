"""Note [Reinplacing decides and records in one place]: each write the pass makes in place is counted on the
compiled graph (CompiledGraph.in_place), each copy it keeps carries the reason it was decided with, and the
options decline at the decision, not by hiding nodes from it. Every case is also checked against eager."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same, captures, compile_graphex

aten = torch.ops.aten


@torch.library.custom_op("gx_rp::bump_", mutates_args=("x",))
def bump_(x: torch.Tensor, by: float) -> None:
    x.add_(by)


def _compile_and_check(fn, make_args, **options):
    """Run `fn` compiled twice against eager (outputs and every argument after the call); the one graph it made."""
    torch._dynamo.reset()
    before = {id(g) for g in captures()}
    compiled = compile_graphex(fn, **options)
    for _ in range(2):
        ours, theirs = make_args(), make_args()
        with torch.no_grad():
            assert_same(compiled(*ours), fn(*theirs))
        for a, b in zip(ours, theirs):
            assert_same(a, b)
    (graph,) = [g for g in captures() if id(g) not in before]
    return graph


def _cache_args():
    return torch.zeros(6, 4), torch.tensor([2]), torch.full((1, 4), 3.0)


def _index_put_into_the_cache(cache, pos, v):
    cache.index_put_((pos,), v)
    return cache.sum()


def _index_copy_into_the_cache(cache, pos, v):
    cache.index_copy_(0, pos, v)
    return cache.sum()


def _custom_op_on_the_cache(cache, pos, v):
    bump_(cache, 0.5)
    return cache.sum()


@pytest.mark.parametrize("fn, op", [(_index_put_into_the_cache, "aten::index_put_"),
                                    (_index_copy_into_the_cache, "aten::index_copy_"),
                                    (_custom_op_on_the_cache, "gx_rp::bump_")],
                         ids=["table-op", "copy-back-fold", "auto-functionalized"])
def test_each_write_made_in_place_is_counted_by_its_op(fn, op):
    graph = _compile_and_check(fn, _cache_args)
    assert graph.in_place == {op: 1}
    assert graph.kept_copies == []
    targets = [n.target for n in graph.gm.graph.nodes if n.op == "call_function"]
    assert aten.copy_.default not in targets and aten.clone.default not in targets


@pytest.mark.parametrize("fn", [_index_put_into_the_cache, _custom_op_on_the_cache], ids=["table-op",
                                                                                          "auto-functionalized"])
def test_input_inplace_pass_off_declines_at_the_decision_and_says_so(fn):
    graph = _compile_and_check(fn, _cache_args, input_inplace_pass=False)
    assert graph.in_place == {}
    assert graph.kept_copies, "a copy of the cache must be kept"
    assert {k.cause for k in graph.kept_copies} == {"option"}
    assert {k.option for k in graph.kept_copies} == {"input_inplace_pass"}


def _index_put_into_an_intermediate(x, pos, v):
    y = x * 2
    y.index_put_((pos,), v)
    return y + 1


def test_inplace_pass_off_keeps_an_intermediate_functional_and_equal():
    on = _compile_and_check(_index_put_into_an_intermediate, _cache_args)
    assert on.in_place == {"aten::index_put_": 1}
    off = _compile_and_check(_index_put_into_an_intermediate, _cache_args, inplace_pass=False)
    assert off.in_place == {}
    targets = [n.target for n in off.gm.graph.nodes if n.op == "call_function"]
    assert aten.index_put.default in targets and aten.index_put_.default not in targets


def _expanded_then_written(x, pos, v):
    y = x[:1].expand(6, 4)  # every row is the same memory
    return y.index_put((pos,), v) + 0  # functional: a fresh tensor whose rows are distinct


def test_a_write_into_an_expanded_view_is_declined_and_matches_eager():
    """Note [Never reinplace into overlapping memory], decided in the reinplacer (it was an extra check)."""
    graph = _compile_and_check(_expanded_then_written, _cache_args)
    assert "aten::index_put_" not in graph.in_place


def _update_whose_old_value_is_read_before_the_copy_back(x, pos, v):
    updated = x.index_put((pos,), v)
    old_doubled = x * 2  # reads x before it is overwritten
    x.copy_(updated)
    return old_doubled


def test_a_kept_copy_names_the_reader_the_decision_found():
    graph = _compile_and_check(_update_whose_old_value_is_read_before_the_copy_back, _cache_args)
    assert "aten::index_put_" not in graph.in_place  # (the user's own x.copy_ is counted: aten::copy_)
    (kept,) = graph.kept_copies
    assert (kept.cause, kept.reader) == ("read-later", "mul"), kept
    assert "old_doubled = x * 2" in kept.where


def _update_returned_then_the_input_written_with_another_value(x):
    updated = x.index_put((torch.tensor([1, 0]),), x[:2] * 2)  # x has two rows: CSE makes x[:2] * 2 the x * 2 below
    x.mul_(2)  # the input's copy-back is of x * 2: in place, `updated` would be overwritten before it is returned
    return updated


def _update_returned_as_a_view_then_the_input_written_with_another_value(x):
    updated = x.index_put((torch.tensor([1, 0]),), x[:2] * 2)
    x.mul_(2)
    return updated.t()


def _update_read_before_the_input_is_written_with_another_value(x):
    total = x.index_put((torch.tensor([1, 0]),), x[:2] * 2).sum(0)  # read before the copy-back: in place is right
    x.mul_(2)
    return total


@pytest.mark.parametrize("fn, in_place", [(_update_returned_then_the_input_written_with_another_value, False),
                                          (_update_returned_as_a_view_then_the_input_written_with_another_value, False),
                                          (_update_read_before_the_input_is_written_with_another_value, True)],
                         ids=["returned", "returned-as-a-view", "read-before"])
def test_a_result_written_into_an_input_is_read_before_the_inputs_copy_back(fn, in_place):
    """Note [A result written into an input is read before the input's copy-back]: the fuzzer's seed 3496 returned
    the input's new value (x * 2) for the index_put's result."""
    graph = _compile_and_check(fn, lambda: (torch.arange(8.0).view(2, 4),))
    assert ("aten::index_put_" in graph.in_place) == in_place, graph.in_place


def _bump_a_clone_of_an_input_and_read_the_input(x, pos, v):
    y = x.clone()
    bump_(y, 2.0)
    return y.sum() + x.sum()


def test_a_custom_op_on_a_clone_of_an_input_keeps_one_clone_and_says_why():
    """No-op removal drops the user's clone; the op's base is then the caller's tensor, which the graph must leave
    unchanged: one clone, the user's, made where the op runs, and the reason recorded with the decision."""
    graph = _compile_and_check(_bump_a_clone_of_an_input_and_read_the_input, _cache_args)
    assert graph.in_place == {}
    (kept,) = graph.kept_copies
    assert kept.cause == "not-declared" and kept.node == "auto_functionalized_v2", kept
    targets = [n.target for n in graph.gm.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.clone.default) == 1 and aten.copy_.default not in targets


class _ForeachInForward(torch.nn.Module):
    """An in-place foreach op on parameters inside forward, then a read of them (a helper's find: the program failed to
    build, `getitem takes a slot and a constant index`, where eager runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._foreach_mul_([self.a.weight, self.b.weight], 0.5)
        torch._foreach_add_([self.a.bias, self.b.bias], [x[0], x[1]])
        return self.b(self.a(x))


@pytest.mark.parametrize("options", [{}, {"frozen_parameter": True}, {"pattern_fusion_pass": True}],
                         ids=lambda o: ",".join(o) or "default")
def test_an_in_place_foreach_on_parameters_runs_in_place_and_its_items_read_the_written_lists(options):
    torch.manual_seed(12)
    ours, theirs = _ForeachInForward().eval(), _ForeachInForward().eval()
    theirs.load_state_dict(ours.state_dict())
    torch._dynamo.reset()
    compiled = compile_graphex(ours, **options)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            got, want = compiled(x), theirs(x)
            if options.get("pattern_fusion_pass"):
                torch.testing.assert_close(got, want)
            else:
                assert_same(got, want)
    for name, p in ours.state_dict().items():
        assert_same(p, theirs.state_dict()[name])
