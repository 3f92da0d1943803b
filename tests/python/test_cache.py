"""cache_compile across fresh processes: hits skip Dynamo, every key ingredient invalidates, bad files never crash.

Each run is `cache_driver.py` in a new process on a copy of tests/python/cache_project
(a module whose code spans model.py, helpers.py, config.py and a custom op in ops.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.join(HERE, "cache_project")
DRIVER = os.path.join(HERE, "cache_driver.py")


def run(project: str, cache_dir: str, *flags: str, check: bool = True) -> dict:
    proc = subprocess.run([sys.executable, DRIVER, project, cache_dir, *flags], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "GRAPHEX_LOG": "1"})
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["stderr"] = proc.stderr
    assert report["equal"], "cached result differs from eager"
    return report


def is_hit(r: dict) -> bool:
    """One hit, and Dynamo compiled nothing. (It may be imported all the same: torch imports it at the first call
    of a torch.library.custom_op, which the project has; tests/python/test_cache_import.py checks that a hit
    imports no compiler of its own accord.)"""
    return r["stats"] == {"hits": 1, "misses": 0, "compiles": 0, "writes": 0} and r["dynamo_compiles"] == 0


def is_recompile(r: dict) -> bool:
    return r["stats"]["misses"] == 1 and r["stats"]["compiles"] == 1 and r["dynamo_compiles"] == 1


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A project copy and a cache filled by one cold run."""
    base = tmp_path_factory.mktemp("warm")
    project, cache = str(base / "project"), str(base / "cache")
    shutil.copytree(PROJECT, project)
    cold = run(project, cache)
    assert cold["stats"] == {"hits": 0, "misses": 1, "compiles": 1, "writes": 1}
    assert cold["dynamo_compiles"] == 1
    return project, cache, cold


@pytest.fixture
def copy(warm, tmp_path):
    """A private copy of the warm project and cache, to change one thing in."""
    project, cache, _ = warm
    shutil.copytree(project, tmp_path / "project")
    shutil.copytree(cache, tmp_path / "cache")
    return str(tmp_path / "project"), str(tmp_path / "cache")


def edit(path: str, old: str, new: str) -> None:
    with open(path) as f:
        text = f.read()
    assert old in text, f"{old!r} not in {path}"
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def entries(cache: str) -> list[str]:
    return sorted(n for n in os.listdir(cache) if n.endswith(".gxc"))


def test_warm_process_skips_dynamo_and_matches_eager(warm, tmp_path):
    project, cache, cold = warm
    hit = run(project, cache)
    assert is_hit(hit), hit
    assert "cache hit" in hit["stderr"]
    assert hit["first_call_s"] < cold["first_call_s"] / 5


def test_new_weights_same_code_is_still_a_hit(copy):
    """Weights are bound by name at run time, not stored: other weights, same entry, still eager's result."""
    project, cache = copy
    r = run(project, cache, "--seed", "123")
    assert is_hit(r), r


@pytest.mark.parametrize("change", ["method", "submodule_forward", "helper", "custom_op_fake", "custom_op_schema"])
def test_source_changes_recompile(copy, change):
    project, cache = copy
    path = lambda name: os.path.join(project, name)  # noqa: E731
    if change == "method":
        edit(path("model.py"), "return double(x) * SCALE", "return double(x) * SCALE + 1")
    elif change == "submodule_forward":
        edit(path("model.py"), "return torch.ops.cachetest.shift(self.lin(x), self.eps)",
             "return torch.ops.cachetest.shift(self.lin(x).relu(), self.eps)")
    elif change == "helper":
        edit(path("helpers.py"), "return x * 2", "return x * 3")
    elif change == "custom_op_fake":
        edit(path("ops.py"), "return torch.empty_like(x)", "return x.new_empty(x.shape)")
    elif change == "custom_op_schema":
        edit(path("ops.py"), "s: float) -> torch.Tensor:", "s: float = 0.0) -> torch.Tensor:")
    r = run(project, cache)
    assert is_recompile(r), r
    assert "stale" in r["stderr"]
    assert len(entries(cache)) == 1  # the stale entry was replaced, not duplicated
    assert is_hit(run(project, cache))


def test_a_changed_global_recompiles_beside_the_entry_of_the_old_value(copy):
    """Note [A changed global is another state, not a stale entry]: a global the trace read (config.SCALE; config.py
    itself is never traced) is part of the state an entry fits, as a module attribute's value is: another value
    compiles an entry beside the first, and the old value, back, hits the first again."""
    project, cache = copy
    config = os.path.join(project, "config.py")
    edit(config, "SCALE = 0.5", "SCALE = 0.25")
    r = run(project, cache)
    assert is_recompile(r), r
    assert "global SCALE" in r["stderr"] and "differs in this process" in r["stderr"], r["stderr"][-2000:]
    assert len(entries(cache)) == 2
    assert is_hit(run(project, cache))
    edit(config, "SCALE = 0.25", "SCALE = 0.5")
    assert is_hit(run(project, cache))


@pytest.mark.parametrize("flags", [["--blocks", "3"], ["--dim", "16"], ["--eps", "0.001"],
                                   ["--options", '{"remove_noop_ops": false}'],
                                   ["--version", "graphex=0.0.0-test"], ["--version", "torch=9.9.9"]])
def test_structure_attributes_options_and_versions_recompile(copy, flags):
    project, cache = copy
    r = run(project, cache, *flags)
    assert is_recompile(r), r
    assert len(entries(cache)) == 2  # a different key: a new entry next to the old one
    assert is_hit(run(project, cache, *flags))
    if flags[0] == "--blocks":
        assert is_hit(run(project, cache))  # the old one still serves the old configuration


