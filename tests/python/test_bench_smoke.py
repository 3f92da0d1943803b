"""The benchmark's machinery on a tiny workload, in-process and briefly: `make test` catches a broken
`make bench` without paying for the real run (no inductor, no subprocesses, a few calls per backend)."""

from __future__ import annotations

import json

import torch

from bench import measure, report, run
from bench.cases import CASES, Case, Handwritten

SMOKE = run.Settings(rounds=2, round_s=0.01, warmup=1, binary_warmup=1)


def _tiny(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2.0 + 1.0).sum(0)


TINY = Case(
    name="tiny",
    description="three elementwise ops and a reduction",
    build=lambda: _tiny,
    inputs=lambda _fn: (torch.randn(4, 8),),
    ops=4,
    handwritten=Handwritten(binary="no_such_binary", args=(), check=lambda: 0.0),
)


def test_suite_writes_json_markdown_and_png(tmp_path):
    backends = ["eager", "aot_eager", "graphex"]
    results = run.run_suite([TINY], backends, SMOKE, isolate=False, bin_dir=str(tmp_path), log=lambda _m: None)
    paths = report.write(results, str(tmp_path / "out"))

    saved = json.loads(open(paths["json"]).read())
    assert {"cpu", "cores", "torch", "date", "settings"} <= saved["meta"].keys()
    (case,) = saved["cases"]
    assert case["name"] == "tiny" and set(case["results"]) == set(backends)
    for backend in backends:
        r = case["results"][backend]
        assert r["p10_us"] <= r["median_us"] <= r["p90_us"] and r["samples"] >= 2, (backend, r)
        assert r["first_call_s"] > 0 and r["peak_step_bytes"] > 0, (backend, r)
        assert r["max_abs_diff_vs_eager"] == 0.0, (backend, r)
    assert case["results"]["graphex"]["engine_ran"] is True
    assert case["results"]["graphex"]["graphex_ops"] >= 1
    assert any("no_such_binary not found" in note for note in case["notes"])

    figures = {(t["figure"], t["case"]): t for t in saved["targets"]}
    memory = figures[("peak step memory, graphex / eager", "tiny")]
    assert memory["value"] > 0 and memory["passed"] in (True, False)
    assert figures[("first call, graphex / inductor", "tiny")]["passed"] is None  # inductor not run

    text = open(paths["markdown"]).read()
    assert text == report.markdown(results)
    assert "| workload | backend | median step |" in text and "| tiny | graphex |" in text
    assert "| peak step memory, graphex / eager | tiny |" in text and "| first call, graphex / inductor | tiny |" in text
    assert open(paths["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_targets_on_known_numbers():
    """The four goals of the issue, computed from made-up measurements."""
    def row(**kw):
        return kw

    results = {"cases": [
        {"name": "decoder_step", "ops": None, "results": {
            "eager": row(median_us=1000.0, first_call_s=0.01, peak_step_bytes=1000),
            "inductor": row(median_us=500.0, first_call_s=30.0, peak_step_bytes=5000),
            "graphex": row(median_us=400.0, first_call_s=3.0, peak_step_bytes=1200)}},
        {"name": "chain500", "ops": 500, "results": {
            "graphex": row(median_us=900.0), "handwritten": row(median_us=700.0)}},
    ]}
    got = {(t["figure"], t["case"]): (round(t["value"], 6) if t["value"] is not None else None, t["passed"])
           for t in report.derive(results)}
    assert got[("step latency, graphex / eager", "decoder_step")] == (0.4, True)
    assert got[("engine overhead per op, (graphex - hand-written) / ops", "chain500")] == (0.4, True)
    assert got[("first call, graphex / inductor", "decoder_step")] == (0.1, True)
    assert got[("peak step memory, graphex / eager", "decoder_step")] == (1.2, False)
    assert got[("peak step memory, graphex / eager", "chain500")] == (None, None)


def test_the_fused_and_per_call_targets_of_issues_21_and_22_on_known_numbers():
    results = {"cases": [
        {"name": "gpt2_decode", "ops": None, "results": {
            "torchscript": {"median_us": 1000.0}, "onnxruntime": {"median_us": 1000.0},
            "inductor": {"median_us": 1000.0},
            "graphex": {"median_us": 950.0, "outside_engine_us": 300.0},
            "graphex_fused": {"median_us": 800.0}, "graphex_cached_fused": {"median_us": 1100.0}}},
        {"name": "convnet", "ops": None, "results": {
            "eager": {"median_us": 1000.0}, "inductor": {"median_us": 1000.0},
            "graphex": {"median_us": 850.0, "outside_engine_us": 30.0}, "graphex_fused": {"median_us": 1010.0}}},
    ]}
    got = {(t["figure"], t["case"]): (round(t["value"], 6) if t["value"] is not None else None, t["passed"])
           for t in report.derive(results)}
    assert got[("decode step, graphex fused / inductor", "gpt2_decode")] == (0.8, True)
    assert got[("decode step, graphex fused / ONNX Runtime", "gpt2_decode")] == (0.8, True)
    assert got[("decode step, graphex fused via cache_compile / ONNX Runtime", "gpt2_decode")] == (1.1, False)
    assert got[("decode step, graphex exact / TorchScript freeze", "gpt2_decode")] == (0.95, False)
    assert got[("prefill, encoder or conv net, graphex fused / inductor", "convnet")] == (1.01, False)
    assert got[("conv net or attention block, graphex exact / eager", "convnet")] == (0.85, True)
    assert got[("outside the engine, graphex exact", "gpt2_decode")] == (300.0, False)
    assert got[("outside the engine, graphex exact", "convnet")] == (30.0, True)
    assert ("decode step, graphex fused / inductor", "convnet") not in got


def test_shipped_cases_are_well_formed():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)) and {"decoder_step", "chain500"} <= set(names)
    chain = next(c for c in CASES if c.name == "chain500")
    assert chain.ops == 500 and chain.handwritten is not None
    x = chain.inputs(chain.build())[0]
    assert x.shape == (16,) and x.dtype == torch.float32
    assert measure.summarize([3.0, 1.0, 2.0])["median_us"] == 2.0


