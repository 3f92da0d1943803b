"""`graphex triage`: each fixture script in triage_scripts/ gets the findings, source lines, fixes,
bisection verdict and exit code it should.

Every triage runs in its own interpreter (`python -m graphex triage`), as a user runs it; the
runs are started together once per module, two at a time, and each test reads its result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from graphex.cli import main
from graphex.tools.triaging import recompiles
from graphex.tools.triaging.dynamo_logs import LogEvent

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triage_scripts")

# name -> the command line after `graphex triage`; all but "mlp_text" ask for --json
RUNS = {
    "clean": ["clean_mlp.py"],
    "mlp_text": ["clean_mlp.py", "--entry", "infer_one_step"],
    "branch": ["break_control_flow.py"],
    "print_text": ["break_print.py", "--no-bisect"],
    "recompile": ["recompile_int.py", "--no-bisect"],
    "no_fake": ["custom_op_no_fake.py", "--no-bisect"],
    "lying_fake": ["custom_op_lying_fake.py"],
    "kept": ["kept_copy.py"],
    "accuracy": ["accuracy_lying_schema.py"],
    "cond": ["capture_cond.py", "--no-bisect"],
    "eager_fails": ["fails_in_eager.py"],
    "args": ["fails_in_eager.py", "--no-bisect", "--", "--fixed"],
}


def _triage(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHEX_LOG", "GRAPHEX_DUMP", "TORCH_LOGS")}
    return subprocess.run([sys.executable, "-m", "graphex", "triage", *argv], cwd=SCRIPTS, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def results() -> dict[str, subprocess.CompletedProcess[str]]:
    def one(item: tuple[str, list[str]]) -> tuple[str, subprocess.CompletedProcess[str]]:
        name, argv = item
        return name, _triage(argv if name.endswith("_text") else [*argv[:1], "--json", *argv[1:]])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, RUNS.items()))


def report(results, name: str, exit_code: int) -> dict:
    proc = results[name]
    assert proc.returncode == exit_code, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)


def of_kind(doc: dict, kind: str) -> list[dict]:
    return [f for f in doc["findings"] if f["kind"] == kind]


def line_of(script: str, snippet: str) -> str:
    """'script.py:N' for the line of `script` that contains `snippet`."""
    with open(os.path.join(SCRIPTS, script)) as f:
        for n, line in enumerate(f, 1):
            if snippet in line:
                return f"{script}:{n}"
    raise AssertionError(f"{snippet!r} not in {script}")


def test_clean_model_reports_nothing_and_exits_0(results):
    doc = report(results, "clean", 0)
    assert doc["findings"] == [] and doc["status"] == "ran"
    (b,) = doc["bisections"]
    assert b["culprit"] == "" and b["stages"] == {"eager": "deterministic", "aot_eager": "bitwise equal",
                                                   "force_eager": "bitwise equal", "replay": "bitwise equal"}
    assert doc["compiled"][0]["name"] == "MLP" and doc["compiled"][0]["calls"] == 3
    text = results["mlp_text"]
    assert text.returncode == 0, text.stdout + text.stderr
    assert "summary: nothing found; accuracy: every stage matches eager bitwise (exit 0)" in text.stdout


def test_every_graph_break_is_listed_with_its_line_and_fix(results):
    doc = report(results, "branch", 1)
    assert "Data-dependent branching" in doc["error"]  # fullgraph=True stopped at the first break...
    branch, item = of_kind(doc, "graph-break")  # ...triage lists both
    assert branch["title"] == "Data-dependent branching"
    assert branch["where"].startswith(line_of("break_control_flow.py", "if h.sum() > 0:") + " in forward")
    assert "torch.where" in branch["fix"] and "torch.cond" in branch["fix"]
    assert "item()" in item["title"] and item["where"].startswith(line_of("break_control_flow.py", ".item()"))
    assert "keep the value on a tensor" in item["fix"]


def test_print_break_text_report(results):
    proc = results["print_text"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "graph breaks (1)" in out and "Failed to trace builtin operator" in out
    where = line_of("break_print.py", 'print("debug')
    assert f"at:   {where} in step: print(" in out
    assert "fix:  remove print() from the compiled region" in out
    assert out.rstrip().endswith("summary: 1 graph break (exit 1)")


def test_recompiles_name_the_guard_the_call_and_the_fix(results):
    doc = report(results, "recompile", 1)
    by_title = {f["title"].split(": ", 1)[1]: f for f in of_kind(doc, "recompile")}
    ints, shape = by_title["int value changed (2 recompiles)"], by_title["shape changed"]
    assert ints["count"] == 2 and "guard failed: steps == 1" in ints["detail"]
    assert ints["where"].startswith(line_of("recompile_int.py", "compiled(x, steps)"))
    assert line_of("recompile_int.py", "return x * steps") in ints["detail"]
    assert "torch.tensor(steps)" in ints["fix"]
    assert "size mismatch at index 0. expected 4, actual 6" in shape["detail"]
    assert shape["where"].startswith(line_of("recompile_int.py", "torch.randn(6, 8)"))
    assert "mark_dynamic(x, 0)" in shape["fix"] and "pad" in shape["fix"]


def test_custom_op_without_fake_shows_the_fake_to_paste(results):
    doc = report(results, "no_fake", 1)
    (f,) = of_kind(doc, "custom-op")
    assert f["title"] == "custom op triage_nofake::scale_rows has no fake function"
    assert f["where"].startswith(line_of("custom_op_no_fake.py", "torch.ops.triage_nofake.scale_rows"))
    assert f["fix"].startswith("@scale_rows.register_fake\ndef _(x, w):")
    assert of_kind(doc, "graph-break") == []  # the trace error is not reported twice


def test_fake_that_lies_is_reported_and_bisected_to_the_replay(results):
    doc = report(results, "lying_fake", 1)
    (f,) = of_kind(doc, "custom-op")
    assert "triage_lyingfake::row_norm has a fake/Meta function that disagrees with its real kernel" in f["title"]
    assert "real kernel: float32[4] on cpu" in f["fix"] and "fake:        float32[4, 8]" in f["fix"]
    (b,) = doc["bisections"]
    assert b["culprit"] == "replay" and b["raised"] and b["stages"]["force_eager"] == "bitwise equal"
    assert of_kind(doc, "accuracy") == []  # the error is the finding


def test_kept_copy_names_the_update_and_the_option(results):
    doc = report(results, "kept", 1)
    (f,) = of_kind(doc, "kept-copy")
    assert "written back by a full copy" in f["title"]
    assert f["where"].startswith(line_of("kept_copy.py", "cache.index_copy_(1,") + " in forward")
    assert f["detail"] == "because option input_inplace_pass=False"
    assert "remove options={'input_inplace_pass': False}" in f["fix"]
    assert doc["bisections"][0]["culprit"] == ""


def test_accuracy_bisection_names_the_stage_and_the_pass(results):
    doc = report(results, "accuracy", 1)
    (b,) = doc["bisections"]
    assert b["culprit"] == "force_eager" and b["problem"] and b["max_abs"] == pytest.approx(1.0)
    assert b["stages"]["aot_eager"] == "bitwise equal" and b["stages"]["replay"].startswith("output differs")
    assert "graphex's graph passes" in b["meaning"] and "options={'remove_noop_ops': False}" in b["meaning"]
    (f,) = of_kind(doc, "accuracy")
    assert f["problem"] and f["title"] == "step: results first differ at stage force_eager"
    assert f["where"].startswith(line_of("accuracy_lying_schema.py", "torch.compile(step"))


def test_capture_error_is_cut_into_line_and_fix(results):
    doc = report(results, "cond", 1)
    (f,) = of_kind(doc, "capture")
    assert "cannot capture node" in f["title"]
    assert f["where"].startswith(line_of("capture_cond.py", "return torch.cond("))
    assert "torch.cond" in f["fix"]


def test_script_broken_in_eager_exits_2_and_arguments_reach_the_script(results):
    doc = report(results, "eager_fails", 2)
    assert doc["status"] == "failed-in-eager" and "mat1 and mat2 shapes cannot be multiplied" in doc["eager_error"]
    doc = report(results, "args", 0)  # `-- --fixed` fixes the shapes
    assert doc["argv"] == ["--fixed"] and doc["findings"] == []


def test_bad_command_lines_exit_2(tmp_path, capsys):
    assert main(["triage", str(tmp_path / "missing.py")]) == 2
    script = tmp_path / "s.py"
    script.write_text("x = 1\n")
    assert main(["triage", str(script), "--entry", "nope"]) == 2
    assert "defines no function 'nope'" in capsys.readouterr().err


def test_recompile_records_are_grouped_per_guarded_value():
    def event(guard: str) -> LogEvent:
        return LogEvent("recompile", "Recompiling function f in /m.py:3\n    triggered by the following guard "
                                     f"failure(s):\n    - 0/1: {guard}\n    - 0/0: older", (None, "m.py:9 in main"))

    found = recompiles.collect([event("L['n'] == 2"), event("L['n'] == 3"),
                                event("tensor 'x' stride mismatch at index 0. expected 1, actual 2")])
    assert [f.title.split(": ", 1)[1] for f in found] == ["int value changed (2 recompiles)", "stride changed"]
    assert found[0].where == "m.py:9 in main" and ".contiguous()" in found[1].fix
