"""examples/deploy (`make deploy-demo`): the shipped decoder exported from Python, a C++ program built
against the installed graphex package (find_package(graphex)) with the example operator library linked
in, generating tokens equal to eager PyTorch's. One CMake build: the slow test of this file."""

import os
import subprocess
import sys

from conftest import ROOT


def test_slow_deploy_demo_cpp_tokens_equal_python(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "examples.deploy.demo", "--steps", "12", "--work", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "deploy-demo: 12 tokens, C++ equal to Python" in proc.stdout
    # The custom operators came from the linked-in library (no --load-library, no dlopen in decode.cpp).
    ldd = subprocess.run(["ldd", str(tmp_path / "build" / "decode")], capture_output=True, text=True).stdout
    assert "libgraphex_example_ops.so" in ldd and "libpython" not in ldd
