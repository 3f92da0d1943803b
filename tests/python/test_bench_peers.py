"""make bench's peers (TorchScript, ONNX Runtime, graphex fused / cached, graphex's bare engine) and the
workloads users run (bench/models.py), on tiny configs in seconds: each backend's first output against
eager's, bitwise where the bench's row claims bitwise."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest
import torch

from bench import measure, report, run
from bench.cases import (Case, bert_case, convnet_case, hf_decoder_case, mha_case, transformer_encoder_case)

SMOKE = run.Settings(rounds=2, round_s=0.01, warmup=1, binary_warmup=1)

HAVE_ORT = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnxscript") is not None
HAVE_HF = importlib.util.find_spec("transformers") is not None
# `make test` installs both (bench/requirements.txt): missing is a failure that says how to install, not a skip.


@pytest.fixture
def _ort_installed():
    if not HAVE_ORT:
        pytest.fail("onnxruntime / onnxscript not installed: `make test` installs them (pip install -r bench/requirements.txt)")


@pytest.fixture
def _hf_installed():
    if not HAVE_HF:
        pytest.fail("transformers not installed: `make test` installs it (pip install -r bench/requirements.txt)")


needs_ort = pytest.mark.usefixtures("_ort_installed")
needs_hf = pytest.mark.usefixtures("_hf_installed")


class _Cached(torch.nn.Module):
    """A step that writes one of its inputs in place, like a KV-cache update."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, self.proj(x))
        return torch.softmax(cache @ x.t(), dim=0).sum(1)


