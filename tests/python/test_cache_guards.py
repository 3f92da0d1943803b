"""cache_compile checks what the trace read (Note [cache_compile keys on what the trace read]): every change to
state the trace depended on, in this process after the first call or in another process, recompiles and matches
eager; nothing read from a cache file is run unless the file is the user's own, and then only through typed
records (Note [A cache file is loaded only when it is the user's own]).
"""

from __future__ import annotations

import collections
import contextvars
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphex
from graphex import compat
from graphex.inference import entry as entry_mod
from graphex.inference import fingerprints, guard_sources

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.join(HERE, "cache_guard_project")
SCALE = 2.0  # a global the traced code reads


def _run_scenarios(cache_dir: str, variant: str) -> dict:
    proc = subprocess.run([sys.executable, "scenarios.py", cache_dir, variant], cwd=PROJECT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "GRAPHEX_LOG": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "cannot be cached" not in proc.stderr, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def three_processes(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("guards"))
    return [_run_scenarios(cache, v) for v in ("a", "b", "a")]


_TRACES_CONTEXTVAR = pytest.mark.skipif(compat.TORCH_VERSION < (2, 15),
                                        reason="Dynamo traces ContextVar.get() since torch 2.15 (before: a graph break)")
SCENARIOS = ["Namespace", "DictAttr", "StoredFunction", "ReplacedMethod", "NewShapeAfterChange", "transformers",
             pytest.param("ContextVarRead", marks=_TRACES_CONTEXTVAR)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_state_the_trace_read_is_checked_across_processes(three_processes, scenario):
    """Process a compiles with one value; process b (another value: a SimpleNamespace config, a dict's values, a
    function stored on the module, a method assigned to the class from another module, an attribute changed
    in-process before a new shape compiled, transformers' config._attn_implementation, a ContextVar set where
    process a leaves its sentinel default) must miss and match eager; a second process a hits the first one's
    entry."""
    first, other, again = (run[scenario] for run in three_processes)
    assert first["equal"] and other["equal"] and again["equal"], (first, other, again)
    assert first["writes"] >= 1, first
    assert other["hits"] == 0 and other["compiles"] >= 1, f"{scenario}: process b loaded a's entry: {other}"
    assert again["hits"] >= 1 and again["compiles"] == 0, f"{scenario}: a's entry was not found again: {again}"


# -- in one process ------------------------------------------------------------------------------------------
class Model(nn.Module):
    def __init__(self, cache_dir):
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.scale = 2.0
        self.table = {"shift": 1.0}
        self.cfg = types.SimpleNamespace(mult=3.0)
        self.act = torch.tanh
        self.factors = [1.5]
        self.flags = {"on": True}
        self.cached = graphex.inference.cache_compile(self._forward, cache_dir=cache_dir)

    def helper(self, y):
        return bump(y) + 1

    def _forward(self, x):
        y = self.proj(x) * self.scale * self.cfg.mult * SCALE * self.factors[0] + self.table["shift"]
        y = y * (3.0 if "extra" in self.flags else 1.0) * (0.5 if "on" in self.flags else 1.0)  # a key's presence
        return self.act(self.helper(y))


def _other_helper(self, y):
    return y - 1


def bump(y):
    return y * 1.25


_BUMP_CODE = bump.__code__


CHANGES = {
    "plain attribute": lambda m: setattr(m, "scale", 5.0),
    "submodule replaced": lambda m: setattr(m, "proj", nn.Linear(6, 6)),
    "parameter replaced": lambda m: setattr(m.proj, "weight", nn.Parameter(torch.randn(6, 6))),
    "function stored on the module": lambda m: setattr(m, "act", torch.sigmoid),
    "dict value": lambda m: m.table.__setitem__("shift", -4.0),
    "config object": lambda m: setattr(m.cfg, "mult", 0.25),
    "global": lambda m: setattr(sys.modules[__name__], "SCALE", 7.0),
    "forward hook added": lambda m: m.proj.register_forward_hook(lambda mod, args, out: out * 10),
    "dict key added": lambda m: m.flags.__setitem__("extra", None),  # torch 2.11 guards absence as invert=True
    "dict key removed": lambda m: m.flags.pop("on"),
    "list item": lambda m: m.factors.__setitem__(0, -2.0),
    "method assigned to the class": lambda m: setattr(Model, "helper", _other_helper),
    "function's code replaced": lambda m: setattr(bump, "__code__", (lambda y: y * 0.5).__code__),
}


@pytest.fixture(autouse=True)
def _restore_scale():
    helper = Model.helper
    yield
    global SCALE
    SCALE = 2.0
    Model.helper = helper
    bump.__code__ = _BUMP_CODE


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_after_the_first_call_is_seen(tmp_path, change):
    torch.manual_seed(0)
    m = Model(str(tmp_path))
    x = torch.randn(4, 6)
    with torch.no_grad():
        assert torch.equal(m.cached(x), m._forward(x))
        assert torch.equal(m.cached(x), m._forward(x))  # the second call takes the watched fast path
        CHANGES[change](m)
        for _ in range(2):
            out, ref = m.cached(x), m._forward(x)
            assert torch.equal(out, ref), f"{change}: stale result after the change"


def test_changing_back_finds_the_first_entry_again(tmp_path):
    torch.manual_seed(0)
    m = Model(str(tmp_path))
    x = torch.randn(4, 6)
    with torch.no_grad():
        m.cached(x)
        m.scale = 5.0
        m.cached(x)
        m.scale = 2.0
        assert torch.equal(m.cached(x), m._forward(x))
    assert m.cached.stats["compiles"] == 2, m.cached.stats


def test_the_check_per_call_is_one_generated_function(tmp_path):
    """Note [One function checks the guards and binds the inputs]: the steady call runs it and the engine."""
    m = Model(str(tmp_path))
    x = torch.randn(4, 6)
    with torch.no_grad():
        m.cached(x)
        m.cached(x)
    (loaded,) = [entry for entries in m.cached._by_call.values() for entry in entries]
    assert loaded.bind is not None and loaded.guard_set.count > 10
    assert "L['func']" not in loaded.guard_set.source  # sources are compiled to attribute reads, not evaluated
    # Note [A watched dict proves its guards still hold]: after a full check the watch holds, and the fast path
    # checks only the few guards no dict version covers
    assert loaded.guard_set.watch.unchanged() and loaded.guard_set.always < loaded.guard_set.count / 4
    with torch.no_grad():
        assert loaded.bind([x], m.cached._func) is not None
        m.scale = 9.0
        assert loaded.bind([x], m.cached._func) is None
        m.scale = 2.0
    assert loaded.bind([x], m.cached._func) is None  # grad mode is part of the global state the trace ran in


# -- files that are not the user's own ----------------------------------------------------------------------------
def _compiled_entry(cache_dir):
    m = Model(str(cache_dir))
    x = torch.randn(4, 6)
    with torch.no_grad():
        m.cached(x)
    (path,) = [os.path.join(cache_dir, f) for f in os.listdir(cache_dir) if f.endswith(".gxc")]
    return path, x


def _fresh_model_run(cache_dir, x):
    m = Model(str(cache_dir))
    with torch.no_grad():
        out = m.cached(x)
        assert torch.equal(out, m._forward(x))
    return m.cached.stats


def test_entries_are_written_private(tmp_path):
    cache = tmp_path / "cache"
    path, _ = _compiled_entry(cache)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)
    assert os.stat(cache).st_mode & 0o077 == 0


@pytest.mark.parametrize("planted", ["other owner", "group writable", "directory writable by others", "symlink"])
def test_a_planted_entry_is_refused(tmp_path, planted):
    cache = tmp_path / "cache"
    path, x = _compiled_entry(cache)
    assert _fresh_model_run(cache, x)["hits"] == 1  # the user's own entry loads
    if planted == "other owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the file another owner")  # CI runs as root
        os.chown(path, 12345, 12345)
    elif planted == "group writable":
        os.chmod(path, 0o664)
    elif planted == "directory writable by others":
        os.chmod(cache, 0o777)
    else:
        target = tmp_path / "elsewhere.gxc"
        os.replace(path, target)
        os.symlink(target, path)
    with pytest.warns(UserWarning, match="refused"):
        stats = _fresh_model_run(cache, x)
    assert stats["hits"] == 0 and stats["compiles"] == 1, stats


