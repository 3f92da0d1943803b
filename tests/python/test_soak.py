"""A short soak (bench/soak.py; `make soak` runs 100,000 steps): memory stays flat, threads share a model."""

from __future__ import annotations

from bench import soak


def test_short_soak_memory_flat_and_four_threads_equal_to_eager(capsys):
    status = soak.main(["--steps", "3000", "--every", "500", "--warmup", "500", "--threads", "4",
                        "--thread-steps", "15", "--max-growth-mib", "2"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "all equal to eager" in out
