"""Tensor-parallel decoding, the compile cache across ranks, and ranks that fail: 2 gloo ranks on
127.0.0.1, started by the tests and killed past a deadline (distributed_scripts/launch.py)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import graphex
from distributed_scripts.launch import ROOT, launch
from graphex.base import warn as _warn

cache_module = importlib.import_module("graphex.inference.cache_compile")  # the module, not the function

# torch's Linux wheels (CPU and CUDA) ship gloo: its absence is a broken torch, a failure, not a skip.
assert dist.is_available() and dist.is_gloo_available(), "this torch has no torch.distributed with gloo"

HERE = os.path.dirname(os.path.abspath(__file__))
TP_DECODE = os.path.join(ROOT, "examples", "tp_decode.py")
SMALL = os.path.join(HERE, "distributed_scripts", "small_worker.py")
STEPS = 6


def _lines(results, prefix: str) -> list[dict]:
    found = [json.loads(line[len(prefix) + 1:]) for r in results for line in r.stdout.splitlines()
             if line.startswith(prefix + " ")]
    return sorted(found, key=lambda d: d["rank"])


def _tp_decode(*args: str) -> list[dict]:
    results = launch(TP_DECODE, "--json", "--steps", str(STEPS), *args, world=2, timeout=240)
    for r in results:
        assert not r.timed_out and r.returncode == 0, f"rank {r.rank}: rc {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    reports = _lines(results, "TP_DECODE")
    assert [d["rank"] for d in reports] == [0, 1]
    return reports


def test_tp_decode_bitwise_equal_to_tp_eager_and_same_tokens_as_one_process():
    for report in _tp_decode():
        assert report["logits_equal"] and report["cache_equal"], report
        assert report["engine_runs"] == STEPS, report  # every step on the engine, no fallback
        assert report["tokens_graphex"] == report["tokens"] == report["tokens_single_process"], report
        assert report["ok"], report


def test_tp_decode_with_one_cache_dir_shared_by_the_ranks(tmp_path):
    cold = _tp_decode("--cache-dir", str(tmp_path))
    assert [r["cache"] for r in cold] == [{"hits": 0, "misses": 1, "compiles": 1, "writes": 1}] * 2
    assert len(list(tmp_path.glob("*.gxc"))) == 2  # one entry per rank (Note [A program belongs to its world])
    warm = _tp_decode("--cache-dir", str(tmp_path))
    assert [r["cache"] for r in warm] == [{"hits": 1, "misses": 0, "compiles": 0, "writes": 0}] * 2
    for report in cold + warm:
        assert report["ok"] and report["logits_equal"] and report["engine_runs"] == STEPS, report


def _world(rank: int, size: int) -> dict:
    return {"rank": rank, "world_size": size, "backend": "gloo", "groups": [["0", list(range(size))]]}


def _double(x):
    return x * 2 + 1


def test_cache_entry_of_another_world_is_never_loaded(tmp_path, monkeypatch):
    """The world is part of the key: rank 1 of 2 does not load rank 0's entry silently (it is a sibling:
    no warning), a world of another size refuses both with a message naming both worlds."""
    x = torch.randn(3)
    world = {"key": _world(0, 2)}
    monkeypatch.setattr(cache_module, "world_key", lambda: world["key"])

    def run() -> dict:
        fn = graphex.inference.cache_compile(_double, cache_dir=str(tmp_path))
        with torch.no_grad():
            assert torch.equal(fn(x), _double(x))
        return fn.stats

    assert run()["compiles"] == 1
    world["key"] = _world(1, 2)
    _warn.reset()
    with _no_graphex_warning():
        assert run()["compiles"] == 1  # its own entry, next to rank 0's
    assert run()["hits"] == 1
    world["key"] = _world(0, 1)
    _warn.reset()
    with pytest.warns(_warn.GraphexWarning) as caught:
        assert run()["compiles"] == 1
    text = str(caught[0].message)
    assert "this process is rank 0 of world size 1 (gloo; groups '0': [0])" in text, text
    assert "built for rank 0 of world size 2 (gloo; groups '0': [0, 1])" in text, text
    assert "never runs in another world" in text, text
    assert len(list(tmp_path.glob("*.gxc"))) == 3
    listing = subprocess.run([sys.executable, "-m", "graphex", "cache", "ls", str(tmp_path)],
                             capture_output=True, text=True, timeout=120).stdout
    for world_text in ("rank 0 of world size 2", "rank 1 of world size 2", "rank 0 of world size 1"):
        assert f"built for {world_text}" in listing, listing


class _no_graphex_warning:
    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self._seen = self._catch.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        assert not [w for w in self._seen if issubclass(w.category, _warn.GraphexWarning)], \
            [str(w.message) for w in self._seen]


def _failure(results) -> dict:
    (failed,) = _lines(results, "FAILED")
    return failed


def test_a_rank_that_exits_mid_run_fails_the_other_at_once_with_a_clear_error():
    results = launch(SMALL, "exit", world=2, timeout=120, env={"TIMEOUT": "60"})
    assert not any(r.timed_out for r in results)
    assert results[1].returncode == 3  # rank 1 exited before its third step
    assert results[0].returncode == 1
    failed = _failure(results)
    assert failed["rank"] == 0 and failed["step"] == 2 and failed["is_replay_error"], failed
    assert failed["seconds"] < 30, failed  # a dead peer is noticed at once, not after the 60 s timeout
    assert "small_worker.py" in failed["where"] and "dist.all_reduce(y)" in failed["where"], failed  # the user's line
    assert "the collective all_reduce" in failed["why"] and "group '0' (ranks [0, 1])" in failed["why"], failed
    assert "rank 0 of world size 2" in failed["why"] and "exited or crashed" in failed["why"], failed
    assert "init_process_group(..., timeout=" in failed["fix"], failed


def test_a_rank_that_never_arrives_fails_the_other_after_the_group_timeout():
    results = launch(SMALL, "hang", "12", world=2, timeout=120, env={"TIMEOUT": "3"})
    assert not any(r.timed_out for r in results)
    assert results[0].returncode == 1
    failed = _failure(results)
    assert failed["step"] == 2 and failed["is_replay_error"], failed
    assert 2.5 <= failed["seconds"] < 11, failed  # bounded by the 3 s timeout the script set, not by the peer
    assert "within the group's timeout (3 s)" in failed["why"], failed


def test_bench_report_shows_the_tp_decode_step():
    from bench import report, tp_decode

    figures = {"eager": {"median_us": 30000.0, "p10_us": 20000.0, "p90_us": 40000.0},
               "graphex": {"median_us": 21000.0, "p10_us": 14000.0, "p90_us": 35000.0},
               "equal": True, "engine_ran": True, "rounds": 12, "calls_per_round": 12, "world": 2}
    meta = {"cpu": "cpu", "cores": 2, "torch_threads": 2, "torch": torch.__version__, "python": "3", "date": "d",
            "settings": "s"}
    text = report.markdown({"meta": meta, "cases": [], "targets": [], "tp_decode": figures})
    assert "| tp_decode_step, 2 ranks (gloo, 127.0.0.1), rank 0 | median step |" in text, text
    assert "| graphex | 21,000 us | 14,000 - 35,000 us | 0.70x | yes | yes |" in text, text
    failed = "\n".join(tp_decode.markdown_lines({"error": "the 2-rank TP decode run failed (exit 1)"}))
    assert "tp_decode_step (2 ranks): not measured (the 2-rank TP decode run failed (exit 1))" in failed
