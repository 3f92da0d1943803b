"""Graphs the differential fuzzer (sweeps/fuzz*.py) found graphex-only failures in, each fixed."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same, compile_graphex, engine_runs
from sweeps.compare import clone_tree


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def _write_a_view_read_the_other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    b.mul_(2)
    return a.clamp(min=-1, max=2)


def test_aliasing_inputs_without_a_common_base():
    """Fuzz seed 236: two inputs sharing one storage but no `._base` (as clone_tree, `set_` or packed parameters
    make them): AOTAutograd passes a synthetic base over the whole storage, larger at run time than at trace
    time (Note [A synthetic base is as large as its storage]); graphex refused it with a SignatureError. (With
    dynamic=True torch itself fails to fake the synthetic base, aot_eager too.)"""
    base = torch.randint(-4, 5, (2, 1, 10))
    a, b = clone_tree([base[..., ::2], base[..., ::2].select(0, 0)])
    assert a._base is None and b._base is None and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    compiled = compile_graphex(_write_a_view_read_the_other)
    for _ in range(2):  # capture, then replay
        ea, eb = clone_tree([a, b])
        ga, gb = clone_tree([a, b])
        before = engine_runs()
        assert_same(compiled(ga, gb), _write_a_view_read_the_other(ea, eb))
        assert engine_runs() == before + 1
        assert_same(ga, ea)
        assert_same(gb, eb)


def test_an_update_of_an_expanded_intermediate_is_not_reinplaced():
    """Fuzz seeds 1328 and 1560: `y = x.expand(2, ...)`; `y.index_put(...)` writes one row of a fresh copy in
    eager; reinplaced, it wrote the shared memory, so both rows changed (Note [Never reinplace into
    overlapping memory])."""
    def f(a):
        y = torch.cat([a, a], 0).expand(2, 4, 3)
        return y.index_put((torch.tensor([0]),), y[:1] * 2)

    a = torch.randn(2, 3)
    compiled = compile_graphex(f)
    before = engine_runs()
    assert_same(compiled(a), f(a))
    assert_same(compiled(a + 1), f(a + 1))
    assert engine_runs() == before + 2


def test_a_slice_of_an_intermediate_is_still_updated_in_place():
    """The check refuses only memory that overlaps itself: a strided slice (a KV-cache page) is still reinplaced."""
    from graphex.passes.reinplace import _may_overlap_itself

    assert not _may_overlap_itself(torch.zeros(4, 6)[:, 2]) and not _may_overlap_itself(torch.zeros(4, 6)[::2].t())
    assert _may_overlap_itself(torch.zeros(3).expand(2, 3))
    assert _may_overlap_itself(torch.zeros(16).as_strided((3, 3), (2, 1)))

    def f(a):
        y = a * 2
        return y.index_put((torch.tensor([1]),), a[:1])

    seen: list[object] = []
    a = torch.randn(3, 4)
    compiled = compile_graphex(f, post_grad_custom_post_pass=lambda g: seen.extend(n.target for n in g.nodes))
    assert_same(compiled(a), f(a))
    assert torch.ops.aten.index_put_.default in seen and torch.ops.aten.index_put.default not in seen


@pytest.mark.parametrize("options", [{}, {"input_inplace_pass": False}, {"inplace_pass": False}],
                         ids=["default", "input_inplace_pass-off", "inplace_pass-off"])
def test_a_copy_of_an_input_taken_before_it_is_overwritten(options):
    """Fuzz seed 2196: `a.copy_(b); b.zero_()`: the functional graph snapshots b (`aten.copy(a, b)`) and
    writes inputs back in input order, b first; remove_noop_ops replaced the snapshot by b itself, so a got
    the zeros (Note [A copy of an input is a snapshot]). With inplace_pass=False the same graph failed to
    compile: its empty output tuple was lost while pinning intermediates."""
    def f(keep, a, b):
        b.reshape(-1)  # unused, yet it changes the order of AOTAutograd's graph (as the fuzzer shrank it)
        a.copy_(b)
        b.zero_()
        return (keep,)

    compiled = compile_graphex(f, **options)
    for _ in range(2):
        keep, a, b = torch.tensor(5.0), torch.tensor(1.0), torch.tensor(2.0)
        ea, eb = a.clone(), b.clone()
        expected = f(keep, ea, eb)
        assert_same(compiled(keep, a, b), expected)
        assert_same(a, ea)
        assert_same(b, eb)


def _snapshot_between_two_writes(x):
    x[0].zero_()
    snap = x.clone()
    x[1].zero_()
    return snap, x


def _clone_of_a_written_input(x):
    x[0].zero_()
    return x.clone()


def _clone_of_a_diagonal_write(x):
    x.diagonal().fill_(1.0)
    return (x.clone(), x.sum())


def _snapshot_between_a_split_write_and_a_diagonal_write(x):
    part = x.split(1, 0)[1]
    part.index_put_((torch.tensor([0]),), (part[:1] * 2).clone(), accumulate=True)
    diagonal = x.diagonal()
    snap = x.clone()
    diagonal.add_(1)
    return (snap,)


@pytest.mark.parametrize("fn", [_snapshot_between_two_writes, _clone_of_a_written_input, _clone_of_a_diagonal_write,
                                _snapshot_between_a_split_write_and_a_diagonal_write])
def test_a_clone_of_an_input_written_through_a_view_is_a_copy(fn):
    """Found by a helper: `x[0].zero_(); snap = x.clone(); x[1].zero_()` returned a snap with the second write in
    it, and `x[0].zero_(); return x.clone()` returned x itself. Functional, the write is a select_scatter, which
    has no in-place twin of its own name, so the no-op pass did not see that reinplacing puts it into x's memory
    and replaced the clone by it (Note [A copy of an input is a snapshot]). The fuzzer then found the same through a
    full-size slice_scatter the walk had already kept as a no-op itself (seed 2652)."""
    compiled = compile_graphex(fn)
    for _ in range(3):
        x, ex = torch.arange(1.0, 10.0).reshape(3, 3), torch.arange(1.0, 10.0).reshape(3, 3)
        got, want = compiled(x), fn(ex)
        assert_same(got, want)
        assert_same(x, ex)
        assert got[0] is not x and got[0].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_inplace_pass_off_keeps_every_output():
    """The output tuple survives pinning intermediates (inplace_pass=False returned one of two outputs)."""
    def f(x):
        return x + 1, x * 2

    x = torch.randn(3)
    assert_same(compile_graphex(f, inplace_pass=False)(x), f(x))


def test_a_sum_of_symbolic_sizes_is_replayed():
    """Fuzz seed 4400: under dynamic=True an expanded strided slice passed to a custom op makes torch emit
    `torch.sym_sum([...])`, which graphex refused (Note [sym_sum is a chain of adds])."""
    import sweeps.fuzz_ops  # noqa: F401 - torch.ops.graphex_fuzz

    def f(x):
        y = torch.exp(x)[..., ::2]
        return torch.ops.graphex_fuzz.scale(y.expand(2, *y.shape), 2)

    compiled = compile_graphex(f, dynamic=True)
    for n in (5, 7, 9):
        x = torch.randn(n, dtype=torch.float16).expand(3, n)[0]
        before = engine_runs()
        assert_same(compiled(x), f(x))
        assert engine_runs() == before + 1


def test_an_update_of_a_transposed_input_then_a_reshape():
    """Fuzz seed 5272: `a.index_copy_(...)` on a transposed input, then `a.reshape(-1)`: the functional result
    is contiguous, so the reshape was traced as a view of it; folded in place it was a view of `a`'s
    transposed memory and the replay failed (Note [Folding keeps the layout readers saw])."""
    def f(a):
        a.index_copy_(0, torch.tensor([1, 2, 0]), (a[:3] * 2).clone())
        return a.reshape(-1)

    compiled = compile_graphex(f)
    for _ in range(2):
        a = torch.randint(-4, 5, (5, 3, 3)).transpose(0, 1)
        ea = a.clone()
        assert_same(compiled(a), f(ea))
        assert_same(a, ea)


def test_an_in_place_custom_op_on_a_view_of_a_strided_input_after_an_update():
    """Fuzz seed 5432: `a.add_(1)` on a strided input, then an in-place custom op on a slice of it: folded in
    place with the contiguous strides the functional result had, the custom op's write-back went astray
    (Note [Folding keeps the layout readers saw])."""
    import sweeps.fuzz_ops  # noqa: F401 - torch.ops.graphex_fuzz

    def f(a):
        a.add_(1)
        torch.ops.graphex_fuzz.add_one_(a.split(3, 0)[0])
        return (a,)

    compiled = compile_graphex(f)
    for _ in range(2):
        a = torch.randn(2, 2, 8)[..., ::2]
        ea = a.clone()
        assert_same(compiled(a), f(ea))
        assert_same(a, ea)


@pytest.mark.parametrize("seed,source,inputs", [
    (8832, """\
