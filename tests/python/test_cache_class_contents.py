"""cache_compile sees a class change what it holds, however it changes (Note [What Dynamo reads without a guard is
recorded by graphex], graphex/inference/guard_records.py; Note [A class is watched by everything its digest reads],
graphex/inference/pins.py). Each case mutates a class (or an object whose class has a `__getattr__`) after one call
(the next call runs the full check) or after three (the fast path's watch answers), and compares with eager. All of
them replayed the old result before; most do under `torch.compile(backend="eager")` too (torch 2.13)."""

from __future__ import annotations

import torch
import pytest

import graphex


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


class _Base:
    def m(self, y):
        return y + 1

    @classmethod
    def cm(cls, y):
        return y + 2

    @staticmethod
    def sm(y):
        return y + 3

    @property
    def p(self):
        return 2.0


def _classes():
    """A fresh base and subclass per case (the cases mutate them)."""
    base = type("Base", (_Base,), {"m": _Base.m, "cm": classmethod(_Base.cm.__func__),
                                   "sm": staticmethod(_Base.sm), "p": property(_Base.p.fget), "v": 2.0})
    return base, type("Sub", (base,), {})


def _calls_m(x, o):
    return o.m(x)


def _calls_cm(x, o):
    return o.cm(x)


def _calls_sm(x, o):
    return o.sm(x)


def _reads_p(x, o):
    return x * o.p


def _reads_v(x, k):
    return x * k.v


def _is_sub(x, o):
    return x + 1 if isinstance(o, _GLOBAL["Sub"]) else x - 1


_GLOBAL: dict[str, type] = {}


def _global_cm(x, _):
    return _GLOBAL["Sub"].cm(x)


def _times(k):
    return lambda *args: args[-1] * k


# name -> (function, what it is passed: "instance" or "class", the mutation (base, sub))
CASES = {
    "method_code_replaced": (_calls_m, "instance",
                             lambda b, s: setattr(b.m, "__code__", (lambda self, y: y * 9).__code__)),
    "classmethod_reinit": (_calls_cm, "instance", lambda b, s: vars(b)["cm"].__init__(lambda cls, y: y * 9)),
    "staticmethod_reinit": (_calls_sm, "instance", lambda b, s: vars(b)["sm"].__init__(lambda y: y * 9)),
    "property_reinit": (_reads_p, "instance", lambda b, s: vars(b)["p"].__init__(lambda self: 9.0)),
    "class_arg_own_classmethod_assigned": (_calls_cm, "class", lambda b, s: setattr(s, "cm", classmethod(_times(9)))),
    "class_arg_base_classmethod_assigned": (_calls_cm, "class", lambda b, s: setattr(b, "cm", classmethod(_times(7)))),
    "class_arg_base_classmethod_reinit": (_calls_cm, "class", lambda b, s: vars(b)["cm"].__init__(lambda c, y: y * 9)),
    "class_arg_method_code_replaced": (lambda x, k: k.m(k, x), "class",
                                       lambda b, s: setattr(b.m, "__code__", (lambda self, y: y * 9).__code__)),
    "class_arg_value_assigned_to_base": (_reads_v, "class", lambda b, s: setattr(b, "v", 5.0)),
    "class_arg_value_shadowed_in_sub": (_reads_v, "class", lambda b, s: setattr(s, "v", 5.0)),
    "global_class_classmethod_assigned": (_global_cm, "none", lambda b, s: setattr(s, "cm", classmethod(_times(9)))),
}


