"""An object passed in is watched while the same one is passed (Note [An object passed in is watched while the same one
is passed], graphex/inference/pins.py): what the trace read through it is proved by the watch, and each change to it,
each other object in its place, each object passed anew at every call, is seen by the next call (equal to eager's)."""

import functools
import gc
import weakref

import pytest
import torch
import torch.nn as nn

import graphex
from graphex.inference import loaded as loaded_mod


class Layer:
    scaled = True  # a class attribute the trace reads

    def __init__(self, width):
        self.keys = torch.randn(width)
        self.gain = 2.0


class State:
    """A KV cache's shape: a list of layers, each holding tensors and flags."""

    def __init__(self, width=4, layers=2):
        self.layers = [Layer(width) for _ in range(layers)]
        self.on = True


class Step(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, state):
        y = self.proj(x)
        for layer in state.layers:
            y = y + layer.keys * (layer.gain if type(layer).scaled else 1.0)
        return y * 2 if state.on else y


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _installed(tmp_path):
    torch.manual_seed(0)
    model, state, x = Step().eval(), State(), torch.randn(3, 4)
    fn = graphex.inference.cache_compile(model.forward, cache_dir=str(tmp_path))
    python_calls = [0]
    python_path = fn._call

    def counted(*args, **kwargs):  # what the C++ fast path left to Python
        python_calls[0] += 1
        return python_path(*args, **kwargs)

    fn._call = counted
    with torch.no_grad():
        for _ in range(3):
            assert _same(fn(x, state=state), model(x, state))
    assert fn._fast is not None
    return model, fn, state, x, python_calls


def _residual(fn):
    (entry,) = [e for entries in fn._by_call.values() for e in entries]
    source = entry.guard_set.source
    return source[source.index("def rest"):] if "def rest" in source else ""


def test_what_an_object_passed_in_holds_is_proved_by_the_watch(tmp_path):
    model, fn, state, x, python_calls = _installed(tmp_path)
    rest = _residual(fn)
    assert rest.count("if not") == 1 and " is H[" in rest, rest  # one check: the argument is the watched object
    before = python_calls[0]
    with torch.no_grad():
        for _ in range(3):
            assert _same(fn(x, state=state), model(x, state))
    assert python_calls[0] == before, "the same object again left the C++ fast path"


CHANGES = {
    "flag": lambda s: setattr(s, "on", False),
    "number in a layer": lambda s: setattr(s.layers[0], "gain", 5.0),
    "tensor replaced": lambda s: setattr(s.layers[1], "keys", torch.randn(4)),
    "tensor written in place": lambda s: s.layers[1].keys.add_(1.0),
    "tensor of another shape": lambda s: setattr(s.layers[1], "keys", torch.randn(1)),
    "tensor of another dtype": lambda s: setattr(s.layers[1], "keys", torch.randn(4, dtype=torch.float64)),
    "layer replaced": lambda s: s.layers.__setitem__(0, Layer(4)),
    "layer appended": lambda s: s.layers.append(Layer(4)),
    "layer removed": lambda s: s.layers.pop(),
    "list replaced": lambda s: setattr(s, "layers", list(s.layers)),
    "class attribute": lambda s: setattr(Layer, "scaled", False),
    "instance dict replaced": lambda s: setattr(s, "__dict__", {"layers": s.layers, "on": False}),
    "class changed": lambda s: setattr(s.layers[0], "__class__", type("Unscaled", (Layer,), {"scaled": False})),
}


@pytest.fixture(autouse=True)
def _restore():
    yield
    Layer.scaled = True


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_change_to_the_object_is_seen(tmp_path, change):
    model, fn, state, x, _ = _installed(tmp_path)
    CHANGES[change](state)
    with torch.no_grad():
        for _ in range(3):
            assert _same(fn(x, state=state), model(x, state)), change


def test_another_object_in_its_place_and_back(tmp_path):
    model, fn, state, x, _ = _installed(tmp_path)
    other = State()
    other.layers[0].gain = 3.0
    with torch.no_grad():
        for s in (other, state, other, other, state, state, other):
            assert _same(fn(x, state=s), model(x, s))
        state.on = False  # a change to the one no longer watched, then passed again
        assert _same(fn(x, state=state), model(x, state))
        other.layers[1].keys = torch.randn(4)
        assert _same(fn(x, state=other), model(x, state=other))


