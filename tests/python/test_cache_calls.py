"""What a cache_compile'd call accepts and returns, on the call that compiles and on every replay: the results are
eager's objects (one tensor returned twice is one object, a torch.Size stays a Size), and any argument structure
eager accepts is accepted (keywords named `self` or `func`, keywords Python would normalize, lists and dicts),
spelled out where it can be (Note [A call is spelled out], graphex/inference/flat_call.py). Each was found by a
helper trying to break the cache."""

from __future__ import annotations

import pytest
import torch

from graphex.inference import cache_compile
from graphex.inference.flat_call import SPELLED_OUT, make_flat
from torch.utils import _pytree as pytree


def _cached(fn, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700, exist_ok=True)
    return cache_compile(fn, cache_dir=str(cache))


def _returns_one_tensor_twice(x):
    h = x * 2
    return h, {"a": h, "b": [h, x]}


def test_a_tensor_returned_twice_is_one_object_on_every_replay(tmp_path):
    cached = _cached(_returns_one_tensor_twice, tmp_path)
    x = torch.arange(4.0)
    with torch.no_grad():
        for _ in range(3):
            h, d = cached(x)
            assert torch.equal(h, x * 2) and d["a"] is h and d["b"][0] is h and d["b"][1] is x
    assert cached.stats["hits"] == 0 and cached.stats["compiles"] == 1  # replays of the entry it wrote


def _returns_two_views_of_one_value(x, w):
    return x.view(-1), x.view(-1), x[0], x[0], w.t(), w.t(), w


def test_two_views_of_one_value_are_two_tensors(tmp_path):
    """Note [Two views of one output are two tensors] (graphex/inference/capture.py): eager's two `x.view(-1)` are two
    tensors, so changing one's sizes in place leaves the other as it was; on the compiling call, on replays and in a
    loaded entry (a second cache_compile of the same function, which hits the entry the first wrote)."""
    x, w = torch.randn(2, 3), torch.randn(3, 4)
    for attempt in range(2):
        cached = _cached(_returns_two_views_of_one_value, tmp_path)
        with torch.no_grad():
            for _ in range(3):
                got, want = cached(x, w), _returns_two_views_of_one_value(x, w)
                for i in range(len(want)):
                    for j in range(len(want)):
                        assert (got[i] is got[j]) == (want[i] is want[j]), (attempt, i, j)
                    assert got[i]._base is want[i]._base and torch.equal(got[i], want[i])
                got[0].unsqueeze_(0), got[2].t_(), got[4].unsqueeze_(0)
                assert got[1].shape == (6,) and got[3].shape == (3,) and got[5].shape == (4, 3)
        assert cached.stats["hits" if attempt else "compiles"] == 1


def test_a_size_is_returned_as_a_size(tmp_path):
    def fn(x):
        return x * 2, x.shape, [x.shape[0], x.size()]

    cached = _cached(fn, tmp_path)
    x = torch.randn(2, 3)
    with torch.no_grad():
        for _ in range(3):
            out, shape, rest = cached(x)
            assert type(shape) is torch.Size and shape == x.shape and type(rest[1]) is torch.Size


def _by_keyword(x, **kw):
    return x + sum(v * ord(k[0]) * (i + 1) for i, (k, v) in enumerate(kw.items()))  # reads the names too


@pytest.mark.parametrize("kwargs", [
    {"\ufb01": 1.0},                       # the "fi" ligature: an identifier Python's source normalizes to "fi"
    {"fi": 1.0, "\ufb01": 2.0},            # both: written out they would collide
    {"func": 1.0, "flat_args": 2.0},       # the names of the spelled-out function's own variables
    {"a-b": 1.0},                          # not an identifier
], ids=["nfkc", "nfkc-and-plain", "own-names", "not-identifier"])
def test_keywords_reach_the_function_as_given(tmp_path, kwargs):
    cached = _cached(_by_keyword, tmp_path)
    x = torch.arange(4.0)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(cached(x, **kwargs), _by_keyword(x, **kwargs))