def test_new_input_signature_compiles_and_adds_an_entry(copy):
    project, cache = copy
    r = run(project, cache, "--batch", "5")
    assert is_recompile(r)
    assert len(entries(cache)) == 2


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip", "foreign", "empty"])
def test_bad_cache_file_is_a_miss_with_one_warning_and_is_replaced(copy, damage):
    project, cache = copy
    (name,) = entries(cache)
    path = os.path.join(cache, name)
    data = open(path, "rb").read()
    bad = {"truncate": data[: len(data) // 2], "garbage": os.urandom(len(data)),
           "flip": data[:100] + bytes([data[100] ^ 0xFF]) + data[101:], "foreign": b"PK\x03\x04 a zip file",
           "empty": b""}[damage]
    open(path, "wb").write(bad)
    r = run(project, cache)
    assert is_recompile(r), r
    warnings = [l for l in r["stderr"].splitlines() if "ignoring" in l and name in l]
    assert len(warnings) >= 1 and "rebuilt" in r["stderr"]
    assert open(path, "rb").read() != bad  # replaced by a valid entry
    if damage == "truncate":
        assert is_hit(run(project, cache))


def test_concurrent_writers_leave_one_valid_entry(warm, tmp_path):
    project, _, _ = warm
    cache = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, DRIVER, project, cache], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    reports = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(r["equal"] for r in reports)
    assert len(entries(cache)) == 1 and not [n for n in os.listdir(cache) if n.startswith(".tmp-")]
    assert is_hit(run(project, cache))


def test_unwritable_or_missing_directory_runs_without_the_cache(warm, tmp_path):
    project, _, _ = warm
    for cache in ("/proc/graphex-cache-test", "/dev/null/cache"):
        r = run(project, cache)
        assert r["stats"]["compiles"] == 1 and r["stats"]["writes"] == 0
        assert "cannot write" in r["stderr"] and "running without the cache" in r["stderr"]


def test_plain_functions_are_supported_and_other_callables_rejected(tmp_path):
    code = textwrap.dedent(f"""
        import torch, graphex
        def f(x, y):
            return (x @ y).relu(), x.shape[0]
        cached = graphex.inference.cache_compile(f, cache_dir={str(tmp_path)!r})
        x, y = torch.randn(2, 3), torch.randn(3, 4)
        with torch.no_grad():
            out = cached(x, y)
        assert torch.equal(out[0], f(x, y)[0]) and out[1] == 2
        try:
            graphex.inference.cache_compile(torch.nn.Linear(2, 2))
        except TypeError as e:
            assert "method" in str(e)
        else:
            raise AssertionError("a module was accepted")
        print(cached.stats)
    """)
    script = tmp_path / "plain.py"  # a file: code typed into `python -c` has no source to check later
    script.write_text(code)
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                              cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'hits': 1" in proc.stdout


def test_cli_lists_and_clears(warm, tmp_path):
    _, cache, _ = warm
    target = str(tmp_path / "c")
    shutil.copytree(cache, target)
    open(os.path.join(target, "broken.gxc"), "wb").write(b"junk")
    ls = subprocess.run([sys.executable, "-m", "graphex", "cache", "ls", target], capture_output=True, text=True)
    assert ls.returncode == 0, ls.stderr
    assert "Model._forward" in ls.stdout and "2 entries" in ls.stdout and "UNUSABLE" in ls.stdout
    assert "float32[3, 8]" in ls.stdout
    clear = subprocess.run([sys.executable, "-m", "graphex", "cache", "clear", target], capture_output=True,
                           text=True)
    assert clear.returncode == 0 and "removed 2" in clear.stdout
    assert entries(target) == []


def test_a_fusion_pattern_registered_later_is_part_of_the_key(tmp_path):
    """Fused mode's program depends on the patterns registered: an entry compiled before a user's pattern was
    registered is not loaded after it (the pattern would not fire), in this process or the next one."""
    code = textwrap.dedent(f"""
        import sys, torch, graphex
        CALLS = []

        @torch.library.custom_op("cache_key_test::tanh_mul", mutates_args=())
        def tanh_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            CALLS.append(1)
            return torch.tanh(a) * b

        @tanh_mul.register_fake
        def _(a, b):
            return torch.empty_like(a)

        def f(a, b):
            return torch.tanh(a) * b + 1

        def run():
            # element-wise chains off: no built-in kernel fires on f, so the result is eager's bit for bit unless the
            # user's pattern runs (its custom op computes the same ops)
            fn = graphex.inference.cache_compile(f, cache_dir={str(tmp_path)!r},
                                                 options={{"pattern_fusion_pass": True, "pointwise_fusion": False}})
            a, b = torch.randn(4, 8), torch.randn(4, 8)
            with torch.no_grad():
                assert torch.equal(fn(a, b), f(a, b))
            return fn.stats

        if sys.argv[1] == "register":
            graphex.register_replacement(lambda a, b: torch.tanh(a) * b, lambda a, b: tanh_mul(a, b),
                                         [torch.randn(4, 4), torch.randn(4, 4)])
        print(run(), len(CALLS))
    """)
    script = tmp_path / "fused.py"
    script.write_text(code)

    def run(mode: str) -> str:
        proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=300,
                              cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    assert run("plain").startswith("{'hits': 0, 'misses': 1, 'compiles': 1, 'writes': 1}")
    assert run("plain") == "{'hits': 1, 'misses': 0, 'compiles': 0, 'writes': 0} 0"
    # the pattern registered: the plain entry is not loaded, the new compile fuses (the custom op runs)
    assert run("register") == "{'hits': 0, 'misses': 1, 'compiles': 1, 'writes': 1} 1"
    assert run("register") == "{'hits': 1, 'misses': 0, 'compiles': 0, 'writes': 0} 1"
