"""Note [A tensor an argument holds is bound through its path]: cache_compile(model.forward) called the way
transformers is called (`past_key_values=StaticCache(...)`, `cache_position=...`) caches the step, binds the
tensors the cache object holds per call, and a fresh process hits the entry; bitwise equal to the same trace run by
torch's own kernels (aot_eager), and for GPT-2 to eager itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import transformers  # noqa: F401  make test installs it (bench/requirements.txt): missing is a failure, not a skip

HERE = os.path.dirname(os.path.abspath(__file__))


def _decode(cache_dir: str, model: str) -> dict:
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cache_static_kv.py"), cache_dir, model],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "GRAPHEX_LOG": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "cannot be cached" not in proc.stderr, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_a_static_cache_object_is_bound_and_the_step_is_cached(tmp_path, model):
    cold, warm = _decode(str(tmp_path), model), _decode(str(tmp_path), model)
    assert cold["stats"] == {"hits": 0, "misses": 1, "compiles": 1, "writes": 1}, cold  # 5 steps, one compile
    assert warm["stats"] == {"hits": 1, "misses": 0, "compiles": 0, "writes": 0}, warm  # a fresh process: no trace
    for run in (cold, warm):
        assert run["equal"] and run["cache_equal"], run
        # the first call compiles or loads, the next installs the FastCall; it answers the rest, keywords and all
        assert run["python_calls"] <= 2, run
        if model == "gpt2":
            assert run["equal_eager"], run
        else:  # Llama's trace builds its mask unlike eager (see cache_static_kv.py): close, not bitwise
            assert run["max_abs_eager"] <= 1e-5, run


def test_export_refuses_a_tensor_an_argument_holds(tmp_path):
    code = f"""
import sys; sys.argv = ["x", {str(tmp_path)!r}, "gpt2"]; sys.path.insert(0, {HERE!r})
import torch, transformers, graphex, cache_static_kv as m
from graphex.exporting import ExportError
cfg, model = m.build()
cache = transformers.StaticCache(config=cfg, max_cache_len=32)
with torch.no_grad():
    model(input_ids=torch.tensor([[3]]), past_key_values=cache, cache_position=torch.tensor([0]), use_cache=True)
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids, cache, pos):
            return self.model(input_ids=ids, past_key_values=cache, cache_position=pos).logits

    try:
        graphex.export(Step(), (torch.tensor([[5]]), cache, torch.tensor([1])), {str(tmp_path / 'art')!r})
    except ExportError as e:
        print("REFUSED", e)
"""
    script = tmp_path / "export_step.py"  # a file: export checks the source of what it captures
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert "REFUSED" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "an argument object holds" in proc.stdout and "layers[0]" in proc.stdout, proc.stdout
