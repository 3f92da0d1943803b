"""Note [Built-in patterns are traced per dtype, when needed] (graphex/fusion/manager.py): a float32 fused compile
traces the common group only, a bfloat16 graph adds its upcast group, a user's register_replacement traces every
group first (built-ins are tried first at a shared anchor), and the compile-cache key names the built-ins without
tracing them, the same in every process. Each case runs in a fresh interpreter: the registry is process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRELUDE = """
import json, torch, graphex, graphex._C
from graphex.fusion.manager import REGISTRY, registered_patterns

def groups():
    return sorted(str(g) for g in REGISTRY.builtin_groups)

def rms(x, w):
    h = x.to(torch.float32)
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

def fused(fn, *args):
    torch._dynamo.reset()
    return torch.compile(fn, backend="graphex", fullgraph=True, dynamic=False,
                         options={"pattern_fusion_pass": True})(*args)
"""


def _run(body: str) -> dict:
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_groups_are_traced_when_a_graph_of_their_dtype_is_fused():
    out = _run("""
        key_before = registered_patterns()
        seen = {"before": groups()}
        x, w = torch.randn(2, 16), torch.randn(16)
        fused(rms, x, w)
        seen["float32"] = groups()
        got = fused(rms, x.bfloat16(), w.bfloat16())
        seen["bfloat16"] = groups()
        seen["close"] = bool(torch.allclose(got.float(), rms(x.bfloat16(), w.bfloat16()).float(), rtol=0.05, atol=0.05))
        seen["key_unchanged"] = registered_patterns() == key_before
        seen["key"] = key_before
        print(json.dumps(seen))
    """)
    assert out["before"] == [] and out["float32"] == ["None"]
    assert out["bfloat16"] == ["None", "torch.bfloat16"] and out["close"]
    assert out["key_unchanged"], "tracing a group must not change the cache key"
    fresh = _run("print(json.dumps({'key': registered_patterns(), 'groups': groups()}))")
    assert fresh["key"] == out["key"] and fresh["groups"] == [], "the key is the same in every process, and free"
    assert len(fresh["key"]) == 1 and fresh["key"][0].startswith("builtins: ")


def test_a_users_pattern_comes_after_every_builtin_group_and_joins_the_key():
    out = _run("""
        before = registered_patterns()
        graphex.register_replacement(lambda x, y: torch.tanh(x) * y, lambda x, y: torch.tanh(x) * y,
                                     [torch.randn(4, 4), torch.randn(4, 4)])
        print(json.dumps({"groups": groups(), "before": before, "after": registered_patterns()}))
    """)
    assert out["groups"] == ["None", "torch.bfloat16", "torch.float16"]
    assert out["after"][: len(out["before"])] == out["before"] and len(out["after"]) == len(out["before"]) + 1


def test_a_users_pattern_that_a_builtin_already_is_says_so_and_how_to_skip_it():
    out = _run("""
        import torch.nn.functional as F

        def search(gate, up):  # the built-in silu_mul's own graph
            return F.silu(gate) * up

        args = [torch.randn(2, 3, 32), torch.randn(2, 3, 32)]
        try:
            graphex.register_replacement(search, search, args)
            raised = ""
        except RuntimeError as e:  # still torch's type: npugraph_ex's callers may catch it
            raised = str(e)
        skipped = graphex.register_replacement(search, search, args, skip_duplicates=True)
        print(json.dumps({"raised": raised, "skipped": skipped, "key": registered_patterns()}))
    """)
    assert out["raised"].startswith("graphex.register_replacement: search is a pattern already registered"), out
    assert "skip_duplicates=True" in out["raised"] and "Duplicate pattern" in out["raised"]
    assert out["skipped"] is False and len(out["key"]) == 1, "nothing registered, nothing added to the cache key"