def test_a_keyword_named_self(tmp_path):
    def fn(x, self=None):
        return x + self

    cached = _cached(fn, tmp_path)
    x, t = torch.arange(4.0), torch.ones(4)
    with torch.no_grad():
        assert torch.equal(cached(x, self=t), x + t) and torch.equal(cached(x, self=t), x + t)


def _structured(x, pair, table=None, *, scale=1.0, nothing=None):
    return x + pair[0] * pair[1] * table["w"] * scale + (table["i"][0] if nothing is None else 0)


def test_lists_dicts_and_none_are_spelled_out_and_replayed(tmp_path):
    x, a, b, w = (torch.randn(4) for _ in range(4))
    args, kwargs = (x, [a, b], {"w": w, "i": (a,)}), {"scale": 0.5, "nothing": None}
    spec = pytree.tree_flatten((args, kwargs))[1]
    assert make_flat(_structured, spec).__code__.co_filename == SPELLED_OUT
    cached = _cached(_structured, tmp_path)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(cached(*args, **kwargs), _structured(*args, **kwargs))
            assert cached(*args, **{**kwargs, "scale": 0.25}).equal(_structured(*args, **{**kwargs, "scale": 0.25}))


def test_a_structure_pytree_must_rebuild_is_not_spelled_out():
    from collections import OrderedDict, namedtuple

    Pair = namedtuple("Pair", "a b")
    for arg in (Pair(torch.ones(1), torch.ones(1)), OrderedDict(a=torch.ones(1))):
        spec = pytree.tree_flatten(((arg,), {}))[1]
        assert make_flat(lambda p: p, spec).__code__.co_filename != SPELLED_OUT


def test_frozen_parameter_says_it_has_no_effect_on_an_entry_and_a_later_weight_is_read(tmp_path):
    """An entry binds parameters by name (Note [A cache entry is lowered once]): frozen_parameter is turned off, and
    the user is told so once, instead of silently (a helper's find); a weight written later is read."""
    import warnings

    import graphex
    from graphex.base import warn as warn_mod

    lin = torch.nn.Linear(4, 4).eval()
    warn_mod.reset()
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        cached = graphex.inference.cache_compile(lin.forward, cache_dir=str(tmp_path),
                                                 options={"frozen_parameter": True})
        assert torch.equal(cached(x), lin(x))
        lin.weight.mul_(2)
        assert torch.equal(cached(x), lin(x))
    said = [str(w.message) for w in caught if "frozen_parameter has no effect" in str(w.message)]
    assert said and "cache_compile entry" in said[0], [str(w.message) for w in caught]


def _write_one_read_the_other(a, b):
    r = b.sum()
    a.zero_()
    return r + b.sum()


def _copy_into_one_read_the_other(pair):
    a, b = pair
    a.copy_(b * 2)
    return a + b


@pytest.mark.parametrize("fn,call", [
    (_write_one_read_the_other, lambda f, x: f(x, x)),
    (_write_one_read_the_other, lambda f, x: f(a=x, b=x)),
    (_copy_into_one_read_the_other, lambda f, x: f([x, x])),
], ids=["positional", "keywords", "a_list"])
def test_one_tensor_passed_twice_to_an_entry_traced_with_two_is_not_replayed(tmp_path, fn, call):
    """A helper's find: an entry traced as `f(a, b)` with two tensors ran `f(x, x)` as if they were separate, so
    the write to `a` was not seen through `b` (32 for eager's 16), in the process and loaded from disk in a fresh
    one. Dynamo's guards send `f(x, x)` to a compile of its own; the entry now does too (Note [Bound inputs are
    separate tensors])."""
    with torch.no_grad():
        for cached in (_cached(fn, tmp_path), _cached(fn, tmp_path)):  # traced here, then loaded from disk
            separate = (torch.ones(4, 4), torch.ones(4, 4))
            eager_separate = tuple(t.clone() for t in separate)
            if fn is _copy_into_one_read_the_other:
                assert torch.equal(cached(list(separate)), fn(list(eager_separate)))
            else:
                assert torch.equal(cached(*separate), fn(*eager_separate))
            for _ in range(2):  # the C++ fast path too
                x, x_eager = torch.ones(4, 4), torch.ones(4, 4)
                assert torch.equal(call(cached, x), call(fn, x_eager))
                assert torch.equal(x, x_eager)
