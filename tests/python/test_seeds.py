"""The npugraph_ex seed templates (examples/seeds/), with only the device changed, run on graphex.

The MRE and cache templates run under torch.no_grad() here (the template itself has none: with
grad on, graphex says so once and runs AOTAutograd's eager path); each result is bitwise eager's
and the C++ engine ran. The op-plugin blocks run together once each `Library` has its own name;
pasted as is (`m` rebound), the collected Meta registration is named in the error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT, assert_same, engine_runs


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def test_mre_template_runs_on_the_engine():
    from examples.seeds import mre

    before = engine_runs()
    model, x, out = mre.infer_one_step()
    assert engine_runs() > before
    assert_same(out, model(x))


def test_cache_template_runs_through_the_npugraph_ex_path(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHEX_CACHE_DIR", str(tmp_path))
    from examples.seeds import cache

    import graphex
    assert graphex.npugraph_ex.inference.cache_compile is graphex.inference.cache_compile
    before = engine_runs()
    model, x, out = cache.infer_one_step()
    assert engine_runs() > before and os.listdir(tmp_path)  # on the engine, and an entry written
    assert_same(out, model._forward(x))


def test_op_plugin_blocks_run_when_each_library_keeps_its_name():
    from examples.seeds import op_plugin

    before = engine_runs()
    op_plugin.infer_one_step()
    assert engine_runs() > before
    x = torch.randn(4, 8)
    x_eager, x_graphex = x.clone(), x.clone()
    out = torch.compile(op_plugin.Model(), backend="npugraph_ex", fullgraph=True, dynamic=False)(x_graphex)
    assert_same(out, op_plugin.Model()(x_eager))
    assert_same(x_graphex, x_eager)  # my_inplace wrote its (a!) argument in both


def test_pasted_op_plugin_blocks_name_the_vanished_meta_registration():
    code = textwrap.dedent("""\
        import runpy, torch
        try:
            with torch.no_grad():
                runpy.run_path("examples/seeds/op_plugin_pasted.py", run_name="__main__")
        except Exception as e:
            print(type(e).__name__, getattr(e, "finding", None) and e.finding.fix)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert "CustomOpError" in out or "CustomOpTraceError" in out, out + proc.stderr[-3000:]
    assert "op_plugin_pasted.py:22: a Meta function for npu::my_op is registered on `m`" in out, out
    assert "(`m` is bound to a new Library at op_plugin_pasted.py:36)" in out, out
    # the fix: the user's own Meta function, registered on one Library of the namespace that stays alive
    assert '_graphex_libs["npu"] = torch.library.Library("npu", "FRAGMENT")' in out, out
    assert 'def my_op_meta(x, y, z, attr1, attr2):\n' \
           "    # <根据算子语义推导输出 shape/dtype>\n    return torch.empty_like(x)" in out, out
    assert '_graphex_libs["npu"].impl("my_op", my_op_meta, "Meta", allow_override=True)' in out, out