def test_a_guard_record_that_is_not_an_access_path_is_never_run(tmp_path):
    """A forged record (valid checksum, the user's own file) with code in its source is refused, not run."""
    cache = tmp_path / "cache"
    path, x = _compiled_entry(cache)
    marker = tmp_path / "ran"
    entry = entry_mod.read_entry(path)
    entry.header["dynamo_guards"].insert(0, {"kind": "type", "expect": ["builtins", "int"],
                                             "source": f"__import__('pathlib').Path({str(marker)!r}).touch()"})
    entry_mod.write_entry(path, entry)
    stats = _fresh_model_run(cache, x)
    assert not marker.exists()
    assert stats["hits"] == 0 and stats["compiles"] == 1, stats


def test_threads_calling_while_the_state_changes_see_the_old_or_the_new_value(tmp_path):
    """Note [One function checks the guards and binds the inputs]: the watch and the parameters are published
    together, so a thread never runs one state's program with another state's parameters."""
    import threading

    torch.manual_seed(0)
    m = Model(str(tmp_path))
    x = torch.randn(4, 6)
    old_proj = m.proj
    new_proj = nn.Linear(6, 6)
    with torch.no_grad():
        m.cached(x)
        expected_old = m._forward(x)
        m.proj = new_proj
        expected_new = m._forward(x)
        m.proj = old_proj
    bad, stop = [], threading.Event()

    def worker():
        with torch.no_grad():
            while not stop.is_set():
                out = m.cached(x)
                if not (torch.equal(out, expected_old) or torch.equal(out, expected_new)):
                    bad.append(out)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(200):
        m.proj = new_proj if i % 2 == 0 else old_proj
    m.proj = new_proj
    stop.set()
    for t in threads:
        t.join()
    assert not bad, f"{len(bad)} results matched neither state"
    with torch.no_grad():
        assert torch.equal(m.cached(x), expected_new)