def test_cpp_runner_step_and_load_to_first_output_next_to_the_python_engine(tmp_path):
    """make bench's C++ runner rows (bench/cpp_runner.py): the case exported, graphex-run's median step beside the
    Python engine's, its load and load-to-first-output times, its output bitwise equal to eager."""
    from bench import cpp_runner

    results = run.run_suite([TINY], ["graphex"], SMOKE, isolate=False, bin_dir=str(tmp_path), log=lambda _m: None,
                            cpp_runner=[TINY], cpp_runs=5)
    r = results["cpp_runner"]["tiny"]
    assert r["equal"] is True and r["runs"] == 5 and not r["custom_ops_library"], r
    assert 0 < r["p10_us"] <= r["median_us"] <= r["p90_us"] and 0 < r["load_ms"] <= r["first_output_ms"], r
    assert r["process_s"] * 1000 > r["first_output_ms"]
    text = report.markdown(results)
    python_step = results["cases"][0]["results"]["graphex"]["median_us"]
    table = text.split("| C++ runner (graphex-run) | median step |", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith("| tiny | "))
    assert f"| {python_step:,.0f} us |" in row and row.endswith("| yes |"), row

    missing = cpp_runner.measure([TINY], graphex_run=str(tmp_path / "graphex-run"))
    assert "not found" in missing["error"]
    assert "C++ runner (graphex-run): not measured" in "\n".join(cpp_runner.markdown_lines(missing, []))


def test_per_call_layers_outside_the_engine(tmp_path):
    """make bench's per-call section (bench/per_call.py): each layer of one torch.compile call timed alone on the
    same arguments, warm and after a real engine run, the guard count and kinds from Dynamo's own guard manager, the
    output bitwise equal to eager."""
    from bench import per_call

    module_case = Case(name="tiny_module", description="a Linear and a ReLU",
                       build=lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(),
                       inputs=lambda _m: (torch.randn(4, 8),))
    results = run.run_suite([TINY, module_case], ["graphex"], SMOKE, isolate=False, bin_dir=str(tmp_path),
                            log=lambda _m: None, per_call=True)
    section = results["per_call"]
    assert not section["skipped"], section["skipped"]
    filters = (None, *per_call.GUARD_FILTERS)
    assert [(r["case"], r["guard_filter"]) for r in section["rows"]] == [(c, f) for c in ("tiny", "tiny_module")
                                                                         for f in filters]
    for r in section["rows"]:
        med = r["median_us"]
        assert set(med) == set(per_call.LAYERS) and all(v > 0 for v in med.values()), r
        assert r["bitwise_equal_eager"] is True and r["threads"] == 1
        assert r["outside_engine_us"] == med["call"] - med["stub"]
        assert abs(r["dynamo_us"] + r["aot_wrapper_us"] + r["graphex_python_us"] - r["outside_engine_us"]) < 1e-6
        # after a real engine run (Note [Per-call costs are measured after a real engine run]): the engine's own time
        # is taken out of each call, so what is left is positive and the layers add up to the whole
        real = r["real_us"]
        assert set(real) == set(per_call.REAL_LAYERS) and all(v > 0 for v in real.values()), r
        assert r["real_outside_engine_us"] == real["call"]
        assert abs(r["real_dynamo_us"] + r["real_aot_wrapper_us"] + r["real_graphex_python_us"]
                   - r["real_outside_engine_us"]) < 1e-6
        assert r["guards"]["count"] == sum(r["guards"]["kinds"].values())
        assert r["guards"]["count"] > 0 or r["guard_filter"] == "skip_all_guards_unsafe"
    by = {(r["case"], r["guard_filter"]): r for r in section["rows"]}
    assert "TENSOR_MATCH" in by["tiny_module", None]["guards"]["kinds"]  # the module's input and parameters
    assert by["tiny_module", "skip_all_guards_unsafe"]["guards"]["count"] < by["tiny_module", None]["guards"]["count"]
    text = report.markdown(results)
    assert "Per call, outside the engine" in text and "| tiny_module | 1 |" in text
    assert "| tiny_module | keep_tensor_guards_unsafe |" in text


