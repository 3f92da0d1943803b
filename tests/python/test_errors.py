"""Errors name the op or input at fault, the user's source line, and the fix."""

from __future__ import annotations

import pytest
import torch

import graphex
from conftest import compile_graphex

HERE = __file__.rsplit("/", 1)[-1]


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def test_data_dependent_branch_names_the_line_and_the_fix():
    def f(x):
        if x.sum().item() > 0:  # data-dependent: cannot be one static graph
            return x + 1
        return x - 1

    with pytest.raises(Exception) as info:
        compile_graphex(f)(torch.randn(4))
    message = str(info.value)
    assert f"{HERE}" in message and "if x.sum().item() > 0" in message
    assert "torch._check" in message or "torch.cond" in message


def test_control_flow_op_is_a_capture_error_with_line_and_fix():
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))

    with pytest.raises(graphex.CaptureError) as info:
        compile_graphex(f)(torch.randn(4))
    message = str(info.value)
    assert "cond" in message
    assert f"{HERE}:" in message and "torch.cond(" in message
    assert "fix:" in message and "force_eager" in message


def test_operator_without_a_kernel_for_the_device_is_named():
    lib = torch.library.Library("graphex_test_nokernel", "FRAGMENT")
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: torch.empty_like(x), "Meta")

    def f(x):
        return torch.ops.graphex_test_nokernel.double(x) + 1

    with pytest.raises(graphex.CaptureError) as info:
        compile_graphex(f)(torch.randn(3))
    message = str(info.value)
    assert "graphex_test_nokernel::double" in message and "no kernel for CPU" in message
    assert f"{HERE}:" in message and "register" in message


def test_failing_operator_at_replay_names_node_and_line():
    def f(x, idx):
        return x.index_select(0, idx) * 2

    compiled = compile_graphex(f)
    x = torch.randn(4)
    compiled(x, torch.tensor([0, 3]))
    with pytest.raises(graphex.ReplayError) as info:
        compiled(x, torch.tensor([0, 9]))  # out of range: the kernel itself fails
    message = str(info.value)
    assert "aten::index_select" in message
    assert f"{HERE}:" in message and "x.index_select(0, idx)" in message
    assert "out of range" in message or "index" in message.lower()


# -- Note [A replay error keeps its cause] ------------------------------------------------------------
# An operator failing at replay fails as in eager (same class family, eager's message kept), plus
# graphex's node, op and the user's source line; never a Python stack in the message.

def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the test compares whatever eager raises
        return e
    raise AssertionError(f"{fn} raised nothing")


def assert_fails_like_eager(compiled, eager, *args, op: str, line: str):
    expected = _raised(eager, *args)
    error = _raised(compiled, *args)
    assert isinstance(error, graphex.ReplayError), f"{type(error).__name__}: {error}"
    assert isinstance(error, type(expected)), f"{type(error).__mro__} is not a {type(expected).__name__}"
    message = str(error)
    assert str(expected).strip().rstrip(".") in message, f"eager's {str(expected)!r} not in {message!r}"
    assert "At:" not in message and "Traceback" not in message, message
    assert error.finding.op.startswith(op) and f"({error.finding.op})" in message
    assert error.finding.node and f"'{error.finding.node}'" in message
    assert error.finding.what and error.finding.what in message
    assert f"{HERE}:" in message and line in message and line in error.finding.where
    return error


def test_dtype_mismatch_keeps_the_kernels_message():
    # The graph for float64 is a new capture whose first replay runs under AOTAutograd's checking
    # mode (a Python dispatch mode): the kernel's error used to arrive empty through it.
    lin = torch.nn.Linear(4, 4)

    def f(x):
        return torch.nn.functional.linear(x, lin.weight, lin.bias)

    compiled = compile_graphex(f)
    compiled(torch.randn(2, 4))
    error = assert_fails_like_eager(compiled, f, torch.randn(2, 4, dtype=torch.float64),
                                    op="aten::addmm", line="torch.nn.functional.linear(x, lin.weight, lin.bias)")
    assert "must have the same dtype" in error.finding.what


def test_index_error_stays_an_index_error_on_first_and_later_calls():
    def f(x, idx):
        return x.index_select(0, idx) * 2

    x = torch.randn(4)
    compiled = compile_graphex(f)
    error = assert_fails_like_eager(compiled, f, x, torch.tensor([0, 9]),  # the first replay fails
                                    op="aten::index_select", line="x.index_select(0, idx)")
    assert isinstance(error, IndexError) and isinstance(error, graphex.GraphexError)
    assert type(error) is graphex.errors.ReplayIndexError
    compiled(x, torch.tensor([0, 3]))
    error = assert_fails_like_eager(compiled, f, x, torch.tensor([0, 9]),  # a later replay fails
                                    op="aten::index_select", line="x.index_select(0, idx)")
    assert type(error) is graphex.errors.ReplayIndexError


# Ops whose fake promises what the kernel does not deliver: the only way a broadcast or a view
# that traced fine can fail at replay (validate_fake, on by default, checks sizes only on the first call).
_lib = torch.library.Library("graphex_test_replay", "FRAGMENT")
_lib.define("shorter(Tensor x) -> Tensor")
_lib.impl("shorter", lambda x: x[1:] * 1, "CPU")
_lib.impl("shorter", lambda x: torch.empty_like(x), "Meta")
_lib.define("transposed(Tensor x) -> Tensor")
_lib.impl("transposed", lambda x: x.t().contiguous().t(), "CPU")  # same sizes, transposed strides
_lib.impl("transposed", lambda x: torch.empty_like(x), "Meta")
_lib.define("checked(Tensor x) -> Tensor")