# -- cases found by trying to break it (a user's scripts, not the author's) ---------------------------------------
class _Small(nn.Module):
    def __init__(self, cache_dir, forward, **kw):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.order = collections.OrderedDict([("a", 2.0), ("b", 3.0)])
        self.log = []
        self.z = 0.0
        self._impl = forward
        self.cached = graphex.inference.cache_compile(self._forward, cache_dir=cache_dir, **kw)

    def _forward(self, *args):
        return self._impl(self, *args)


def _env_flag(m, x):
    return x * 2 if os.environ.get("GRAPHEX_TEST_FLAG") == "1" else x - 1


BROKEN_BEFORE = {  # name: (forward, change after the first call)
    "OrderedDict.move_to_end": (lambda m, x: x * list(m.order.values())[0] - list(m.order.values())[1],
                                lambda m: m.order.move_to_end("a")),
    "0.0 -> -0.0": (lambda m, x: x * math.copysign(1.0, m.z), lambda m: setattr(m, "z", -0.0)),
    "nn.Linear.forward patched": (lambda m, x: m.lin(x),
                                  lambda m: setattr(nn.Linear, "forward", lambda s, x: F.linear(x, s.weight) * 2)),
    "global forward hook": (lambda m, x: m.lin(x),
                            lambda m: _HOOKS.append(torch.nn.modules.module.register_module_forward_hook(
                                lambda mod, args, out: out * 10))),
    "environment variable": (_env_flag, lambda m: os.environ.__setitem__("GRAPHEX_TEST_FLAG", "1")),
    "list appended to by forward": (lambda m, x: (m.log.append(1), x * len(m.log))[1], lambda m: None),
}
_HOOKS: list = []


@pytest.fixture
def _restore_torch():
    forward = nn.Linear.forward
    yield
    nn.Linear.forward = forward
    while _HOOKS:
        _HOOKS.pop().remove()
    os.environ.pop("GRAPHEX_TEST_FLAG", None)