def test_a_workload_with_weights_is_set_against_its_weight_floor(tmp_path):
    """make bench's floor table (issue 21 point 6): one GEMV over as many bytes as a module's weights (an embedding
    read one row at a time left out, a tied one kept), timed at each thread count, each graphex median as a multiple
    of it; a workload without weights has no row."""
    linear = Case(name="one_linear", description="a Linear(256, 1024) on one row",
                  build=lambda: torch.nn.Linear(256, 1024).eval(), inputs=lambda _m: (torch.randn(1, 256),))
    results = run.run_suite([TINY, linear], ["eager", "graphex"], SMOKE, isolate=False, bin_dir=str(tmp_path),
                            log=lambda _m: None)
    by = {c["name"]: c for c in results["cases"]}
    assert by["one_linear"]["weight_bytes"] == (256 * 1024 + 1024) * 4 and by["tiny"]["weight_bytes"] == 0
    floor = by["one_linear"]["weight_floor_us"]
    assert floor > 0 and "weight_floor_us" not in by["tiny"]
    lines = report.floor_table(results)
    rows = [line for line in lines if line.startswith("| one_linear |")]
    assert len(rows) == 1 and "1.05 MB" in rows[0] and not any(line.startswith("| tiny |") for line in lines)
    step = by["one_linear"]["results"]["graphex"]["median_us"]
    assert f"({step / floor:.1f}x)" in rows[0]
    assert "Weight floor" in report.markdown(results)

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.norm = torch.nn.Embedding(100, 8), torch.nn.LayerNorm(8)
            self.head = torch.nn.Linear(8, 100, bias=False)

    untied = Tied()
    assert measure.weight_bytes(untied) == (16 + 800) * 4  # the norm and the head, not the table
    untied.head.weight = untied.embed.weight
    assert measure.weight_bytes(untied) == (16 + 800) * 4  # tied: the head reads the table whole, counted once


def test_cache_call_cost_times_the_engine_and_a_stubbed_call():
    """bench/cache_call_cost.py: the engine row runs the real program (a refusal would take microseconds), the
    stubbed row leaves the engine out, the cache_compile call (its C++ fast path) runs the engine, and the
    after-an-engine-run rows are there. It once timed a refusal and a real run as its two rows, unnoticed, after
    cache_compile's call moved to the bound program; `measure` refuses to run when no fast path was installed."""
    from bench import cache_call_cost

    medians, guards, inputs = cache_call_cost.measure(rounds=1, calls=20)
    assert guards > 0 and inputs == 46
    engine, stubbed = medians["engine (executor.try_run)"], medians["cache_compile, Python path, engine stubbed"]
    assert engine > 20 * stubbed, medians  # the shipped decoder's step is about a millisecond, the stubbed call us
    assert medians["cache_compile call"] > 20 * stubbed, medians  # the fast path runs the real engine
    for row in ("cache_compile over the engine, after an engine run",
                "cache_compile's Python path over the engine, after an engine run",
                "engine over the engine (the pairing's own floor)"):
        assert row in medians, medians


def test_cache_call_cost_times_transformers_own_keyword_call():
    """--case gpt2_keywords: `model.forward(input_ids=..., past_key_values=StaticCache, ...)`, the call transformers
    makes, through the FastCall (measure refuses to run without one) and the real engine."""
    from bench import cache_call_cost

    medians, guards, inputs = cache_call_cost.measure(rounds=1, calls=8, case="gpt2_keywords")
    assert guards > 0 and inputs > 50
    assert medians["cache_compile call"] > 5 * medians["cache_compile, Python path, engine stubbed"], medians


