"""Graphs the differential fuzzer (sweeps/fuzz*.py) found graphex-only failures in, each fixed."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same, compile_graphex, engine_runs
from sweeps.compare import clone_tree


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def _write_a_view_read_the_other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    b.mul_(2)
    return a.clamp(min=-1, max=2)


def test_aliasing_inputs_without_a_common_base():
    """Fuzz seed 236: two inputs sharing one storage but no `._base` (as clone_tree, `set_` or packed parameters
    make them): AOTAutograd passes a synthetic base over the whole storage, larger at run time than at trace
    time (Note [A synthetic base is as large as its storage]); graphex refused it with a SignatureError. (With
    dynamic=True torch itself fails to fake the synthetic base, aot_eager too.)"""
    base = torch.randint(-4, 5, (2, 1, 10))
    a, b = clone_tree([base[..., ::2], base[..., ::2].select(0, 0)])
    assert a._base is None and b._base is None and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    compiled = compile_graphex(_write_a_view_read_the_other)
    for _ in range(2):  # capture, then replay
        ea, eb = clone_tree([a, b])
        ga, gb = clone_tree([a, b])
        before = engine_runs()
        assert_same(compiled(ga, gb), _write_a_view_read_the_other(ea, eb))
        assert engine_runs() == before + 1
        assert_same(ga, ea)
        assert_same(gb, eb)