@pytest.mark.parametrize("case", list(BROKEN_BEFORE))
def test_cases_that_were_stale_are_not(tmp_path, case, _restore_torch):
    forward, change = BROKEN_BEFORE[case]
    torch.manual_seed(0)
    m = _Small(str(tmp_path), forward)
    x = torch.randn(2, 3)
    with torch.no_grad():
        if case == "list appended to by forward":  # each call appends, as eager does, and sees the new length
            for n in range(1, 5):
                assert torch.equal(m.cached(x), x * n) and len(m.log) == n
            return
        for _ in range(2):
            assert torch.equal(m.cached(x), m._forward(x))
        change(m)
        for _ in range(2):
            assert torch.equal(m.cached(x), m._forward(x)), f"{case}: stale"


def test_a_size_returned_with_dynamic_shapes_is_not_frozen(tmp_path):
    m = _Small(str(tmp_path), lambda m, x: (x.sum(0), x.shape[0]), dynamic=True)
    with torch.no_grad():
        for n in (3, 5, 7):
            out, ref = m.cached(torch.ones(n, 3)), m._forward(torch.ones(n, 3))
            assert out[1] == ref[1] == n and torch.equal(out[0], ref[0])


def test_an_unhashable_argument_is_guarded_not_hashed(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class Cfg:
        k: float = 2.0

    m = _Small(str(tmp_path), lambda m, x, cfg: x * cfg.k)
    x = torch.ones(2)
    with torch.no_grad():
        assert torch.equal(m.cached(x, Cfg()), x * 2)
        assert torch.equal(m.cached(x, Cfg(k=3.0)), x * 3)


@pytest.mark.parametrize("forged", ["code", "syntax", "bad constant"])
def test_a_forged_entry_never_runs_its_text_and_is_refused_where_it_is_read(tmp_path, forged):
    cache = tmp_path / "cache"
    path, x = _compiled_entry(cache)
    marker = tmp_path / "ran"
    entry = entry_mod.read_entry(path)
    if forged == "code":
        entry.header["guards"] = f"__import__('pathlib').Path({str(marker)!r}).touch() is None"
    elif forged == "syntax":
        entry.header["guards"] = "((("
    else:
        entry.header["dynamo_guards"].insert(0, {"kind": "equals", "source": "L['func'].__self__.scale",
                                                 "expect": ["dtype", "no_such_dtype"]})
    entry_mod.write_entry(path, entry)
    stats = _fresh_model_run(cache, x)
    assert not marker.exists()
    if forged == "bad constant":
        assert stats["hits"] == 0 and stats["compiles"] == 1, stats
    else:  # the header's shape-guard text is ShapeEnv's, for people (graphex inspect): nothing reads or runs it; the
        # guards checked are the program's typed ones (Note [One binder]; forged: test_cache_shapes.py)
        assert stats["hits"] == 1 and stats["compiles"] == 0, stats


def test_a_hard_link_to_an_entry_is_refused(tmp_path):
    cache = tmp_path / "cache"
    path, x = _compiled_entry(cache)
    os.link(path, tmp_path / "other-link.gxc")
    with pytest.warns(UserWarning, match="hard links"):
        stats = _fresh_model_run(cache, x)
    assert stats["hits"] == 0, stats


_UNSET = object()
_MODE = contextvars.ContextVar("graphex_test_mode", default=_UNSET)


def _reads_mode(x):
    v = _MODE.get()
    return x.relu() if v is _UNSET else x * v


@_TRACES_CONTEXTVAR
def test_a_contextvar_set_after_the_first_call_is_seen(tmp_path):
    """Note [A ContextVar is read by its get()]: get() is read again on every call (set() changes no dict the
    fast path watches), and the sentinel default is found by its module global (cached, not refused)."""
    fn = graphex.inference.cache_compile(_reads_mode, cache_dir=str(tmp_path))
    x = torch.randn(5)
    for value in (_UNSET, 3.0, 3.0, -2.0, _UNSET):
        token = None if value is _UNSET else _MODE.set(value)
        try:
            for _ in range(2):  # the second call takes the watched fast path
                assert torch.equal(fn(x), _reads_mode(x)), f"stale result with the ContextVar at {value}"
        finally:
            if token is not None:
                _MODE.reset(token)
    assert fn.stats["compiles"] == fn.stats["writes"] == 3, fn.stats  # unset, 3.0, -2.0 (unset again: kept in memory)


def test_source_paths_parse_to_steps_and_resolve_without_evaluating():
    """The access paths Dynamo's guards name (2.11-2.15 spellings) parse to typed steps and resolve; a path that
    calls anything else is NotCheckable (never evaluated)."""
    import types

    from graphex.inference.guard_sources import NotCheckable, parse_source, resolve

    class Config:
        def __getattr__(self, name):  # a class's own __getattr__: object.__getattribute__ goes past it
            raise AssertionError("not read through __getattr__")

    cfg = Config()
    cfg.__dict__["mode"] = "eager"
    local = {"func": types.SimpleNamespace(cfg=cfg, table={"k": [3, 4]})}
    cases = {
        "L['func'].cfg.mode": "eager",
        "object.__getattribute__(L['func'].cfg, '__dict__')['mode']": "eager",  # torch 2.12's GenericAttrSource
        "L['func'].table['k'][-1]": 4,
        "dict.__getitem__(L['func'].table, 'k')[0]": 3,
        "list(dict.keys(L['func'].table))[0]": "k",
        "type(L['func'].cfg)": Config,
    }
    for source, want in cases.items():
        assert resolve(parse_source(source), local, {}) == want, source
    # torch 2.15's ContextVarGetSource: `x.get()` / `x.get(default)` reads a ContextVar, and only a ContextVar
    local["func"].var = contextvars.ContextVar("graphex_parse_test")
    assert parse_source("L['func'].var.get(7)")[-1] == ("cv_get", (True, 7))
    assert resolve(parse_source("L['func'].var.get(7)"), local, {}) == 7
    assert resolve(parse_source("L['func'].var.get()"), local, {}) is guard_sources._MISSING  # unset: LookupError
    token = local["func"].var.set("on")
    assert resolve(parse_source("L['func'].var.get()"), local, {}) == "on"
    local["func"].var.reset(token)
    assert resolve(parse_source("L['func'].table.get('k')"), local, {}) is guard_sources._MISSING  # a dict's get: not called
    assert fingerprints.identity(local["func"].var) == ["contextvar", "graphex_parse_test"]
    assert fingerprints.identity(_UNSET) == ["global", __name__, "_UNSET"]  # Note [A sentinel is the module global ...]
    with pytest.raises(NotCheckable):
        fingerprints.identity(object())  # a bare object no module global holds has no portable identity
    for bad in ("object.__getattribute__(L['func'], name)", "getattr(L['func'], 'cfg')",
                "object.__setattr__(L['func'], 'cfg', 1)", "L['func'].cfg.mode()", "L['func'].var.get(L['x'])",
                "L['func'].var.get(default=1)"):
        with pytest.raises(NotCheckable):
            parse_source(bad)


def test_the_uncached_path_sees_a_hook_added_after_the_first_call(tmp_path):
    """Note [The uncached path sees a new hook]: a call cache_compile cannot cache (here: with grad enabled and
    parameters that require grad) runs through torch.compile, whose guards by default skip modules' hooks dicts."""
    torch.manual_seed(0)
    m, x = Model(str(tmp_path)), torch.randn(4, 6)
    with pytest.warns(UserWarning, match="without the cache"):
        assert torch.equal(m.cached(x), m._forward(x))
    assert torch.equal(m.cached(x), m._forward(x))
    m.proj.register_forward_hook(lambda mod, args, out: out * 10)
    for _ in range(2):
        assert torch.equal(m.cached(x), m._forward(x)), "stale result after a forward hook was added"
    assert m.cached.stats["writes"] == 0, m.cached.stats


def test_a_class_fingerprint_follows_each_change_across_checks_and_ignores_none_within_one():
    """Note [A code object's digest is computed once], Note [One check reads each class body once]: the memos never
    hide a change made between two checks, and two functions with equal code but other names stay apart."""
    from graphex.inference.fingerprints import one_check, type_name

    class Base:
        def f(self):
            return 1

    class Child(Base):
        pass

    first = type_name(Child)
    with one_check():
        assert type_name(Child) == first and type_name(Base)[:2] == ["test_cache_guards", Base.__qualname__]

    def f(self):
        return 2

    Base.f = f  # patched between two checks: the subclass's fingerprint must change
    assert type_name(Child) != first
    with one_check():
        assert type_name(Child) == type_name(Child) != first

    def g(self):
        return 2

    Base.f = g  # same code, another name: still another fingerprint
    assert len({tuple(type_name(Child)), tuple(first)}) == 2
    with one_check():
        patched = type_name(Child)
    Base.f = f
    assert type_name(Child) != patched


def test_a_copy_of_an_object_passed_in_is_no_change_to_its_class(tmp_path):
    """copy.deepcopy writes copyreg's `__slotnames__` into the class: not a new version of it (found by a helper: a
    deep-copied StaticCache made the next call miss and compile again)."""
    import copy

    class Settings:
        __slots__ = ("scale",)

        def __init__(self):
            self.scale = 2.0

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, settings):
            return self.lin(x) * settings.scale

    model, settings, x = Scaled().eval(), Settings(), torch.randn(2, 4)
    fn = graphex.inference.cache_compile(model.forward, cache_dir=tmp_path)
    with torch.no_grad():
        assert torch.equal(fn(x, settings), model(x, settings))
        copy.deepcopy(settings)
        assert "__slotnames__" in vars(Settings)
        assert torch.equal(fn(x, settings), model(x, settings))
        settings.scale = 3.0  # still seen
        assert torch.equal(fn(x, settings), model(x, settings))
    assert fn.stats["compiles"] == 2, fn.stats


