"""cache_compile is never stale: each scenario of cache_stale_project/scenarios.py is compiled in one fresh
process (`python a.py`), its sources are edited, and a second fresh process (`python b.py`) must miss and
return eager's new result, while what did not change still hits. dynamic=True entries load across processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.join(HERE, "cache_stale_project")

EDITS = [  # (file, old, new): one per scenario that must recompile
    ("config.py", "SCALE = 2.0", "SCALE = 3.0"),
    ("config.py", "ACT = torch.relu", "ACT = torch.sigmoid"),
    ("lib/graphex_models/helper.py", "x * 2", "x * 3"),
    ("lib/torchfoo/helper.py", "x * 2", "x * 3"),
    ("ops.py", "return torch.empty_like(x)", "return x.new_empty(x.shape)"),
    ("closure.txt", "2.0", "3.0"),
]
RECOMPILED = ["script", "module_attr", "global_function", "beside_graphex", "beside_torch", "library_meta",
              "scaled"]


def run(project: str, script: str) -> dict:
    proc = subprocess.run([sys.executable, script], cwd=project, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GRAPHEX_LOG": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    project = str(tmp_path_factory.mktemp("stale") / "project")
    shutil.copytree(PROJECT, project)
    cold = run(project, "a.py")
    for name, old, new in EDITS:
        path = os.path.join(project, name)
        text = open(path).read()
        assert old in text, (name, old)
        open(path, "w").write(text.replace(old, new))
    return cold, run(project, "b.py")


def test_the_first_process_compiles_everything(runs):
    cold, _ = runs
    for name, stats in cold.items():
        assert stats["equal"] and stats["hits"] == 0 and stats["writes"] >= 1, (name, stats)


@pytest.mark.parametrize("scenario", RECOMPILED)
def test_a_changed_source_or_value_recompiles_and_matches_eager(runs, scenario):
    """script: another script's Model._forward; module_attr: config.SCALE read through the module;
    global_function: ACT = torch.relu -> torch.sigmoid in config.py; beside_graphex/beside_torch: helpers in
    folders named like the libraries (graphex_models/, torchfoo/); library_meta: a Library Meta kernel;
    scaled: a value the function closes over."""
    _, warm = runs
    stats = warm[scenario]
    assert stats["equal"], f"{scenario}: a stale entry was loaded ({stats})"
    assert stats["hits"] == 0 and stats["compiles"] == 1, stats


def test_what_did_not_change_still_hits(runs):
    _, warm = runs
    assert warm["unchanged"] == {"hits": 1, "misses": 0, "compiles": 0, "writes": 0, "equal": True}


@pytest.mark.parametrize("scenario", ["dynamic", "dynamic_branch"])
def test_dynamic_entries_load_in_a_fresh_process_and_match_eager_for_every_size(runs, scenario):
    """dynamic_branch branches on x.shape[0] > 4: its entries carry the shape guards
    (Note [A dynamic entry carries its shape guards]), one per branch, and each size gets the right one."""
    cold, warm = runs
    assert cold[scenario]["equal"] and warm[scenario]["equal"]
    assert warm[scenario]["compiles"] == 0 and warm[scenario]["hits"] >= 1, warm[scenario]
    if scenario == "dynamic_branch":
        assert cold[scenario]["compiles"] == 2 and warm[scenario]["hits"] == 2


_PATCHED_MODULE = """import torch


def act(x):
    return torch.relu(x)


def step(x):
    return act(x) * 2
"""

_PATCHING_DRIVER = """import json, sys
import torch
import graphex
import steps

if sys.argv[2] == "patched":
    steps.act = torch.tanh  # patched at run time: the file is unchanged
fn = graphex.inference.cache_compile(steps.step, cache_dir=sys.argv[1])
x = torch.randn(5)
out = fn(x)
print(json.dumps({**fn.stats, "equal": torch.equal(out, steps.step(x))}))
"""


def test_processes_that_patch_a_global_and_processes_that_do_not_keep_their_own_entries(tmp_path):
    """Note [A changed global is another state, not a stale entry]: an entry whose global differs in this process is a
    miss here, not stale: the other process's entry stays and each process hits its own from then on (they replaced
    each other's on every start, compiling every time: found by a helper)."""
    project, cache = tmp_path / "project", tmp_path / "cache"
    project.mkdir()
    (project / "steps.py").write_text(_PATCHED_MODULE)
    (project / "driver.py").write_text(_PATCHING_DRIVER)
    runs = []
    for variant in ("plain", "patched", "plain", "patched"):
        proc = subprocess.run([sys.executable, "driver.py", str(cache), variant], cwd=project, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert all(r["equal"] for r in runs), runs
    assert [r["compiles"] for r in runs] == [1, 1, 0, 0], runs
    assert len([f for f in os.listdir(cache) if f.endswith(".gxc")]) == 2, os.listdir(cache)