STATEFUL = Case(
    name="stateful", description="a linear whose output is written into an input cache in place",
    build=lambda: _Cached().eval(),
    inputs=lambda _m: (torch.randn(1, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([3]),
                       torch.randn(6, 8, generator=torch.Generator().manual_seed(2))),
)


def _fused_available() -> bool:
    from graphex.options import Options

    return "pattern_fusion_pass" in {f.name for f in dataclasses.fields(Options)}


def test_every_peer_side_by_side_per_thread_count(tmp_path):
    """One entry per thread count; each row bitwise or a max diff; graphex's cost outside its engine."""
    backends = ["eager", "torchscript", "torchscript_ofi", "graphex", "graphex_fused", "graphex_cached",
                "graphex_cached_fused"]
    if HAVE_ORT:
        backends.insert(3, "onnxruntime")
    results = run.run_suite([STATEFUL], backends, SMOKE, isolate=False, bin_dir=str(tmp_path), log=lambda _m: None,
                            threads=[1, 2])
    assert [(c["name"], c["threads"]) for c in results["cases"]] == [("stateful", 1), ("stateful", 2)]
    for entry in results["cases"]:
        r = entry["results"]
        for backend in ("eager", "torchscript", "torchscript_ofi", "graphex", "graphex_cached"):
            assert r[backend]["median_us"] > 0 and r[backend]["samples"] >= 2, (backend, r[backend])
        for backend in ("torchscript", "graphex", "graphex_cached"):
            assert r[backend]["max_abs_diff_vs_eager"] == 0.0, (backend, r[backend])
        assert r["torchscript_ofi"]["max_abs_diff_vs_eager"] < 1e-5
        assert r["graphex"]["engine_ran"] is True
        assert 0 < r["graphex"]["engine_median_us"] and "outside_engine_us" in r["graphex"]
        assert r["graphex"]["outside_engine_us"] == r["graphex"]["median_us"] - r["graphex"]["engine_median_us"]
        if HAVE_ORT:
            ort = r["onnxruntime"]
            assert "unavailable" not in ort, ort
            assert ort["max_abs_diff_vs_eager"] < 1e-5 and ort["median_us"] > 0
            assert "arg 2" in ort["how"]  # the cache written in place became an explicit input and output
        if _fused_available():
            assert "unavailable" not in r["graphex_fused"] and r["graphex_fused"]["max_abs_diff_vs_eager"] < 1e-4
            fused_cached = r["graphex_cached_fused"]  # fused mode's kernels behind cache_compile: cached, replayed
            assert fused_cached["max_abs_diff_vs_eager"] < 1e-4 and fused_cached["median_us"] > 0, fused_cached
            assert fused_cached["cached"] is True and fused_cached["engine_ran"] is True, fused_cached
        else:
            assert r["graphex_fused"]["unavailable"].startswith("not available in this build")
    once = results["cases"][0]["results"]
    assert once["torchscript"]["first_call_in_process"] and once["torchscript"]["first_call_s"] > 0
    assert once["torchscript"]["how"] == "torch.jit.trace + torch.jit.freeze"

    text = report.markdown(results)
    assert "### 1 torch thread" in text and "### 2 torch threads" in text
    assert "| == eager | outside engine |" in text
    row = next(line for line in text.splitlines() if line.startswith("| stateful | graphex |"))
    assert "| bitwise |" in row and " us (" in row, row
    paths = report.write(results, str(tmp_path / "out"))
    assert open(paths["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@needs_ort
def test_a_failed_export_is_a_row_that_says_why(tmp_path):
    """A custom operator ONNX cannot translate: the row says why, the other backends still run."""
    @torch.library.custom_op("bench_peers_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    case = Case(name="custom", description="a custom operator", build=lambda: (lambda x: twice(x) + 1),
                inputs=lambda _f: (torch.randn(4),))
    results = run.run_suite([case], ["eager", "onnxruntime", "graphex"], SMOKE, isolate=False, bin_dir=str(tmp_path),
                            log=lambda _m: None, threads=[1])
    r = results["cases"][0]["results"]
    assert r["onnxruntime"]["unavailable"].startswith("torch.onnx.export(dynamo=True) failed"), r["onnxruntime"]
    assert "median_us" not in r["onnxruntime"] and r["graphex"]["max_abs_diff_vs_eager"] == 0.0
    text = report.markdown(results)
    assert "| custom | ONNX Runtime (CPU EP) | not run: torch.onnx.export(dynamo=True) failed" in text


def test_torchscript_of_a_plain_function_says_it_is_not_frozen():
    fn = measure.compile_for("torchscript", lambda x: torch.relu(x) * 3, (torch.randn(3),))
    x = torch.randn(3)
    assert torch.equal(fn(x), torch.relu(x) * 3)
    assert "not frozen" in measure.backend_note("torchscript", lambda x: x)
    assert measure.canonical("torchscript-ofi") == "torchscript_ofi" and measure.canonical("graphex-fused") in measure.BACKENDS


def _first_outputs(case: Case, backend: str) -> tuple[float, float]:
    """(difference from eager on the backend's code path, from eager's own path) of the first output."""
    _, info = run.prepare(case, backend, warmup=1, with_breakdown=False)
    assert "unavailable" not in info, info
    return info["max_abs_diff_vs_eager"], info.get("max_abs_diff_vs_plain_eager", info["max_abs_diff_vs_eager"])


TINY_TORCH_CASES = [convnet_case(width=8, image=16, name="convnet_tiny"),
                    mha_case(dim=32, heads=4, seq=8, name="mha_tiny"),
                    transformer_encoder_case(dim=32, heads=4, ffn=64, layers=2, seq=8, name="encoder_tiny")]


@pytest.mark.parametrize("case", TINY_TORCH_CASES, ids=lambda c: c.name)
def test_torch_workloads_graphex_and_torchscript(case):
    torch._dynamo.reset()
    same, _ = _first_outputs(case, "graphex")
    assert same < 1e-5  # the bench's row says bitwise or gives this difference
    ts, _ = _first_outputs(case, "torchscript")
    assert ts < 1e-4  # freeze folds conv + batchnorm: not bitwise on the conv net


@needs_hf
def test_transformers_decoders_against_eager_on_the_same_code_path():
    """Grouped-query decode: transformers packs the query in eager and repeats keys / values under Dynamo; against
    eager on Dynamo's path (bench/models.py code_path) graphex is bit for bit, against eager's own path it is not."""
    torch._dynamo.reset()
    llama = hf_decoder_case("llama", 1, size="tiny", name="llama_tiny")
    same, plain = _first_outputs(llama, "graphex")
    assert same == 0.0 and plain > 0.0, (same, plain)
    ts_same, _ = _first_outputs(llama, "torchscript")
    assert ts_same == 0.0
    gpt2 = hf_decoder_case("gpt2", 8, size="tiny", name="gpt2_prefill_tiny")
    assert _first_outputs(gpt2, "graphex")[0] == 0.0
    bert = bert_case(size="tiny", seq=8, name="bert_tiny")
    assert _first_outputs(bert, "graphex")[0] == 0.0


@needs_hf
@needs_ort
def test_transformers_decode_on_onnxruntime_with_the_cache_as_inputs_and_outputs():
    from bench import models

    case = hf_decoder_case("llama", 1, size="tiny", name="llama_tiny")
    step = case.build()
    args = case.inputs(step)
    ort = measure.compile_for("onnxruntime", step, args, case)
    with torch.no_grad():
        with models.code_path("export"):
            expected = step(*args)
        got = ort(*args)
    assert got.shape == expected.shape and (got - expected).abs().max().item() < 1e-4
    assert "explicit inputs and outputs" in ort.note and len(ort.extra) == 2 * 2  # keys and values of 2 layers


def test_steps_are_repeatable():
    """The timing calls a step again and again on the same inputs: a step must give the same result each time."""
    case = STATEFUL
    m = case.build()
    args = case.inputs(m)
    with torch.no_grad():
        assert torch.equal(m(*args), m(*args))


def test_a_bench_process_leaves_no_scratch_directory(tmp_path):
    """The ONNX exports and cache_compile directories a bench process makes are removed when it exits (425 of them,
    4 GB, had piled up in /tmp before 2026-12-07)."""
    import subprocess
    import sys

    code = ("import os, bench.measure as m; a = m.scratch_dir('graphex-bench-onnx-'); "
            "open(os.path.join(a, 'model.onnx'), 'w').write('x'); print(a)")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    made = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True)
    path = made.stdout.strip()
    assert path.startswith(str(tmp_path)) and not os.path.exists(path), path