class _Holder:
    pass


_WRITTEN: dict = {}
_GLOBAL_FLAG = False


def _set_global_flag(x):
    global _GLOBAL_FLAG
    _GLOBAL_FLAG = True
    return x + 1


UNREAD_SIDE_EFFECTS = {  # name: (forward, reset the state, the state after a call as eager leaves it)
    "attribute set to a constant": (lambda m, x: (setattr(m, "ran", True), x + 1)[1],
                                    lambda m: setattr(m, "ran", False), lambda m: m.ran),
    "new attribute": (lambda m, x: (setattr(m, "seen", 1), x + 1)[1],
                      lambda m: m.__dict__.pop("seen", None), lambda m: getattr(m, "seen", None) == 1),
    "attribute of a held object": (lambda m, x: (setattr(m.holder, "ran", True), x + 1)[1],
                                   lambda m: setattr(m.holder, "ran", False), lambda m: m.holder.ran),
    "list appended to, never read": (lambda m, x: (m.log.append(1), x + 1)[1],
                                     lambda m: m.log.clear(), lambda m: m.log == [1]),
    "dict item set": (lambda m, x: (_WRITTEN.__setitem__("k", 1), x + 1)[1],
                      lambda m: _WRITTEN.clear(), lambda m: _WRITTEN == {"k": 1}),
    "global written": (lambda m, x: _set_global_flag(x),
                       lambda m: globals().__setitem__("_GLOBAL_FLAG", False), lambda m: _GLOBAL_FLAG),
}


