"""`graphex --help` answers at once (torch is not imported) and speaks about tasks, not modules."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("args", [["--help"], [], ["check", "--help"], ["new", "--help"], ["export", "--help"]])
def test_help_does_not_import_torch(args):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "graphex", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: graphex" in proc.stdout
    assert not re.search(r"\|\s+torch$", proc.stderr, re.MULTILINE), "torch was imported for --help"
    assert "graphex/tools" not in proc.stdout and "tools/" not in proc.stdout  # no module talk


def test_top_level_help_lists_what_each_command_is_for():
    out = subprocess.run([sys.executable, "-m", "graphex", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    for line in ("graphex new op NS::NAME", "graphex check SCRIPT", "graphex triage SCRIPT", "graphex cache ls|clear"):
        assert line in out, out


def test_export_options_take_json_and_pythons_spellings_of_its_constants():
    """`--option pattern_fusion_pass=True` failed with "must be bool, got 'True'" (a helper's find): VALUE is JSON,
    and True, False and None are taken as Python writes them."""
    from graphex.tools.export_cli import _options

    assert _options(["pattern_fusion_pass=True", "a=false", "b=None", "c=3", "d=[1, 2]", "e=name"]) == {
        "pattern_fusion_pass": True, "a": False, "b": None, "c": 3, "d": [1, 2], "e": "name"}
