"""Note [Layers only look down] (pyproject.toml, [tool.importlinter]): graphex's modules import only the layers
below them; the contracts run here with import-linter, so a climbing import fails `make test` naming the chain."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lint(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    proc = _lint("--no-cache")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in proc.stdout, proc.stdout[-2000:]


def test_a_climbing_import_breaks_a_contract(tmp_path):
    """The contracts can fail: the same check over a copy of graphex whose errors.py imports the runtime."""
    import shutil

    copy = tmp_path / "graphex"
    shutil.copytree(os.path.join(ROOT, "graphex"), copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "_sim"))
    with open(copy / "errors.py", "a") as f:
        f.write("\nfrom .runtime import live_graphs  # climbs three layers\n")
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    # the copy, not the installed graphex: the editable install's import finder is dropped first
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("
            "'_editable_')]; sys.path.insert(0, '.'); from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())")
    proc = subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "graphex.errors is not allowed to import graphex.runtime" in proc.stdout, proc.stdout[-3000:]