def test_a_new_object_at_every_call_is_right_and_keeps_a_fast_path(tmp_path):
    """After _MAX_REBINDS binds on new objects, the entry stops watching arguments: every call still equal, and the
    C++ fast path answers again (its residual checks what the argument holds)."""
    model, fn, state, x, python_calls = _installed(tmp_path)
    with torch.no_grad():
        for i in range(loaded_mod._MAX_REBINDS + 3):
            s = State()
            s.layers[0].keys = torch.full((4,), float(i))  # other values, the same guards: one entry
            assert _same(fn(x, state=s), model(x, s))
        before = python_calls[0]
        for i in range(4):
            s = State()
            assert _same(fn(x, state=s), model(x, s))
    assert python_calls[0] == before, "new objects at every call lost the C++ fast path"
    assert "layers" in _residual(fn)  # the residual reads what the argument holds again


def test_an_object_no_longer_passed_is_released_when_another_is_bound(tmp_path):
    model, fn, state, x, _ = _installed(tmp_path)
    gone = weakref.ref(state)
    keys = weakref.ref(state.layers[0].keys)
    del state
    with torch.no_grad():
        for _ in range(2):
            s = State()
            assert _same(fn(x, state=s), model(x, s))
    gc.collect()
    assert gone() is None and keys() is None, "the watch kept an object the caller dropped after another was bound"


class _Scaler:
    def __init__(self, gain):
        self.gain = gain

    def apply(self, y):
        return y * self.gain

    def halve(self, y):
        return y / 2


def _applies(x, fn):
    return fn(x + 1)


ANEW_AT_EACH_READ = {  # arguments no identity can anchor: a bound method or builtin is made anew at each access
    "builtin function": [torch.relu, torch.relu, torch.sigmoid, torch.relu, torch.tanh],
    "bound method of another object": [_Scaler(2.0).apply] * 3 + [_Scaler(5.0).apply, _Scaler(2.0).apply],
    "another method of the same object": [(s := _Scaler(3.0)).apply, s.apply, s.halve, s.apply],
    "partial (anchored: another one is another object)": [(p := functools.partial(torch.mul, other=2.0)), p, p,
                                                          functools.partial(torch.mul, other=4.0), p],
}


@pytest.mark.parametrize("kind", sorted(ANEW_AT_EACH_READ))
def test_an_argument_read_anew_at_each_access_is_checked_at_every_call(tmp_path, kind):
    """Found by a helper: such an argument was pinned without an identity check, and `act=torch.sigmoid` after
    `act=torch.relu` replayed relu."""
    fn = graphex.inference.cache_compile(_applies, cache_dir=str(tmp_path))
    x = torch.tensor([-3.0, 0.5])
    with torch.no_grad():
        for f in ANEW_AT_EACH_READ[kind]:
            assert _same(fn(x, f), _applies(x, f)), (kind, f)


class _WithProperty:
    def __init__(self):
        self._a = 2.0

    @property
    def a(self):
        return self._a


def _times_a(x, o):
    return x * o.a


def _has_a(x, o):
    return x * 2 if hasattr(o, "a") else x * 3


@pytest.mark.parametrize("read", [_times_a, _has_a], ids=["value", "hasattr"])
def test_a_property_given_another_getter_in_place_is_seen(tmp_path, read):
    """`property.__init__` called again on a live property replaces its fget: the watch compares which function the
    property holds (found by a helper: the old getter's value, and `hasattr` through a plain-read getter, replayed)."""
    cls = type("WithProperty", (_WithProperty,), {"a": property(_WithProperty.a.fget)})
    fn = graphex.inference.cache_compile(read, cache_dir=str(tmp_path))
    x, o = torch.tensor([1.0, 2.0]), cls()
    with torch.no_grad():
        for _ in range(3):
            assert _same(fn(x, o), read(x, o))

        def missing(self):
            raise AttributeError("a")

        vars(cls)["a"].__init__(lambda self: 33.0 if read is _times_a else missing(self))
        for _ in range(3):
            assert _same(fn(x, o), read(x, o))


def test_a_miss_runs_no_repr_of_an_argument(tmp_path):
    """The miss message names an object by its type: its `__repr__` is user code (one that raised made every first
    call fail; on a transformers config it serializes the config). Found by a helper."""

    class NoRepr:
        scale = 2.0

        def __repr__(self):
            raise RuntimeError("repr not available")

    fn = graphex.inference.cache_compile(lambda x, o: x * o.scale, cache_dir=str(tmp_path))
    x = torch.ones(2)
    with torch.no_grad():
        assert _same(fn(x, NoRepr()), x * 2.0)
