"""The installed CMake package: `cmake --install build/py --component deploy` then a consumer project
(tests/cmake_consumer: one main.cpp, find_package(graphex), graphex::graphex, no Python) is configured,
built and run on an exported artifact; its output is bitwise equal to eager. One CMake build (~10-60 s):
the slow test of this file, named so (test_slow_...)."""

import os
import shutil
import subprocess

import pytest
import torch

import graphex
from graphex.exporting import load_safetensors, safetensors_bytes

from conftest import ROOT, torch_cmake_defines

BUILD = os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py")  # make test-torch: build/torchX


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_slow_cmake_find_package_consumer_builds_and_runs_bitwise_equal_to_eager(tmp_path):
    assert os.path.exists(os.path.join(BUILD, "CMakeCache.txt")), "not built: pip install --no-build-isolation -e ."
    cmake = shutil.which("cmake")
    prefix = tmp_path / "prefix"
    _run([cmake, "--install", BUILD, "--component", "deploy", "--prefix", str(prefix)])
    assert (prefix / "lib" / "cmake" / "graphex" / "graphexConfig.cmake").exists()
    assert (prefix / "bin" / "graphex-run").exists() and (prefix / "include" / "graphex" / "graphex.h").exists()
    # Note [The deploy package holds no Python]: nothing of Python or pybind11 in the library.
    nm = _run(["nm", "-C", "--undefined-only", str(prefix / "lib" / "libgraphex_core.a")]).stdout
    python_symbols = [w for line in nm.splitlines() for w in line.split()[-1:] if w.startswith(("Py", "_Py"))]
    assert not python_symbols, python_symbols[:5]
    assert "pybind11" not in nm

    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run([cmake, "-S", os.path.join(ROOT, "tests", "cmake_consumer"), "-B", str(tmp_path / "build"), *generator,
          f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release", *torch_cmake_defines()])
    _run([cmake, "--build", str(tmp_path / "build")])

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    path = graphex.export(model, (x,), tmp_path / "mlp.graphex")
    x2 = torch.randn(3, 8)
    (tmp_path / "in.safetensors").write_bytes(safetensors_bytes({"0": x2}))
    _run([str(tmp_path / "build" / "consumer"), path, str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors")])
    with torch.no_grad():
        assert torch.equal(load_safetensors(tmp_path / "out.safetensors")["0"], model(x2))
