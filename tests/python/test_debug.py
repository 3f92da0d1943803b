"""GRAPHEX_LOG and dumps: what a user debugging a capture can see."""

from __future__ import annotations

import re

import pytest
import torch

from graphex.base.warn import GraphexWarning
from conftest import compile_graphex


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def model(x, y):
    h = torch.relu(x @ y)
    return h.sum(-1), h


def test_log_level_1_prints_one_line_per_capture(monkeypatch, capfd):
    monkeypatch.setenv("GRAPHEX_LOG", "1")
    compiled = compile_graphex(model)
    compiled(torch.randn(2, 3), torch.randn(3, 4))
    compiled(torch.randn(2, 3), torch.randn(3, 4))  # replay: no new line
    compiled(torch.randn(5, 3), torch.randn(3, 4))  # new shape: a second capture
    lines = [l for l in capfd.readouterr().err.splitlines() if "captured" in l]
    assert len(lines) == 2, lines
    pattern = r"\[graphex\] graph_\d+: captured (\d+) ops, 2 inputs, 2 outputs in [\d.]+ ms"
    assert all(re.search(pattern, l) for l in lines), lines


def test_log_level_2_adds_one_line_per_op(monkeypatch, capfd):
    monkeypatch.setenv("GRAPHEX_LOG", "2")
    compile_graphex(model)(torch.randn(2, 3), torch.randn(3, 4))
    err = capfd.readouterr().err
    assert re.search(r"mm\w*: aten::mm\.default\(%\d+, %\d+\)\s+# .*test_debug.py:\d+ in model", err), err
    assert "aten::relu.default" in err


def test_log_off_is_silent(capfd):
    compile_graphex(model)(torch.randn(2, 3), torch.randn(3, 4))
    assert "[graphex]" not in capfd.readouterr().err


@pytest.mark.parametrize("how", ["option", "env"])
def test_dump_writes_readable_graph_and_plan(tmp_path, monkeypatch, how):
    target = tmp_path / "dumps"
    if how == "env":
        monkeypatch.setenv("GRAPHEX_DUMP", str(target))
        compiled = compile_graphex(model)
    else:
        compiled = compile_graphex(model, dump_dir=str(target))
    compiled(torch.randn(2, 3), torch.randn(3, 4))
    code = next(target.glob("graph_*.py")).read_text()
    plan = next(target.glob("graph_*.plan.txt")).read_text()
    assert "torch.ops.aten.mm.default" in code and "test_debug.py" in code
    assert "aten::mm.default(" in plan and "return (" in plan
    compile(code.split("class ", 1)[0], "dump", "exec")  # the header is valid Python (comments)
    assert not list(target.glob(".tmp-*")), "a temporary file was left behind"


def test_unwritable_dump_dir_warns_once_at_the_users_line(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("GRAPHEX_DUMP", str(blocker / "dumps"))  # under a file: cannot be created
    compiled = compile_graphex(model)
    with pytest.warns(GraphexWarning) as record:
        out = compiled(torch.randn(2, 3), torch.randn(3, 4))  # the user's line
        compiled(torch.randn(5, 3), torch.randn(3, 4))        # a second capture: no second warning
    assert len(out) == 2
    [w] = [w for w in record if "cannot write graph dumps" in str(w.message)]
    assert "a_file" in str(w.message) and "GRAPHEX_DUMP" in str(w.message)
    assert w.filename == __file__ and w.lineno == _line_of("out = compiled(")


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)
