"""`graphex triage`: each fixture script in triage_scripts/ gets the findings, source lines, fixes,
bisection verdict and exit code it should.

Every triage runs in its own interpreter (`python -m graphex triage`), as a user runs it; the
runs are started together once per module, two at a time, and each test reads its result.
Every fix triage prints is then applied to a copy of its script, as the fix says, and that copy
is triaged again (a second round, also once per module): the fix must make the finding go away.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from graphex import compat
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
    "fusion": ["fusion_wrong_pattern.py"],
    "engine_kernel": ["engine_only_wrong_kernel.py"],
    "cond": ["capture_cond.py", "--no-bisect"],
    "eager_fails": ["fails_in_eager.py"],
    "args": ["fails_in_eager.py", "--no-bisect", "--", "--fixed"],
    "stateful": ["stateful_decode.py"],
    "deliberate_clone": ["kept_deliberate_clone.py", "--no-bisect"],
    "position_dynamic": ["decode_position_dynamic.py", "--no-bisect"],
    "position_tensor": ["position_as_tensor.py", "--no-bisect"],
    "rnn": ["rnn_lstm.py"],
}


def _finding_fix(doc: dict, kind: str, needle: str) -> str:
    fixes = [f["fix"] for f in doc["findings"] if f["kind"] == kind and needle in f["fix"]]
    assert fixes, f"no {kind} fix mentioning {needle!r}: {json.dumps(doc['findings'], indent=1)[:3000]}"
    return fixes[0]


def _add_line_after_imports(source: str, line: str) -> str:
    return source.replace("import torch\n", f"import torch\n\n{line}\n", 1)


def _fix_recompile(doc: dict, source: str) -> str:
    """'add the line torch.compiler.config.dynamic_sources = "L['steps']" before the first call', and
    'call torch._dynamo.mark_dynamic(x, 0) before the first call'."""
    line = re.search(r"torch\.compiler\.config\.dynamic_sources = \"[^\"]+\"",
                     _finding_fix(doc, "recompile", "dynamic_sources"))[0]
    mark = re.search(r"torch\._dynamo\.mark_dynamic\(x, 0\)", _finding_fix(doc, "recompile", "mark_dynamic"))[0]
    source = source.replace("    x = torch.randn(4, 8)\n", f"    x = torch.randn(4, 8)\n    {mark}\n")
    return _add_line_after_imports(source, line)


def _fix_position_tensor(doc: dict, source: str) -> str:
    """Pass pos as a Python int, mark it dynamic, index with t.select(DIM, pos)."""
    fix = _finding_fix(doc, "capture", "dynamic_sources")
    assert "Pass pos as a Python int" in fix and "t.select(DIM, pos)" in fix
    line = re.search(r"torch\.compiler\.config\.dynamic_sources = \"[^\"]+\"", fix)[0]
    source = source.replace("torch.tensor(pos))", "pos)").replace("cache[:, pos]", "cache.select(1, pos)")
    return _add_line_after_imports(source, line)


def _fix_position_dynamic(doc: dict, source: str) -> str:
    assert "t.select(DIM, pos).copy_(v)" in _finding_fix(doc, "recompile", "select")
    return source.replace("cache[:, pos] = x", "cache.select(1, pos).copy_(x)")


def _fix_rnn(doc: dict, source: str) -> str:
    line = re.search(r"torch\._dynamo\.config\.allow_rnn = True", _finding_fix(doc, "graph-break", "allow_rnn"))[0]
    return _add_line_after_imports(source, line)


def _fix_schema(doc: dict, source: str) -> str:
    fix = _finding_fix(doc, "accuracy", "custom_op(")
    decorator = next(line for line in fix.splitlines() if line.startswith("@torch.library.custom_op("))
    return re.sub(r"^@torch\.library\.custom_op\(.*$", decorator, source, count=1, flags=re.M)


def _fix_kept_copy(doc: dict, source: str) -> str:
    assert "remove options={'input_inplace_pass': False}" in _finding_fix(doc, "kept-copy", "remove options")
    return source.replace(',\n                                   options={"input_inplace_pass": False}', "")


# name of the applied fix -> (the run whose printed fix it applies, its script, the edit, triage flags)
FIXED = {
    "recompile": ("recompile", "recompile_int.py", _fix_recompile, ["--no-bisect"]),
    "position_tensor": ("position_tensor", "position_as_tensor.py", _fix_position_tensor, ["--no-bisect"]),
    "position_dynamic": ("position_dynamic", "decode_position_dynamic.py", _fix_position_dynamic, ["--no-bisect"]),
    "rnn": ("rnn", "rnn_lstm.py", _fix_rnn, []),
    "schema": ("accuracy", "accuracy_lying_schema.py", _fix_schema, []),
    "kept": ("kept", "kept_copy.py", _fix_kept_copy, ["--no-bisect"]),
}


def _triage(argv: list[str], cwd: str = SCRIPTS) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHEX_LOG", "GRAPHEX_DUMP", "TORCH_LOGS")}
    return subprocess.run([sys.executable, "-m", "graphex", "triage", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def results() -> dict[str, subprocess.CompletedProcess[str]]:
    def one(item: tuple[str, list[str]]) -> tuple[str, subprocess.CompletedProcess[str]]:
        name, argv = item
        return name, _triage(argv if name.endswith("_text") else [*argv[:1], "--json", *argv[1:]])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, RUNS.items()))


@pytest.fixture(scope="module")
def fixed(results, tmp_path_factory) -> dict[str, subprocess.CompletedProcess[str] | BaseException]:
    """Each printed fix applied to a copy of its script, and the copy triaged again."""
    folder = tmp_path_factory.mktemp("fixed")
    todo, out = [], {}
    for name, (run, script, edit, flags) in FIXED.items():
        try:
            with open(os.path.join(SCRIPTS, script)) as f:
                source = f.read()
            edited = edit(json.loads(results[run].stdout), source)
            assert edited != source, f"the fix for {name} changed nothing in {script}"
        except BaseException as e:  # noqa: BLE001  (reported by the test that reads it)
            out[name] = e
            continue
        (folder / script).write_text(edited)
        todo.append((name, [script, "--json", *flags]))

    def one(item: tuple[str, list[str]]) -> tuple[str, subprocess.CompletedProcess[str]]:
        return item[0], _triage(item[1], cwd=str(folder))

    with ThreadPoolExecutor(max_workers=2) as pool:
        out.update(pool.map(one, todo))
    return out


def after_fix(fixed, name: str, exit_code: int) -> dict:
    proc = fixed[name]
    if isinstance(proc, BaseException):
        raise proc
    assert proc.returncode == exit_code, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)


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
    # the script's compile failed: the summary reports that, not "every stage matches"
    (b,) = doc["bisections"]
    assert "Data-dependent branching" in b["failed_in_script"]
    assert "every stage matches" not in doc["summary"] and "Gate failed in the script" in doc["summary"]


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
    assert "torch.compiler.config.dynamic_sources = \"L['steps']\"" in ints["fix"]
    assert "torch.tensor(" not in ints["fix"]  # a tensor breaks slicing (GuardOnDataDependentSymNode)
    assert "size mismatch at index 0. expected 4, actual 6" in shape["detail"]
    assert shape["where"].startswith(line_of("recompile_int.py", "torch.randn(6, 8)"))
    assert "mark_dynamic(x, 0)" in shape["fix"] and "pad" in shape["fix"]


def test_custom_op_without_fake_shows_the_fake_to_paste(results):
    doc = report(results, "no_fake", 1)
    (f,) = of_kind(doc, "custom-op")
    assert f["title"] == "custom op triage_nofake::scale_rows has no fake function"
    assert f["where"].startswith(line_of("custom_op_no_fake.py", "torch.ops.triage_nofake.scale_rows"))
    assert f["fix"].startswith("import torch\n\n\n@scale_rows.register_fake\ndef _(x, w):")
    assert f["op"] == "triage_nofake::scale_rows"
    assert of_kind(doc, "graph-break") == []  # the trace error is not reported twice


def test_fake_that_lies_is_reported_and_bisected_to_the_replay(results):
    doc = report(results, "lying_fake", 1)
    (f,) = of_kind(doc, "custom-op")
    assert "triage_lyingfake::row_norm has a fake/Meta function that disagrees with its real kernel" in f["title"]
    assert "real kernel: float32[4] on cpu" in f["fix"] and "fake:        float32[4, 8]" in f["fix"]
    assert f["op"] == "triage_lyingfake::row_norm"
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
    # the op whose schema lies is named, with the registration to paste
    assert f["op"] == b["op"] == "triage_lyingschema::bump"
    assert "custom op triage_lyingschema::bump breaks its schema: the kernel wrote x" in f["fix"]
    assert '@torch.library.custom_op("triage_lyingschema::bump", mutates_args=("x",))' in f["fix"]


def test_a_wrong_fused_pattern_is_bisected_to_pattern_fusion(results):
    doc = report(results, "fusion", 1)
    (b,) = doc["bisections"]
    assert b["culprit"] == "force_eager" and b["problem"] and b["max_abs"] == pytest.approx(2.0)
    assert b["stages"]["aot_eager"] == "bitwise equal"
    # pattern fusion alone is named: CSE and reinplacing ran too (h has two readers) and are not the cause
    assert "With options={'pattern_fusion_pass': False}, force_eager matches eager again." in b["meaning"]
    assert "Pattern fusion (pattern_fusion_pass) is the cause" in b["meaning"]
    assert "No single pass explains it" not in b["meaning"] and "'cse': False" not in b["meaning"]
    (f,) = of_kind(doc, "accuracy")
    assert f["problem"] and "pattern_fusion_pass" in f["fix"]


def test_bisection_switches_off_every_pass_the_pipeline_runs(monkeypatch):
    from graphex import passes
    from graphex.options import Options
    from graphex.tools.triaging import bisect

    listed = bisect.bisected_passes()
    assert listed == tuple(option for p in passes.PIPELINE for option in p.options)
    assert {"cse", "pattern_fusion_pass", "remove_noop_ops", "inplace_pass", "input_inplace_pass",
            "post_grad_custom_pre_pass", "post_grad_custom_post_pass"} <= set(listed)
    for option in listed:  # each is an option, and its "off" value is one Options accepts and means off
        assert not passes.is_on(getattr(Options.from_user({option: passes.switched_off(option)}), option))
    # the list is read from the pipeline, not a copy of it: a pass added there is bisected too
    extra = passes.Pass("a new pass", ("clone_output",), lambda run: None)
    monkeypatch.setattr(passes, "PIPELINE", (*passes.PIPELINE, extra))
    assert bisect.bisected_passes() == (*listed, "clone_output")


def test_wrong_kernel_only_the_engine_calls_is_named_by_the_per_op_step(results):
    doc = report(results, "engine_kernel", 1)
    (b,) = doc["bisections"]
    assert b["culprit"] == "replay" and b["problem"] and b["stages"]["force_eager"] == "bitwise equal"
    # deep in the model (block 2 of 4): the per-op dumps name the planted op, not the output
    assert b["op"] == "triage_plant::scale"
    assert b["first_op"].startswith("the first op whose output differs from eager is node 'scale' (triage_plant::scale")
    (f,) = of_kind(doc, "accuracy")
    assert f["op"] == "triage_plant::scale" and f["fix"].startswith(b["first_op"])


def test_schema_fix_applied_makes_every_stage_match(fixed):
    doc = after_fix(fixed, "schema", 0)
    assert not [f for f in doc["findings"] if f["problem"]] and doc["bisections"][0]["culprit"] == ""


def test_kept_copy_option_fix_applied_removes_the_copy(fixed):
    doc = after_fix(fixed, "kept", 0)
    assert of_kind(doc, "kept-copy") == []


def test_recompile_fixes_applied_leave_one_graph(fixed):
    doc = after_fix(fixed, "recompile", 0)  # the int marked dynamic, the batch dim marked dynamic
    assert all(not f["problem"] for f in doc["findings"])  # at most Dynamo's 0/1 specialization, as a note


def test_stateful_step_passed_in_bisects_clean(results):
    """A KV-cache object passed in and a tensor attribute, both updated in place: restored for every rerun."""
    doc = report(results, "stateful", 0)
    assert doc["findings"] == []
    (b,) = doc["bisections"]
    assert b["culprit"] == "" and b["stages"] == {"eager": "deterministic", "aot_eager": "bitwise equal",
                                                   "force_eager": "bitwise equal", "replay": "bitwise equal"}


def test_a_copy_the_user_wrote_is_a_note_not_a_problem(results):
    doc = report(results, "deliberate_clone", 0)
    (f,) = of_kind(doc, "kept-copy")
    assert not f["problem"] and "the copy your code makes" in f["title"]
    assert f["where"].startswith(line_of("kept_deliberate_clone.py", "y = x.clone()"))


def test_dynamic_true_is_not_advised_again(results, fixed):
    doc = report(results, "position_dynamic", 1)
    notes = [f for f in of_kind(doc, "recompile") if not f["problem"]]
    (problem,) = [f for f in of_kind(doc, "recompile") if f["problem"]]
    assert all("0/1 specialization" in f["fix"] for f in notes)
    assert "dynamic=True" not in problem["fix"].replace("already dynamic (dynamic=True", "")
    assert line_of("decode_position_dynamic.py", "cache[:, pos] = x  # an int") in problem["detail"]
    doc = after_fix(fixed, "position_dynamic", 0)
    assert all(not f["problem"] for f in doc["findings"])


def _tensor_position_slicing_compiles() -> bool:
    """Whether this torch compiles a slice bound taken from a 0-dim tensor through AOTAutograd (2.14 does;
    2.13 raises GuardOnDataDependentSymNode)."""
    import torch

    def attend(cache, pos):
        return cache[:, : pos + 1].sum() + cache[:, pos].sum()

    torch._dynamo.reset()
    try:
        torch.compile(attend, backend="aot_eager", fullgraph=True, dynamic=False)(torch.randn(2, 16, 8), torch.tensor(3))
        return True
    except Exception:
        return False
    finally:
        torch._dynamo.reset()


def test_position_as_tensor_has_a_reason_and_a_fix_that_works(results, fixed):
    if _tensor_position_slicing_compiles():  # nothing to fix on this torch: triage must say so
        doc = report(results, "position_tensor", 0)
        assert doc["findings"] == [] and doc["status"] == "ran"
        return
    doc = report(results, "position_tensor", 1)
    (f,) = of_kind(doc, "capture")
    assert "GuardOnDataDependentSymNode: Could not extract specialized integer" in f["title"]
    assert f["where"].startswith(line_of("position_as_tensor.py", "cache[:, pos]"))
    doc = after_fix(fixed, "position_tensor", 0)  # the script's own assert checks results against eager
    assert doc["findings"] == [] and doc["status"] == "ran"


def test_rnn_tells_about_allow_rnn_and_the_fix_captures_it(results, fixed):
    doc = report(results, "rnn", 1)
    (f,) = of_kind(doc, "graph-break")
    assert f["title"] == "Attempted to wrap RNN, GRU, or LSTM" and "allow_rnn = True" in f["fix"], f
    assert f["where"].startswith(line_of("rnn_lstm.py", "self.rnn(x)"))
    (b,) = doc["bisections"]
    if compat.TORCH_VERSION >= (2, 15):
        # Dynamo 2.15 delays the break and compiles what follows the LSTM (the Linear head) through graphex: that part
        # was captured and is compared; the summary still says the script's compile failed, not "every stage matches"
        assert b["stages"]["replay"] == "bitwise equal" and "failed in the script" in doc["summary"], b
    else:  # nothing of graphex ran: not reported as a match
        assert b["stages"]["replay"].startswith("graphex captured no graph"), b
    assert "every stage matches" not in doc["summary"]
    doc = after_fix(fixed, "rnn", 0)
    assert doc["findings"] == [] and doc["bisections"][0]["stages"]["replay"] == "bitwise equal"


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


def test_state_snapshot_restores_objects_attributes_and_rebinding():
    from graphex.tools.triaging.state import snapshot

    class Cache:
        def __init__(self):
            self.k, self.items = torch.zeros(3), [torch.ones(2)]

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.count = torch.zeros(())  # not a buffer
            self.register_buffer("buf", torch.zeros(2))

    m, cache = M(), Cache()
    k, count = cache.k, m.count
    snap = snapshot(m, m, (torch.zeros(1), cache), {})
    cache.k.add_(1), cache.items[0].mul_(3), m.buf.fill_(7)
    m.count = m.count + 1  # rebound, not updated in place
    assert set(snap.current()) == {"state input 1.k", "state input 1.items[0]", "state self.count", "state self.buf"}
    snap.restore()
    assert cache.k is k and m.count is count
    assert torch.equal(k, torch.zeros(3)) and torch.equal(cache.items[0], torch.ones(2))
    assert torch.equal(m.buf, torch.zeros(2)) and torch.equal(m.count, torch.zeros(()))


def test_kept_copy_findings_read_the_decision_fields():
    """The fix and the source line come from KeptCopy's fields, whatever its sentence says."""
    from types import SimpleNamespace

    from graphex.passes import KeptCopy
    from graphex.tools.triaging.capture import kept_copy_findings

    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    copies = [KeptCopy("graph input cache", "switched off", cause="option", node="add", where="m.py:3 in f: y",
                       option="inplace_pass"),
              KeptCopy("graph input z", "someone else's words", cause="read-later", node="add", reader="mul_3",
                       where="m.py:9 in f: z * 2")]
    found = kept_copy_findings([SimpleNamespace(name="graph_0", gm=gm, kept_copies=copies)])
    assert "remove options={'inplace_pass': False}" in found[0].fix and found[0].where == "m.py:3 in f: y"
    assert "mul_3" in found[1].fix and found[1].node == "add"


def test_kept_copies_the_code_asks_for_are_notes_with_no_fix_to_make():
    """own-source and overlaps-itself (Note [Reinplacing decides and records in one place]) are copies the user's
    code implies: reported as notes (exit code 0), each with why nothing needs fixing."""
    from types import SimpleNamespace

    from graphex.passes import KeptCopy
    from graphex.tools.triaging.capture import kept_copy_findings

    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    copies = [KeptCopy("graph input x", "it reads what it overwrites", cause="own-source", node="add"),
              KeptCopy("graph input y", "its elements share memory", cause="overlaps-itself", node="add"),
              KeptCopy("graph input z", "not proven", cause="unproven", node="add")]
    found = kept_copy_findings([SimpleNamespace(name="graph_0", gm=gm, kept_copies=copies)])
    assert [f.problem for f in found] == [False, False, True]
    assert found[0].fix.startswith("none needed") and "x[1:] = x[:-1]" in found[0].fix
    assert found[1].fix.startswith("none needed") and ".contiguous()" in found[1].fix