def _checked(x):
    if x.dtype == torch.int64:
        raise TypeError("checked: integer tensors are not supported")
    if x.dim() != 1:
        raise NotImplementedError("checked: only 1-d tensors")
    if x.sum() > 100:
        raise ValueError("checked: the sum is too large")
    return x * 2


_lib.impl("checked", _checked, "CPU")
_lib.impl("checked", lambda x: torch.empty_like(x), "Meta")


def test_broadcast_failure_keeps_the_kernels_message():
    def f(x):
        return torch.ops.graphex_test_replay.shorter(x) + x

    compiled = compile_graphex(f, validate_fake=False)
    error = assert_fails_like_eager(compiled, f, torch.randn(4), op="aten::add",
                                    line="torch.ops.graphex_test_replay.shorter(x) + x")
    assert "must match the size" in error.finding.what


def test_bad_view_keeps_the_kernels_message():
    def f(x):
        return torch.ops.graphex_test_replay.transposed(x).view(-1)

    compiled = compile_graphex(f)
    error = assert_fails_like_eager(compiled, f, torch.randn(3, 4), op="aten::view",
                                    line="torch.ops.graphex_test_replay.transposed(x).view(-1)")
    assert "view size is not compatible" in error.finding.what


@pytest.mark.parametrize("bad, kind", [(torch.full((3,), 50.0), ValueError),
                                       (torch.ones(3, dtype=torch.int64), TypeError),
                                       (torch.ones(2, 2), NotImplementedError)])
def test_python_kernel_error_keeps_its_class_and_names_the_kernel_line(bad, kind):
    def f(x):
        return torch.ops.graphex_test_replay.checked(x) + 1

    compiled = compile_graphex(f)
    error = assert_fails_like_eager(compiled, f, bad, op="graphex_test_replay::checked",
                                    line="torch.ops.graphex_test_replay.checked(x) + 1")
    assert isinstance(error, kind)
    assert type(error.kernel_error) is kind  # the kernel's own exception, kept
    assert f"{HERE}:" in error.finding.detail and "raise " in error.finding.detail  # one line, not a stack


def test_python_custom_op_value_error_on_a_later_call():
    @torch.library.custom_op("graphex_test_replay::picky", mutates_args=())
    def picky(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 100:
            raise ValueError("picky: the sum is too large")
        return x * 2

    @picky.register_fake
    def _(x):
        return torch.empty_like(x)

    def f(x):
        return picky(x) + 1

    compiled = compile_graphex(f)
    compiled(torch.ones(3))
    error = assert_fails_like_eager(compiled, f, torch.full((3,), 50.0), op="graphex_test_replay::picky",
                                    line="return picky(x) + 1")
    assert type(error) is graphex.errors.ReplayValueError


def test_cache_compile_loaded_program_keeps_the_cause(tmp_path):
    from graphex.inference import cache_compile

    def f(x):
        return torch.ops.graphex_test_replay.checked(x) + 1

    def g(x, idx):
        return x.index_select(0, idx) * 2

    cached_f = cache_compile(f, cache_dir=tmp_path)
    cached_g = cache_compile(g, cache_dir=tmp_path)
    cached_f(torch.ones(3))
    cached_g(torch.randn(4), torch.tensor([0, 1]))
    error = assert_fails_like_eager(cached_f, f, torch.full((3,), 50.0), op="graphex_test_replay::checked",
                                    line="torch.ops.graphex_test_replay.checked(x) + 1")
    assert isinstance(error, ValueError) and isinstance(error.__cause__, ValueError)
    assert_fails_like_eager(cached_g, g, torch.randn(4), torch.tensor([0, 9]), op="aten::index_select",
                            line="x.index_select(0, idx)")


def test_replay_error_classes_are_made_once_and_mixed_with_the_builtin():
    from graphex.errors import make_replay_error, replay_error_class

    assert replay_error_class(IndexError) is replay_error_class(IndexError) is graphex.errors.ReplayIndexError
    assert replay_error_class(RuntimeError) is graphex.ReplayError
    error = make_replay_error("IndexError", "index 9 is out of bounds.", "graph_0", "index", "aten::index.Tensor",
                              "model.py:3 in f: x[i]")
    assert isinstance(error, IndexError) and isinstance(error, graphex.ReplayError)
    assert str(error) == ("graphex: graph_0: node 'index' (aten::index.Tensor) failed: index 9 is out of bounds.\n"
                          "  used at: model.py:3 in f: x[i]")
    key = make_replay_error("RuntimeError", "", "g", "n", "ns::op", "", KeyError("missing"))
    assert isinstance(key, KeyError) and "'missing'" in str(key) and not str(key).startswith('"')
    assert isinstance(make_replay_error("LinAlgError", "not positive-definite", "g", "n", "aten::x", ""),
                      torch.linalg.LinAlgError)


def test_one_table_of_collective_namespaces_serves_replay_errors_and_export():
    """Replay errors and export's refusal read graphex.distributed.COLLECTIVE_NAMESPACES (they had copies that
    differed: a failing `_dtensor::` or legacy `c10d_functional::` op was not explained as a collective)."""
    from graphex import distributed, errors, exporting

    for op in ("_c10d_functional::all_reduce", "c10d_functional::all_reduce", "c10d::allreduce_", "_dtensor::shard_dim_alltoall"):
        assert distributed.is_collective(op)
    assert not distributed.is_collective("aten::add.Tensor") and not distributed.is_collective("mylib::c10d_like")
    for module in (errors, exporting):
        assert "_c10d_functional::" not in open(module.__file__).read(), module.__file__