@pytest.mark.parametrize("case", list(UNREAD_SIDE_EFFECTS))
def test_a_side_effect_nothing_reads_is_never_dropped_by_a_cache_hit(tmp_path, case):
    """Note [A trace with side effects is not cached]: a side effect no guard reads (an attribute set to a
    constant) was cached before, so a hit (in this process, or a fresh one) ran the graph and dropped it."""
    forward, reset, happened = UNREAD_SIDE_EFFECTS[case]
    m = _Small(str(tmp_path), forward)
    m.holder = _Holder()
    x = torch.randn(2, 3)
    with torch.no_grad():
        for _ in range(3):
            reset(m)
            assert torch.equal(m.cached(x), x + 1)
            assert happened(m), f"{case}: the call did not do what eager does"
    assert m.cached.stats["writes"] == 0 and m.cached.stats["hits"] == 0, m.cached.stats


class _Flag:  # as transformers' CompileableContextVar: set and reset around the work, in every call
    def __init__(self):
        self.on, self.value = False, None


def _set_and_reset(m, x):
    m.flag.on, m.flag.value = True, 3
    y = x * m.flag.value
    m.flag.on, m.flag.value = False, None
    return y


def test_stores_that_leave_each_attribute_as_it_was_are_cached_while_it_is(tmp_path):
    """Note [A trace with side effects is not cached]: stores that end where they began change nothing, so the
    trace is cached, with a check that each attribute still holds that value; set otherwise, eager leaves it reset,
    and so does every call."""
    x = torch.randn(2, 3)
    with torch.no_grad():
        for process in ("first", "second"):  # the second model loads the entry the first one wrote
            m = _Small(str(tmp_path), _set_and_reset)
            m.flag = _Flag()
            for _ in range(3):
                assert torch.equal(m.cached(x), x * 3) and (m.flag.on, m.flag.value) == (False, None)
            want = {"hits": 0, "misses": 1, "compiles": 1, "writes": 1} if process == "first" else \
                {"hits": 1, "misses": 0, "compiles": 0, "writes": 0}
            assert m.cached.stats == want, (process, m.cached.stats)
        m.flag.on = True  # eager's call leaves it False: the entry's check fails, and the trace is not cached
        assert torch.equal(m.cached(x), x * 3) and (m.flag.on, m.flag.value) == (False, None)
        assert m.cached.stats["compiles"] == 1 and m.cached.stats["writes"] == 0, m.cached.stats
        for _ in range(2):
            assert torch.equal(m.cached(x), x * 3) and (m.flag.on, m.flag.value) == (False, None)


