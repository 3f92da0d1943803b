"""Note [A cache hit imports no compiler] (graphex/inference/cache_compile.py): a fresh process whose calls hit the
compile cache never imports Dynamo, AOTAutograd or inductor, nor graphex's compile path; a miss, an option error
and an error raised from C++ in such a process still work as in any other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import json, sys, time
    start = time.perf_counter()
    import torch
    from graphex.inference import cache_compile

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.lin = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)

        def forward(self, x, *, scale=1.0):
            return torch.nn.functional.gelu(self.lin(self.norm(x))) * scale + x

    torch.manual_seed(0)
    model = Block().eval()
    cached = cache_compile(model.forward, cache_dir=sys.argv[1])
    shape = [int(s) for s in sys.argv[2].split(",")]
    x = torch.randn(*shape)
    with torch.no_grad():
        got, want = cached(x, scale=0.5), model(x, scale=0.5)
    seconds = time.perf_counter() - start
    loaded = [m for m in ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd", "graphex.errors",
                          "graphex.compile", "graphex.inference.capture") if m in sys.modules]
    print(json.dumps({"stats": cached.stats, "equal": bool(torch.equal(got, want)), "loaded": loaded,
                      "seconds": seconds}))
''')


def _run(tmp_path, shape: str) -> dict:
    script = tmp_path / "block.py"
    script.write_text(SCRIPT)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700, exist_ok=True)
    proc = subprocess.run([sys.executable, str(script), str(cache), shape], capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "GRAPHEX_LOG"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_warm_process_imports_no_compiler_and_a_new_shape_still_compiles(tmp_path):
    cold = _run(tmp_path, "2,16")
    assert cold["stats"]["compiles"] == 1 and cold["equal"]
    assert "torch._dynamo" in cold["loaded"]  # the cold process traced

    warm = _run(tmp_path, "2,16")
    assert warm["stats"] == {"hits": 1, "misses": 0, "compiles": 0, "writes": 0} and warm["equal"], warm
    assert warm["loaded"] == [], f"a cache hit imported {warm['loaded']}"

    other = _run(tmp_path, "3,16")  # a miss in a process that imported nothing of the compiler yet
    assert other["stats"]["compiles"] == 1 and other["equal"], other
    assert "torch._dynamo" in other["loaded"]


def test_errors_raised_before_any_compile_are_graphexs_classes(tmp_path):
    """An option error and a C++ error in a fresh process that never compiled: graphex.errors is imported when
    the first error is raised, so each is still its documented class."""
    script = tmp_path / "errors.py"
    script.write_text(textwrap.dedent('''
        import sys
        import torch
        import graphex._C
        from graphex.inference import cache_compile
        assert "graphex.errors" not in sys.modules
        try:
            cache_compile(lambda x: x + 1, options={"no_such_option": True})
        except ValueError as e:
            assert type(e).__name__ == "OptionsError" and "no_such_option" in str(e), repr(e)
        else:
            raise AssertionError("no OptionsError")
        import graphex.errors
        try:
            graphex._C.BoundProgram(b"not a program", "planted.gxp")
        except graphex.errors.ProgramError as e:
            print("ProgramError:", str(e).splitlines()[0])
        else:
            raise AssertionError("no ProgramError")
    '''))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ProgramError:" in proc.stdout


@pytest.mark.parametrize("body, imports_dynamo", [
    ("self.lin(x) + extra[0] * extra[1] * extra[2]['w']", False),
    ("torch.distributions.Normal(0.0, 2.0).log_prob(self.lin(x)) + extra[0]", True),
], ids=["list-and-dict-argument", "distribution"])
def test_a_warm_process_hits(tmp_path, body, imports_dynamo):
    """A list or dict argument is spelled out (Note [A call is spelled out]), so a warm process hits without
    importing Dynamo (before, the call went through pytree and Dynamo's polyfills on every hit). A model that
    builds a distribution sees the validate_args default torch.compile sets (Note [cache_compile sets what
    torch.compile sets]), so it hits in every new process (before, it missed and rewrote its entry each time); its
    trace reads one of Dynamo's polyfills, which the guard check imports."""
    script = tmp_path / "model.py"
    script.write_text(textwrap.dedent(f'''
        import json, sys
        import torch
        from graphex.inference import cache_compile

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x, extra):
                return {body}

        torch.manual_seed(0)
        m = M().eval()
        x, a, b = torch.randn(2, 4), torch.randn(4), torch.randn(4)
        extra = [a, b, {{"w": a}}]
        cached = cache_compile(m.forward, cache_dir=sys.argv[1])
        with torch.no_grad():
            got = cached(x, extra)
            dynamo = "torch._dynamo" in sys.modules  # before eager's own call, which may import it
            want = m(x, extra)
        print(json.dumps({{"stats": cached.stats, "equal": bool(torch.equal(got, want)), "dynamo": dynamo}}))
    '''))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    runs = []
    for _ in range(3):
        proc = subprocess.run([sys.executable, str(script), str(cache)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert all(r["equal"] for r in runs), runs
    assert runs[0]["stats"]["compiles"] == 1
    for warm in runs[1:]:
        assert warm["stats"] == {"hits": 1, "misses": 0, "compiles": 0, "writes": 0}, runs
        assert warm["dynamo"] == imports_dynamo, runs
    assert len(list(cache.glob("*.gxc"))) == 1