def program(a0, a1, a2, a3, a4, a5, a6):
    torch.ops.graphex_fuzz.add_one_(a4)
    a3.copy_(a4)
    a4.copy_(a5)
    return (a0,)
""", [((1, 2, 1), 'float32', 'contiguous'), ((), 'float32', 'contiguous'), ((4, 4, 2), 'int64', 'sliced'),
      ((), 'float32', 'contiguous'), ((), 'float32', 'contiguous'), ((), 'bfloat16', 'contiguous'),
      ((1, 3, 4), 'float32', 'contiguous')]),
    (8812, """\
def program(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
    p3_v0 = a10.split(3, 0)[0]
    p3_v0.mul_(2)
    p3_v1 = p3_v0.index_put((torch.tensor([1, 0]),), (p3_v0[:2] * 2))
    p3_v2 = p3_v1.index_put((torch.tensor([0]),), (p3_v1[:1] * 2))
    return (p3_v2,)
""", [((4,), 'float32', 'expanded'), ((2,), 'bfloat16', 'transposed'), ((4,), 'bfloat16', 'contiguous'),
      ((1,), 'float16', 'transposed'), ((1,), 'float16', 'contiguous'), ((1, 3), 'int64', 'expanded'),
      ((1, 3), 'bfloat16', 'contiguous'), ((1, 3), 'float32', 'transposed'), ((2,), 'int64', 'contiguous'),
      ((), 'int64', 'contiguous'), ((2,), 'float32', 'transposed')]),
], ids=["seed8832-snapshot-of-a-custom-op-result", "seed8812-index_put-chain-on-an-updated-input"])
def test_a_snapshot_of_a_new_value_of_an_input_survives_the_write_back(seed, source, inputs):
    """Note [A copy of an input is a snapshot]: a copy of a mutated input's new value (a custom op's in-place
    result, an updated slice) is kept, because reinplacing puts that value into the input's memory and the
    input's own write-back may overwrite it before the copy is read (inputs compared too)."""
    from sweeps.fuzz_gen import Input
    from sweeps.fuzz_run import reproduce

    assert reproduce(source, [Input(*spec) for spec in inputs], seed=seed, dynamic=False) == 0


