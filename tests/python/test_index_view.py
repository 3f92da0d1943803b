"""A gather of constant consecutive positions reads through a slice (Note [A constant index reads through a view],
graphex/passes/index_view.py; option index_as_view): Falcon's `qkv[..., [-2], :]`. Exact mode stays eager's bit for
bit; every case where a view could be told from the copy keeps the copy.
"""

from __future__ import annotations

import pytest
import torch

from conftest import captures, compile_graphex

aten = torch.ops.aten


def _indexes(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.index.Tensor)


class Split(torch.nn.Module):
    """Falcon's multi-query split: query heads by a slice, the key and value head by a list index."""

    def __init__(self, heads=4, d=16):
        super().__init__()
        self.heads, self.d = heads, d
        self.qkv = torch.nn.Linear(heads * d, (heads + 2) * d, bias=False)

    def forward(self, x, k_cache, pos):
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, self.heads + 2, self.d)
        q, k, v = qkv[..., :-2, :], qkv[..., [-2], :], qkv[..., [-1], :]
        k_cache.index_copy_(1, pos, k.transpose(1, 2).reshape(b, t, self.d))
        scores = q.transpose(1, 2) @ k_cache.unsqueeze(1).transpose(-1, -2)
        return scores.softmax(-1) @ k_cache.unsqueeze(1) + v.transpose(1, 2)


def _run(model, make_inputs, calls=3, **options):
    torch.manual_seed(0)
    eager_inputs, inputs = make_inputs(), make_inputs()
    compiled = compile_graphex(model, **options)
    with torch.no_grad():
        for _ in range(calls):
            want, got = model(*eager_inputs), compiled(*inputs)
            for w, o in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
                assert torch.equal(o, w) and o.stride() == w.stride()
            for a, b in zip(inputs, eager_inputs):
                assert torch.equal(a, b)
    return captures()[-1].gm, got


def _split_inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(1, 1, 64, generator=g), torch.zeros(1, 8, 16), torch.tensor([3])]


@pytest.mark.parametrize("fused", [False, True], ids=["exact", "fused"])
def test_falcons_split_reads_through_views_bit_for_bit(fused):
    gm, _ = _run(Split().eval(), _split_inputs, pattern_fusion_pass=fused)
    assert _indexes(gm) == 0


def test_index_as_view_false_keeps_the_copies():
    gm, _ = _run(Split().eval(), _split_inputs, index_as_view=False)
    assert _indexes(gm) == 2


def _returned(x):
    return x[:, [1, 2]] * 1, x[:, [0]]  # the second: a copy eager returns as new memory


def _not_consecutive(x):
    return x[:, [0, 2]] + 1


def _two_dims(x):
    return x[torch.tensor([0]), torch.tensor([1])] + 1


def _boolean(x):
    return x[:, torch.tensor([True, False, True])] + 1


def _other_layout(x):  # rows of more than one element: the slice's stride is not the copy's
    return (x.view(2, 3, 2)[:, [1], :] + 1).sum(0)


def _written_after(x):
    y = x[:, [1]] + 0
    z = x[:, [2]]
    x.mul_(2)  # the copy z holds the old values, a view would see the new ones
    return y + z


@pytest.mark.parametrize("fn,copies", [(_returned, 1), (_not_consecutive, 1), (_two_dims, 1), (_boolean, 1),
                                       (_other_layout, 1), (_written_after, 2)],
                         ids=lambda v: getattr(v, "__name__", str(v)).strip("_"))
def test_near_misses_keep_the_copy(fn, copies):
    gm, got = _run(fn, lambda: [torch.arange(12.0).view(2, 6)[:, :3].clone() if fn is not _other_layout
                                else torch.arange(12.0).view(2, 6)])
    assert _indexes(gm) >= copies, gm.code
    if fn is _returned:
        eager = fn(torch.arange(12.0).view(2, 6)[:, :3].clone())
        out = compile_graphex(fn)(torch.arange(12.0).view(2, 6)[:, :3].clone())
        assert out[1]._base is None and eager[1]._base is None and torch.equal(out[1], eager[1])


def test_consecutive_negative_positions_are_a_slice():
    def f(x):
        return x[:, [-2, -1]] * 2 + x[:, [0]]

    gm, _ = _run(f, lambda: [torch.randn(1, 5, generator=torch.Generator().manual_seed(5))])
    assert _indexes(gm) == 0


def test_transformers_falcon_stays_bit_for_bit_without_its_index_copies():
    pytest.importorskip("transformers")
    import copy

    from bench import models

    base = models.hf_family("falcon", "coverage", torch.float32)
    eager = models.FamilyStep(copy.deepcopy(base), 32, 5)
    compiled = compile_graphex(models.FamilyStep(copy.deepcopy(base), 32, 5))
    with torch.no_grad():
        for token in (3, 7, 11):
            ids = torch.tensor([[token]])
            assert torch.equal(compiled(ids, torch.tensor(5)), eager(ids, torch.tensor(5)))
    assert _indexes(captures()[-1].gm) == 0
