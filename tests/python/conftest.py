"""Shared fixtures and helpers for graphex's Python tests."""

from __future__ import annotations

import collections
import gc
import os
import sys
from typing import Any

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # examples.models

import graphex  # noqa: E402
from graphex.base import warn as _warn  # noqa: E402
from graphex.runtime import CompiledGraph, live_graphs  # noqa: E402


def require(module: str) -> Any:
    """Import a test-only dependency that `make test` installs (bench/requirements.txt: transformers, and
    safetensors with it): missing is a failure that says how to install it, never a skip (a skipped test would
    pass for a check that did not run)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} is not installed ({e}): `make test` installs it "
                    "(.venv/bin/pip install -r bench/requirements.txt)", pytrace=False)


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    """Each test compiles from scratch, with graphex logging off unless it asks for it."""
    monkeypatch.delenv("GRAPHEX_LOG", raising=False)
    monkeypatch.delenv("GRAPHEX_DUMP", raising=False)
    torch._dynamo.reset()
    # reset() drops every compile callback, graphex's custom-op explanations included; they come back at
    # the next graphex compile or, as here and in graphex's tools, right after the reset.
    graphex.custom_ops.install_trace_checks()
    _warn.reset()
    yield
    torch._dynamo.reset()


# Note [Fused kernels are close, not bitwise] (csrc/fused/library.cpp): what one fused op promises against eager,
# elementwise, per dtype: float32 1e-5 (atol = rtol); bfloat16 / float16 4 eps of the dtype (Note [Reduced precision
# runs the float32 rows], csrc/fused/rows.h). One definition, read by every fused-kernel test.
FUSED_OP_TOL_FLOAT32 = 1e-5
FUSED_OP_EPS_REDUCED = 4


def fused_op_tol(dtype: torch.dtype) -> float:
    """atol = rtol for one fused op's output of `dtype`."""
    if dtype in (torch.bfloat16, torch.float16):
        return FUSED_OP_EPS_REDUCED * torch.finfo(dtype).eps
    return FUSED_OP_TOL_FLOAT32


def compile_graphex(model: Any, *, dynamic: bool = False, **options: Any) -> Any:
    return torch.compile(model, backend="graphex", fullgraph=True, dynamic=dynamic, options=options or None)


def captures() -> list[CompiledGraph]:
    """CompiledGraph objects alive now, oldest first."""
    gc.collect()
    return live_graphs()


def newest_capture() -> CompiledGraph:
    """The CompiledGraph made last (captures()[-1] without its gc.collect, which takes 0.1-0.25 s in a worker that
    has compiled many graphs: the newest graph is alive while its compiled callable is, and a garbage collection
    only drops older ones)."""
    graphs = live_graphs()
    assert graphs, "no CompiledGraph is alive: nothing was compiled by graphex"
    return graphs[-1]


def fused_ops(gm: torch.fx.GraphModule) -> collections.Counter[str]:
    """The graphex_fused ops in a captured graph, by name: what fused mode fired there."""
    return collections.Counter(n.target._opname for n in gm.graph.nodes
                               if n.op == "call_function" and getattr(n.target, "namespace", "") == "graphex_fused")


def engine_runs() -> int:
    """Runs of the C++ engine so far in this process (proves the engine, not a fallback, ran)."""
    return graphex._C.total_run_count()


def assert_same(actual: Any, expected: Any, path: str = "output") -> None:
    """Bitwise equality (values, dtype, shape; strides for tensors) through nested containers."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual).__name__}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        assert torch.equal(actual, expected), f"{path}: values differ (max abs diff " \
            f"{(actual.double() - expected.double()).abs().max().item() if actual.is_floating_point() else 'n/a'})"
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), f"{path}: {actual!r} vs {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys(), f"{path}: keys differ"
        for k in expected:
            assert_same(actual[k], expected[k], f"{path}[{k!r}]")
    else:
        assert actual == expected and type(actual) is type(expected), f"{path}: {actual!r} != {expected!r}"


def torch_cmake_defines() -> list[str]:
    """CMake `-D` arguments find_package(Torch) needs for this torch (a CUDA build: the toolkit and pip's
    libnvrtc), for tests that configure CMake projects of their own (scripts/cmake_args_for_torch.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cmake_args_for_torch",
                                                  os.path.join(ROOT, "scripts", "cmake_args_for_torch.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cmake_defines()