def _copy_into_an_intermediate_then_index_put_a_view(a: torch.Tensor) -> torch.Tensor:
    v = torch.ops.graphex_fuzz.scale(a, -2)
    v.copy_(a)
    w = v.unsqueeze(0)
    return w.index_put((torch.tensor([0]),), w[:1] * 2)


def _write_an_input_then_index_put_a_view_of_it(a: torch.Tensor) -> torch.Tensor:
    a.copy_(torch.where(a > 0, a, 0.5))
    w = a.unsqueeze(0).reshape(-1)
    return w.index_put((torch.tensor([0]),), w[:1] * 2)


@pytest.mark.parametrize("fn", [_copy_into_an_intermediate_then_index_put_a_view,
                                _write_an_input_then_index_put_a_view_of_it])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_a_no_op_copy_removed_before_reinplacing_leaves_the_input_alone(fn, shape):
    """Fuzz seeds 16364 and 18544: `v.copy_(a)` (a no-op copy once functional) was replaced by `a`, and the
    users' fake values kept `v`'s own storage, so reinplacing took `a.unsqueeze(0)` for fresh memory and wrote
    `a` in place (Note [No-op removal refreshes the fake values it invalidates])."""
    import sweeps.fuzz_ops  # noqa: F401  graphex_fuzz::scale

    a = torch.randn(shape)
    compiled = compile_graphex(fn)
    for _ in range(2):  # capture, then replay
        ea, ga = clone_tree([a, a])
        assert_same(compiled(ga), fn(ea))
        assert_same(ga, ea)
