"""Many shapes and positions: dynamic programs on the CPU use no capture slot, and cache_compile keeps serving
new shapes past Dynamo's recompile limit. Everything is compared bitwise with eager."""

from __future__ import annotations

import warnings

import torch

import graphex
from conftest import assert_same, compile_graphex, engine_runs, newest_capture


class Decoder(torch.nn.Module):
    """One decode step at an int position: writes the KV cache in place, attends over positions 0..pos."""

    def __init__(self, dim: int = 8, max_positions: int = 320) -> None:
        super().__init__()
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * dim)
        self.register_buffer("k_cache", torch.zeros(max_positions, dim))
        self.register_buffer("v_cache", torch.zeros(max_positions, dim))

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        k, v = self.kv(x).chunk(2, dim=-1)
        self.k_cache[pos] = k
        self.v_cache[pos] = v
        keys, values = self.k_cache[: pos + 1], self.v_cache[: pos + 1]
        probs = torch.softmax(self.q(x) @ keys.T, dim=-1)
        return probs @ values


def test_dynamic_decode_of_300_positions_stays_on_the_engine():
    """Note [capture_limit counts device graphs]: every position runs the one CPU program, none runs eagerly."""
    torch.manual_seed(0)
    eager, compiled_model = Decoder(), Decoder()
    compiled_model.load_state_dict(eager.state_dict())
    step = compile_graphex(compiled_model, dynamic=True)
    xs = torch.randn(300, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for pos in range(3):  # positions 0 and 1 are specialized (Dynamo never makes 0/1 symbolic)
            assert_same(step(xs[pos], pos), eager(xs[pos], pos), f"position {pos}")
        graph = newest_capture()
        assert graph.dynamic
        runs_before, total_before = graph.executor.run_count, engine_runs()
        for pos in range(3, 300):
            assert_same(step(xs[pos], pos), eager(xs[pos], pos), f"position {pos}")
    assert not [w for w in caught if "capture_limit" in str(w.message)]
    assert graph.executor.run_count - runs_before == 297  # every position on the engine, none eagerly
    assert engine_runs() - total_before == 297
    assert_same(compiled_model.k_cache, eager.k_cache)


def test_cache_compile_serves_12_batch_sizes_past_dynamos_recompile_limit(tmp_path):
    """torch._dynamo.config.recompile_limit is 8 per code object; each cold compile traces a fresh one."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU())
    cached = graphex.inference.cache_compile(model.forward, dynamic=False, cache_dir=str(tmp_path))
    assert torch._dynamo.config.recompile_limit < 12
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in range(1, 13):
            x = torch.randn(batch, 6)
            assert_same(cached(x), model(x), f"batch {batch}")
    assert cached.stats["compiles"] == 12 and cached.stats["writes"] == 12
    assert not [w for w in caught if "recompile" in str(w.message).lower()]


def test_uncached_autograd_path_keeps_serving_new_shapes_with_one_warning(tmp_path):
    model = torch.nn.Linear(4, 4)
    cached = graphex.inference.cache_compile(model.forward, cache_dir=str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in range(1, 11):  # grad mode on, parameters require grad: plain torch.compile, no entry
            x = torch.randn(batch, 4)
            out = cached(x)
            assert_same(out, model(x), f"batch {batch}")
            assert out.requires_grad
    limit = [w for w in caught if "recompile limit" in str(w.message)]
    assert len(limit) == 1, [str(w.message) for w in caught]


def test_plain_and_structured_calls_of_one_function_each_find_their_entry(tmp_path):
    """Note [A plain call skips pytree]: positional tensors and numbers take the fast key; a call with keyword
    arguments or a None takes pytree's. Each finds its own entry, results stay bitwise, nothing recompiles."""

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, scale: float = 1.0, bias: torch.Tensor | None = None) -> torch.Tensor:
            y = self.fc(x) * scale
            return y if bias is None else y + bias

    torch.manual_seed(3)
    model = Step().eval()
    cached = graphex.inference.cache_compile(model.forward, dynamic=False, cache_dir=str(tmp_path))
    x, b = torch.randn(2, 4), torch.randn(4)
    calls = [((x,), {}), ((x, 2.0), {}), ((x, 2.0, b), {}), ((x,), {"scale": 2.0}), ((x, 1.0, None), {}),
             ((x, 3.0), {})]
    with torch.no_grad():
        for _ in range(3):
            for args, kwargs in calls:
                assert_same(cached(*args, **kwargs), model(*args, **kwargs), f"{len(args)} args, {kwargs}")
    assert cached.stats["compiles"] == len(calls), cached.stats