def test_a_torch_that_does_not_report_side_effects_caches_nothing(tmp_path, monkeypatch):
    """Note [A trace with side effects is not cached]: when Dynamo's report cannot be read (another torch's
    internals), nothing is cached, rather than assuming there were none (how the check was lost before)."""
    monkeypatch.setattr(compat, "dynamo_side_effects", lambda: None)
    m = _Small(str(tmp_path), lambda m, x: x + 1)
    x = torch.randn(2, 3)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(m.cached(x), x + 1)
    assert m.cached.stats["writes"] == 0, m.cached.stats


def test_export_says_which_side_effects_its_program_leaves_out(tmp_path):
    class Warms(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.warmed_up = nn.Linear(3, 3), False

        def forward(self, x):
            self.warmed_up = True
            return self.lin(x)

    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphex.export(Warms().eval(), (torch.randn(2, 3),), str(tmp_path / "warms"))
    said = [str(w.message) for w in caught if "does not do what" in str(w.message)]
    assert said and "(self.warmed_up)" in said[0], [str(w.message) for w in caught]


def _append_double(x, out):
    out.append(x * 2)
    return x + 1


def _set_key(x, d):
    d["k"] = 1
    return x + 1


def _append_in_tuple(x, pair):
    pair[0].append(x * 2)
    return x + 1


def _append_constant(out):  # no tensor op: Dynamo runs it without a graph
    out.append(1)
    return len(out)


@pytest.mark.parametrize("case", ["list argument", "dict argument", "list inside a tuple", "no graph"])
def test_a_call_that_changes_its_list_or_dict_arguments_changes_the_callers(tmp_path, case):
    """Note [A call that changes its list or dict arguments runs on them]: the flat call rebuilt them, so the
    change was made to a copy on every call, the first included (a helper's find)."""
    x = torch.randn(2)
    fn, make, check = {
        "list argument": (_append_double, lambda: ([],), lambda c: len(c[0]) == 1 and torch.equal(c[0][0], x * 2)),
        "dict argument": (_set_key, lambda: ({},), lambda c: c[0] == {"k": 1}),
        "list inside a tuple": (_append_in_tuple, lambda: (([], 0),),
                                lambda c: len(c[0][0]) == 1 and torch.equal(c[0][0][0], x * 2)),
        "no graph": (_append_constant, lambda: ([],), lambda c: c[0] == [1]),
    }[case]
    cached = graphex.inference.cache_compile(fn, cache_dir=str(tmp_path))
    with torch.no_grad():
        for _ in range(3):
            containers = make()
            got = cached(*containers) if case == "no graph" else cached(x, *containers)
            want_containers = make()
            want = fn(*want_containers) if case == "no graph" else fn(x, *want_containers)
            assert (got == want) if case == "no graph" else torch.equal(got, want)
            assert check(containers), (case, containers)
    assert cached.stats["writes"] == 0, cached.stats


def test_a_structured_call_that_changes_nothing_is_still_cached(tmp_path):
    cached = graphex.inference.cache_compile(lambda x, pair: x * pair[0] + pair[1]["b"], cache_dir=str(tmp_path))
    x = torch.randn(3)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(cached(x, [2.0, {"b": x}]), x * 2.0 + x)
    assert cached.stats["writes"] == 1 and cached.stats["compiles"] == 1, cached.stats


class _Resets(nn.Module):
    mode = False  # a class attribute the forward shadows

    def __init__(self, kind):
        super().__init__()
        self.kind, self.log = kind, []

    def forward(self, x):
        if self.kind == "list":
            self.log = []  # a new list on every call: equal to the old one, not the same object
        else:
            self.mode = False  # makes an instance attribute, whatever the class says
        return x + 1


def test_stores_that_are_not_no_ops_though_they_look_it_are_not_cached(tmp_path):
    x = torch.randn(2)
    with torch.no_grad():
        m = _Resets("list")
        cached = graphex.inference.cache_compile(m.forward, cache_dir=str(tmp_path / "list"))
        cached(x)
        first = m.log
        cached(x)
        assert m.log is not first  # eager made a new list
        m = _Resets("shadow")
        cached = graphex.inference.cache_compile(m.forward, cache_dir=str(tmp_path / "shadow"))
        cached(x)
        assert "mode" in vars(m)
        del m.mode
        _Resets.mode = True
        try:
            cached(x)
            assert vars(m).get("mode") is False and m.mode is False
        finally:
            _Resets.mode = False


def test_a_call_that_changes_its_list_argument_keeps_serving_new_shapes(tmp_path):
    """Past Dynamo's recompile limit (8) the path on the real arguments starts a fresh code object, as the flat
    path does (Note [A fresh code object per cold compile])."""
    cached = graphex.inference.cache_compile(_append_double, cache_dir=str(tmp_path))
    with torch.no_grad():
        for n in range(1, 13):
            out: list = []
            x = torch.randn(n)
            assert torch.equal(cached(x, out), x + 1) and len(out) == 1 and torch.equal(out[0], x * 2)


def _same_list(x, a, b):
    return x + 1 if a is b else x - 1


def test_one_list_passed_twice_is_one_list_to_the_function(tmp_path):
    """The flat call rebuilt each list, so `a is b` was false for f(x, l, l), and that program was cached and replayed
    for every later call (a helper's find); a call sharing a container runs on the real arguments."""
    cached = graphex.inference.cache_compile(_same_list, cache_dir=str(tmp_path))
    x, shared = torch.zeros(2), [1]
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(cached(x, shared, shared), x + 1)
            assert torch.equal(cached(x, [1], [1]), x - 1)
        assert torch.equal(cached(x, shared, shared), x + 1)


class _CopyingDict(dict):
    """A mapping whose own item differs from its copy's: `dict(d)['a']` is 1, `d['a']` is 2."""

    def __getitem__(self, key):
        return 2


class _MetaWithOwnDict(type):
    @property
    def __dict__(cls):  # what `type(x).__dict__` reads on this metaclass's classes: not a mappingproxy
        return _CopyingDict(a=1)


@pytest.mark.parametrize("kind", ["class dict", "a metaclass's own __dict__"])
def test_a_class_dicts_item_reads_what_its_copy_would(kind):
    """Note [A class dict's item is read without a copy]: Dynamo's `dict(type(x).__dict__)['a']`, read by the generated
    code from the mappingproxy itself where it is one, and from the copy otherwise: the value Dynamo's source names."""
    from graphex.inference.guards import _Emitter
    from graphex.inference.pins import _Pins

    Plain = type("Plain", (), {"a": 1})
    Odd = _MetaWithOwnDict("Odd", (), {})
    obj = (Plain if kind == "class dict" else Odd)()
    path = guard_sources.parse_source("dict(type(L['flat_args'][0]).__dict__)['a']")
    held: list = []
    emitter = _Emitter(held, _Pins(), {})
    v = emitter.var(path)
    scope = {"H": tuple(held), "flat_args": [obj], "type": type, "dict": dict}
    exec("\n".join(emitter.lines), scope)  # the generated reads, as the guard function runs them
    assert scope[v] == guard_sources.resolve(path, {"flat_args": [obj]}, {}) == 1
    assert ("if type(" in "\n".join(emitter.lines)) and "dict(v" in "\n".join(emitter.lines)