@pytest.mark.parametrize("calls_before", [1, 3], ids=["full_check", "fast_path"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_class_changed_after_the_trace_is_seen(tmp_path, case, calls_before):
    fn_, passed, mutate = CASES[case]
    base, sub = _classes()
    _GLOBAL["Sub"] = sub
    arg = sub() if passed == "instance" else sub if passed == "class" else None
    fn = graphex.inference.cache_compile(fn_, cache_dir=str(tmp_path))
    x = torch.tensor([1.0, 2.0])
    with torch.no_grad():
        for _ in range(calls_before):
            assert _same(fn(x, arg), fn_(x, arg))
        mutate(base, sub)
        want = fn_(x, arg)
        for _ in range(3):
            assert _same(fn(x, arg), want), case


def test_a_method_replaced_by_one_with_the_same_code_is_watched_from_then_on(tmp_path):
    """`C.m = g` with g a copy of m (the same code: the digest is equal, the call hits) and then `g.__code__ = ...`:
    the watch built before the assignment watched m's code, not g's; the full check that passed after the assignment
    asks for a new bind, which watches g (Note [A class is watched by everything its digest reads])."""
    import types

    base, sub = _classes()
    fn = graphex.inference.cache_compile(_calls_m, cache_dir=str(tmp_path))
    x, o = torch.tensor([1.0, 2.0]), sub()
    with torch.no_grad():
        for _ in range(3):
            assert _same(fn(x, o), _calls_m(x, o))
        m = vars(base)["m"]
        base.m = types.FunctionType(m.__code__, m.__globals__, m.__name__, m.__defaults__, m.__closure__)
        base.m.__qualname__ = m.__qualname__
        for _ in range(3):
            assert _same(fn(x, o), _calls_m(x, o))
        base.m.__code__ = (lambda self, y: y * 9).__code__
        for _ in range(3):
            assert _same(fn(x, o), _calls_m(x, o))


def test_isinstance_of_a_class_whose_bases_change_is_seen(tmp_path):
    base, sub = _classes()
    _GLOBAL["Sub"] = sub
    other = type("Other", (), {})
    fn = graphex.inference.cache_compile(_is_sub, cache_dir=str(tmp_path))
    x, o = torch.tensor([1.0, 2.0]), sub()
    with torch.no_grad():
        for _ in range(3):
            assert _same(fn(x, o), _is_sub(x, o))
        o.__class__ = other
        for _ in range(3):
            assert _same(fn(x, o), _is_sub(x, o))


class _Delegates:
    def __init__(self):
        self.store = {"a": 2.0}

    def __getattr__(self, name):
        return self.store[name]


def _reads_a(x, o):
    return x * o.a


@pytest.mark.parametrize("calls_before", [1, 3], ids=["full_check", "fast_path"])
def test_an_attribute_that_now_shadows_getattr_is_seen(tmp_path, calls_before):
    """`o.a` found by the class's `__getattr__`, then `o.a = 3.0` set on the instance: eager reads the instance's
    value, and Dynamo's guards do not see the new key (its own replay gives the old one too)."""
    fn = graphex.inference.cache_compile(_reads_a, cache_dir=str(tmp_path))
    x, o = torch.tensor([1.0, 2.0]), _Delegates()
    with torch.no_grad():
        for _ in range(calls_before):
            assert _same(fn(x, o), _reads_a(x, o))
        o.a = 3.0
        for _ in range(3):
            assert _same(fn(x, o), _reads_a(x, o))
        del o.a
        for _ in range(3):
            assert _same(fn(x, o), _reads_a(x, o))


def test_an_unchanged_class_keeps_the_fast_path(tmp_path):
    """The new checks cost no recompile and keep the watch on: a class passed in and an object with a `__getattr__`,
    called many times unchanged, hit the entry the first call wrote and run the fast path."""
    base, sub = _classes()
    fn = graphex.inference.cache_compile(_calls_cm, cache_dir=str(tmp_path))
    fn2 = graphex.inference.cache_compile(_reads_a, cache_dir=str(tmp_path))
    x, o = torch.tensor([1.0, 2.0]), _Delegates()
    with torch.no_grad():
        for _ in range(5):
            fn(x, sub)
            fn2(x, o)
    for f in (fn, fn2):
        entries = [e for es in f._by_call.values() for e in es]
        assert len(entries) == 1
        assert entries[0].guard_set.watch.unchanged()


class _Meta(type):
    k = 2.0

    def scale(cls):
        return 2.0


class _MyClassMethod(classmethod):
    pass


def _metaclass_cases():
    meta = type("Meta", (_Meta,), {"k": 2.0, "scale": _Meta.scale})
    k = meta("K", (), {"cm": _MyClassMethod(lambda cls, y: y + 2)})
    return meta, k


def _reads_meta_k(x, k):
    return x * k.k


def _calls_meta_scale(x, k):
    return x * type(k).scale(k)  # `k.scale()`: Dynamo 2.11 cannot bind a metaclass method's arguments (Unsupported)


def _make_closure(cls):
    def closes_over(x, _):
        return cls.cm(x)

    return closes_over


# name -> (function of (x, K) or a maker of one from K, the mutation (meta, K)); found by a helper
OTHER_CASES = {
    "metaclass_attribute_assigned": (_reads_meta_k, lambda meta, k: setattr(meta, "k", 5.0)),
    "metaclass_method_assigned": (_calls_meta_scale, lambda meta, k: setattr(meta, "scale", lambda cls: 7.0)),
    "metaclass_method_code_replaced": (_calls_meta_scale,
                                       lambda meta, k: setattr(meta.scale, "__code__", (lambda cls: 7.0).__code__)),
    "classmethod_subclass_reinit": (_calls_cm, lambda meta, k: vars(k)["cm"].__init__(lambda cls, y: y * 9)),
    "classmethod_subclass_code_replaced": (
        _calls_cm, lambda meta, k: setattr(vars(k)["cm"].__func__, "__code__", (lambda cls, y: y * 9).__code__)),
    "closure_class_classmethod_assigned": (_make_closure, lambda meta, k: setattr(k, "cm", classmethod(_times(9)))),
}


@pytest.mark.parametrize("calls_before", [1, 3], ids=["full_check", "fast_path"])
@pytest.mark.parametrize("case", sorted(OTHER_CASES))
def test_a_metaclass_a_classmethod_subclass_and_a_closure_held_class_are_seen(tmp_path, case, calls_before):
    fn_, mutate = OTHER_CASES[case]
    meta, k = _metaclass_cases()
    if fn_ is _make_closure:
        fn_ = _make_closure(k)
    fn = graphex.inference.cache_compile(fn_, cache_dir=str(tmp_path))
    x = torch.tensor([1.0, 2.0])
    with torch.no_grad():
        for _ in range(calls_before):
            assert _same(fn(x, k), fn_(x, k))
        mutate(meta, k)
        want = fn_(x, k)
        for _ in range(3):
            assert _same(fn(x, k), want), case


def _is_a_base(x, o):
    return x + 1 if isinstance(o, _ABC_BASE[0]) else x - 1


_ABC_BASE: list[type] = []


@pytest.mark.parametrize("calls_before", [1, 3], ids=["full_check", "fast_path"])
def test_a_class_registered_with_an_abc_after_the_trace_is_seen(tmp_path, calls_before):
    """`Base.register(Impl)` makes `isinstance(impl, Base)` true and changes no class: Note [An ABC's answers are
    recorded] (found by a helper; torch.compile replays the old answer too). An unrelated registration costs a
    check, not a miss."""
    import abc

    base = abc.ABCMeta("Base", (abc.ABC,), {})
    _ABC_BASE[:] = [base]
    impl, other = type("Impl", (), {}), type("Other", (), {})
    fn = graphex.inference.cache_compile(_is_a_base, cache_dir=str(tmp_path))
    x, o = torch.tensor([1.0, 2.0]), impl()
    with torch.no_grad():
        for _ in range(calls_before):
            assert _same(fn(x, o), _is_a_base(x, o))
        abc.ABCMeta("Unrelated", (abc.ABC,), {}).register(other)
        for _ in range(2):
            assert _same(fn(x, o), _is_a_base(x, o))
        assert fn.stats["compiles"] == 1, fn.stats
        base.register(impl)
        for _ in range(3):
            assert _same(fn(x, o), _is_a_base(x, o))


def test_a_class_check_watches_the_functions_a_class_holds_now():
    """The type check's own watch (_ClassUnchanged) after `C.m = g`, g with m's code (the digest is equal), watches g:
    a later `g.__code__ = ...` is a changed class."""
    import types

    from graphex.inference.fingerprints import _class_digest
    from graphex.inference.state_watch import _ClassUnchanged

    base, sub = _classes()
    check = _ClassUnchanged(sub, _class_digest(sub))
    assert check()
    m = vars(base)["m"]
    base.m = types.FunctionType(m.__code__, m.__globals__, m.__name__, m.__defaults__, m.__closure__)
    base.m.__qualname__ = m.__qualname__
    assert check()
    base.m.__code__ = (lambda self, y: y * 9).__code__
    assert not check()


def _is_a_base_scaled(x, o):
    return x * 2 if isinstance(o, _ABC_BASE[0]) else x * 3


@pytest.mark.parametrize("what", ["int", "float", "list", "tuple", "dict", "dtype", "function", "class"])
def test_a_registration_of_the_type_of_a_value_guarded_otherwise_is_seen(tmp_path, what):
    """The object asked about is guarded by value, by length, by the call's structure or by identity, not by a type
    guard (found by a helper: `Base.register(int)` after the trace replayed the old answer)."""
    import abc

    base = abc.ABCMeta("Base", (abc.ABC,), {})
    _ABC_BASE[:] = [base]
    obj = {"int": 3, "float": 2.5, "list": [1], "tuple": (1,), "dict": {"a": 1}, "dtype": torch.float32,
           "function": _times_a_constant, "class": type("K", (), {})}[what]
    fn = graphex.inference.cache_compile(_is_a_base_scaled if what != "class" else _is_a_base_class,
                                         cache_dir=str(tmp_path))
    eager = _is_a_base_scaled if what != "class" else _is_a_base_class
    x = torch.tensor([1.0, 2.0])
    with torch.no_grad():
        for _ in range(3):
            assert _same(fn(x, obj), eager(x, obj))
        base.register(obj if what == "class" else type(obj))
        for _ in range(3):
            assert _same(fn(x, obj), eager(x, obj))


def _times_a_constant(y):
    return y * 5


def _is_a_base_class(x, k):
    return x * 2 if issubclass(k, _ABC_BASE[0]) else x * 3


def test_a_protocol_with_data_members_is_cached(tmp_path):
    """`issubclass` refuses a runtime-checkable Protocol with data members (isinstance works): the answer is kept as
    'refused', and the call is cached (it failed with TypeError inside Dynamo's callback; found by a helper)."""
    from typing import Protocol, runtime_checkable

    @runtime_checkable
    class HasFoo(Protocol):
        foo: int

    class Foo:
        foo = 1

    def f(x, o):
        return x + 1 if isinstance(o, HasFoo) else x - 1

    fn = graphex.inference.cache_compile(f, cache_dir=str(tmp_path))
    x, o = torch.tensor([1.0, 2.0]), Foo()
    with torch.no_grad():
        for _ in range(3):
            assert _same(fn(x, o), f(x, o))
    assert fn.stats["writes"] == 1, fn.stats


class _WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("s", torch.tensor(2.0))
        self.lin = torch.nn.Identity()

    def forward(self, x):
        return self.lin(x) * self.s


@pytest.mark.parametrize("calls_before", [1, 3], ids=["full_check", "fast_path"])
@pytest.mark.parametrize("name", ["s", "lin"])
def test_an_instance_dict_entry_that_shadows_a_buffer_or_submodule_is_seen(tmp_path, name, calls_before):
    """`m.__dict__["s"] = t` shadows buffer `s` in eager (nn.Module's `__getattr__` is not asked): found by a helper,
    torch.compile replays the buffer too."""
    m = _WithBuffer()
    fn = graphex.inference.cache_compile(m.forward, cache_dir=str(tmp_path))
    x = torch.tensor([1.0, 2.0])
    with torch.no_grad():
        for _ in range(calls_before):
            assert _same(fn(x), m(x))
        m.__dict__[name] = torch.tensor(7.0) if name == "s" else (lambda y: y + 1)
        for _ in range(3):
            assert _same(fn(x), m.forward(x))


def test_a_class_dict_write_that_changes_nothing_keeps_the_cpp_fast_path(tmp_path):
    """copyreg writes `__slotnames__` into a class (a deepcopy does): the class check snapshots the watch the FastCall
    holds again, so one call takes the Python path and the rest C++ (after 08aa982 every later call took Python)."""
    def twice(x):
        return x * 2

    fn = graphex.inference.cache_compile(twice, cache_dir=str(tmp_path))
    calls = [0]
    python_path = fn._call

    def counted(*args, **kwargs):
        calls[0] += 1
        return python_path(*args, **kwargs)

    fn._call = counted
    x = torch.ones(2)
    with torch.no_grad():
        for _ in range(5):
            fn(x)
        before = calls[0]
        torch.Tensor.__slotnames__ = []
        try:
            for _ in range(20):
                assert _same(fn(x), twice(x))
        finally:
            del torch.Tensor.__slotnames__
    assert calls[0] - before <= 1, calls[0] - before