class _Settings(__import__("collections").abc.Mapping):
    """A Mapping: `in` runs Mapping.__contains__, whose code lives in Python's frozen _collections_abc."""

    def __init__(self, **values: float) -> None:
        self._values = dict(values)

    def __getitem__(self, key: str) -> float:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


_SETTINGS = _Settings(scale=3.0)


class _UsesMapping(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * _SETTINGS["scale"] if "scale" in _SETTINGS else y


def test_code_of_pythons_frozen_modules_does_not_stop_caching(tmp_path):
    """transformers' models trace through Mapping.__contains__ (<frozen _collections_abc>): its source is the
    interpreter's, keyed by the Python version, so the entry is written and a fresh CachedFunction loads it."""
    torch.manual_seed(4)
    model = _UsesMapping().eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        first = graphex.inference.cache_compile(model.forward, cache_dir=str(tmp_path))
        assert_same(first(x), model(x))
        assert first.stats["writes"] == 1, first.stats
        again = graphex.inference.cache_compile(model.forward, cache_dir=str(tmp_path))
        assert_same(again(x), model(x))
        assert again.stats["hits"] == 1 and again.stats["compiles"] == 0, again.stats


def test_a_dataclass_built_in_the_step_is_checked_through_its_module_file(tmp_path):
    """Note [A dataclass method is its class's source]: transformers' ModelOutput dataclasses run an __init__ that
    @dataclass wrote as text ("<string>"); the entry is written and depends on the file defining the class."""
    import importlib.util

    from graphex.inference.entry import read_header

    source = tmp_path / "gx_dc_outputs.py"
    source.write_text("import dataclasses, torch\n\n@dataclasses.dataclass\nclass Out:\n    y: torch.Tensor\n"
                      "    scale: float = 2.0\n")
    spec = importlib.util.spec_from_file_location("gx_dc_outputs", source)
    module = importlib.util.module_from_spec(spec)
    __import__("sys").modules["gx_dc_outputs"] = module
    spec.loader.exec_module(module)

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = module.Out(self.fc(x))
            return out.y * out.scale

    torch.manual_seed(5)
    model = Step().eval()
    x = torch.randn(2, 4)
    cache_dir = tmp_path / "cache"
    with torch.no_grad():
        cached = graphex.inference.cache_compile(model.forward, cache_dir=str(cache_dir))
        assert_same(cached(x), model(x))
    assert cached.stats["writes"] == 1, cached.stats
    (entry,) = cache_dir.glob("*.gxc")
    files = [s["file"] for s in read_header(str(entry))["sources"]]
    assert any(f.endswith("gx_dc_outputs.py") for f in files), files


def test_a_dynamic_entry_checks_its_shape_guards_in_the_one_binder(tmp_path):
    """Note [One binder]: a cache entry traced with a branch on its size replays only where the branch holds; the
    guard is the program's typed one, checked in C++ (what graphex-run checks), and a call that breaks it is another
    entry's. An argument returned as it is comes back as the caller's own object."""
    def branch(x, y):
        z = x * 2 if x.shape[0] > 4 else x - 1
        return z + y.sum(), y

    cached = graphex.inference.cache_compile(branch, dynamic=True, cache_dir=str(tmp_path))
    with torch.no_grad():
        for rows in (8, 6, 3, 2, 9):
            x, y = torch.randn(rows, 3), torch.randn(rows)
            out, passed = cached(x, y)
            assert_same(out, branch(x, y)[0], f"{rows} rows")
            assert passed is y, "the argument passed through is not the caller's tensor"
    assert cached.stats["compiles"] == 2, cached.stats  # one entry for > 4 rows, one for the rest


def test_a_shape_guard_the_runtime_cannot_check_is_not_cached(tmp_path, monkeypatch):
    """An entry whose guards would go unchecked would replay a program traced for other shapes: it is not written,
    the call runs compiled, and the warning says why and what to do."""
    from graphex.inference import shape_guards

    def unsupported(text, bindings=None):
        raise shape_guards.Unsupported("shape guard 'sqrt(args[0].size(0)) > 2': cannot evaluate 'sqrt(...)'")

    monkeypatch.setattr(shape_guards, "from_expression", unsupported)

    def branch(x):
        return x * 2 if x.shape[0] > 4 else x - 1

    cached = graphex.inference.cache_compile(branch, dynamic=True, cache_dir=str(tmp_path))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (8, 3):
            x = torch.randn(rows, 3)
            assert_same(cached(x), branch(x))
    assert cached.stats["writes"] == 0 and not list(tmp_path.glob("**/*.gxc")), cached.stats
    assert any("cannot be cached" in str(w.message) and "dynamic=False" in str(w.message) for w in caught), \
        [str(w.message) for w in caught]


def test_an_entry_whose_typed_shape_guards_are_forged_is_refused_at_load(tmp_path):
    """The guards a cache entry is checked by are the program's typed ones, verified by the C++ loader before any
    is evaluated: a forged one (reading an input the program lacks) makes the entry unusable, never a wrong hit."""
    from graphex.inference import entry as entry_mod, shape_guards
    from graphex.program import encode
    from graphex.runtime import live_graphs

    def branch(x):
        return x * 2 if x.shape[0] > 4 else x - 1

    x = torch.randn(8, 3)
    cached = graphex.inference.cache_compile(branch, dynamic=True, cache_dir=str(tmp_path))
    with torch.no_grad():
        assert_same(cached(x), branch(x))
    (path,) = [str(p) for p in tmp_path.glob("**/*.gxc")]
    entry = entry_mod.read_entry(path)
    lowered = live_graphs()[-1].lowered
    forged = shape_guards.ShapeGuard((shape_guards.GuardOp(shape_guards._K.Input, input=99),), "forged")
    entry.program = encode.encode(lowered.program, lowered.constants, bindings=entry.bindings, leaves=entry.leaves,
                                  tree=entry.header["outputs"]["spec"], guards=[forged])
    entry_mod.write_entry(path, entry)

    fresh = graphex.inference.cache_compile(branch, dynamic=True, cache_dir=str(tmp_path))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same(fresh(x), branch(x))
    assert fresh.stats["hits"] == 0 and fresh.stats["compiles"] == 1, fresh.stats
    assert any("reads program input 99" in str(w.message) for w in caught), [str(w.message) for w in caught]


class _Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return self.conv(x)


def test_a_parameter_of_another_layout_gets_its_own_entry_and_the_miss_names_it(tmp_path, monkeypatch, capfd):
    """The arguments' signature is in the key, the parameters' is checked by the program: a channels_last weight
    misses the contiguous weight's entry, and the miss says which input differs (it named two equal argument
    signatures before); the two entries sit side by side instead of replacing each other (a helper's find)."""
    monkeypatch.setenv("GRAPHEX_LOG", "1")
    x = torch.randn(1, 3, 8, 8)
    stats = []
    for i in range(4):
        m = _Conv().eval()
        if i % 2:
            m.conv.weight.data = m.conv.weight.data.to(memory_format=torch.channels_last)
        f = graphex.inference.cache_compile(m.forward, cache_dir=str(tmp_path))
        with torch.no_grad():
            assert_same(f(x), m(x))
        stats.append(dict(f.stats))
    assert [s["compiles"] for s in stats] == [1, 1, 0, 0] and [s["hits"] for s in stats] == [0, 0, 1, 1], stats
    assert len(list(tmp_path.glob("*.gxc"))) == 2
    err = capfd.readouterr().err
    assert "input 0 ('func.conv.weight'): expected float32[8, 3, 3, 3] strides [27, 9, 3, 1]" in err, err
    assert "got float32[8, 3, 3, 3] strides [27, 1, 9, 3]" in err, err