def test_device_graph_cost_section_splits_the_runner_around_a_replay(tmp_path):
    """make bench's device-graph section (bench/device_graph_cost.py) on gxsim: every row timed, the runner's parts
    (lock, signature, address checks, input copies, outputs copied out) each measured, the device step bitwise equal
    to the CPU's, and the section in the report."""
    from bench import device_graph_cost

    results = run.run_suite([TINY], ["graphex"], SMOKE, isolate=False, bin_dir=str(tmp_path), log=lambda _m: None,
                            device_graph_cost=True)
    section = results["device_graph_cost"]
    assert "error" not in section, section
    med = section["median_us"]
    assert all(med[p] > 0 for p in device_graph_cost.PARTS) and med["gxsim: replay() alone"] > 0
    assert section["runner_around_replay_us"] == med["gxsim: runner, replay() stubbed"] > 0
    assert section["equal_cpu_eager"] is True
    # the shipped decoder: token and position copied in, the logits copied out, the caches checked by address
    assert section["inputs_copied"] == 2 and section["outputs_copied"] == 1 and section["addresses_checked"] >= 2
    text = report.markdown(results)
    assert "Device graphs, host cost on the simulated device gxsim" in text and "address checks" in text


def test_weight_floor_is_one_gemv_over_the_parameters_bytes():
    """bench.fused_step's and make bench's floor: the parameters' bytes (at their own width), and one GEMV over as
    many bytes, which takes longer for more bytes."""
    model = torch.nn.Linear(256, 128).to(torch.bfloat16)
    nbytes = measure.weight_bytes(model)
    assert nbytes == (256 * 128 + 128) * 2
    small, large = measure.gemv_floor_us(1 << 16, calls=50), measure.gemv_floor_us(64 << 20, calls=5)
    assert 0 < small < large


def test_fused_step_runs_in_bfloat16(capsys):
    from bench import fused_step

    assert fused_step.main(["--rounds", "1", "--round-s", "0.02", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "decoder one-token step (bfloat16)" in out and "weight-streaming floor" in out


def test_runner_call_cost_times_both_calls_and_restores_the_graph():
    """bench/runner_call_cost.py (Note [A compiled graph's call enters its runner at once]): both rows are timed, and
    the graph it switched to a Python __call__ is a CompiledGraph again afterwards."""
    import gc

    from bench import runner_call_cost
    from graphex.runtime.compiled_graph import CompiledGraph

    rows = runner_call_cost.measure(rounds=1, pairs=5)
    assert set(rows) == {"graph(args) over the engine, C++ call slot", "graph(args) over the engine, Python __call__",
                         "Python __call__ - C++ slot, per round", "engine over the engine (the pairing's own floor)"}
    gc.collect()
    assert all(type(g) is CompiledGraph for g in gc.get_objects() if isinstance(g, CompiledGraph))


def test_generated_variants_are_timed_fused_against_the_others_and_their_medians_are_targets():
    """bench/variants.py on two tiny variants (eager and graphex fused only: no inductor or ONNX export here): each row
    has its medians, the fused kernels that fired and its difference from eager; the medians over the variants become
    the rows of issue 21's targets."""
    from bench import variants
    from sweeps.coverage_decoder import Sizes, Spelling

    section = variants.measure_all(lambda _m: None, [1], rounds=2, round_s=0.01, warmup=1,
                                   backends=["eager", "graphex_fused"], sizes=Sizes(),
                                   spellings=[Spelling(), Spelling(norm="layernorm", mlp="ungated")])
    assert [r["name"] for r in section["rows"]] == ["baseline", "norm=layernorm,mlp=ungated"]
    for row in section["rows"]:
        assert set(row["median_us"]["1"]) == {"eager", "graphex_fused"}, row
        fused = row["backends"]["graphex_fused"]
        assert fused["fired"], row  # these spellings fuse (sweeps/fusion_coverage.py checks which)
        assert fused["max_abs_diff_vs_eager"] < 1e-4, row
    medians = section["medians"]["1"]
    assert medians["fused_over_eager"] > 0 and medians["fused_over_eager_count"] == 2
    assert medians["fused_over_inductor"] is None and medians["fused_over_inductor_count"] == 0
    text = "\n".join(variants.markdown_lines(section))
    assert "| baseline | 1 |" in text and "fused / inductor -" in text

    section["medians"]["1"].update(fused_over_inductor=0.8, fused_over_onnxruntime=1.2)
    got = {t["figure"]: t["passed"] for t in report.derive({"cases": [], "variants": section})}
    assert got["decode step, graphex fused / inductor (generated variants' median)"] is True
    assert got["decode step, graphex fused / ONNX Runtime (generated variants' median)"] is False
