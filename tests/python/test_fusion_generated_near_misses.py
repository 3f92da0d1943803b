"""Generated near misses of fused mode's built-in patterns (issue 21, point 1): the worst bug fused mode can
have is a fused kernel firing on code it does not exactly implement, a silently wrong result.

For each pattern of graphex/fusion/patterns.py the canonical spellings are written as small functions (each
must fire: the generator is known to reach the matcher), with hand-written MUTATIONS: small changes of
meaning (eps outside the rsqrt, softmax over another dim, a sign flipped in rotate_half, gelu for silu, a mask
that broadcasts the batch up, ...), a few of the same meaning (which may fire), an intermediate of the
pattern also used outside it, degenerate shapes and values (an empty KV cache, NaN and inf inputs). On top of
those the generator derives from the canonical spellings: other dtypes (bfloat16 and float16 are fused;
float64 is not, so nothing may fire there), one input of another dtype, non-contiguous inputs, dynamic=True,
training (gradients compared too), zero-size and odd shapes, and contexts (the pattern applied to its own
output, its output viewed, its input written in place before or after it, autocast).

Every variant is compiled with `pattern_fusion_pass=True`, run on random inputs, and compared with eager:
its outputs, its inputs after the call (an in-place write must survive) and, training, its gradients.
  - a graphex_fused op fired in its code: within the fused tolerance of eager (atol = rtol = 1e-5 per
    fused op, Note [Fused kernels are close, not bitwise]; a variant's tolerance is 2e-5 per fused op
    that fired; in bfloat16/float16, 4 eps of the dtype per fused op), NaN where
    eager has NaN;
  - none fired: bitwise eager's (bit patterns compared).
A fused compile must not fail where exact mode compiles. Which kernels fired is recorded per variant
(`record_property("fired", ...)`, and in every failure message). A variant that fires and is outside the
tolerance computes something the kernel does not: a real bug, kept here as a strict xfail (XFAIL says what
is wrong) until graphex is fixed. Variants are compiled in groups (Note [Variants are compiled in groups]).
"""

from __future__ import annotations

import collections
import dataclasses
import zlib
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

from graphex import compat
from conftest import FUSED_OP_EPS_REDUCED, FUSED_OP_TOL_FLOAT32, compile_graphex
from graphex.runtime import live_graphs

# a fused compile that fused nothing warns (Note [A fused compile that fused nothing says so]): most variants here
pytestmark = pytest.mark.filterwarnings("ignore::graphex.base.warn.GraphexWarning")

OP_TOL = FUSED_OP_TOL_FLOAT32  # Note [Fused kernels are close, not bitwise] (csrc/fused/library.cpp), per fused op
REDUCED_TOL_EPS = FUSED_OP_EPS_REDUCED  # the same Note: bfloat16 / float16, in units of the dtype's eps, per fused op
EPS = 1e-6
t = torch.randn


@dataclasses.dataclass(frozen=True)
class Variant:
    id: str
    fn: Callable[..., Any]
    make: Callable[[], tuple[Any, ...]]  # the inputs (drawn under a seed of the variant's own)
    must_fire: frozenset[str] = frozenset()  # canonical spellings: these fire (the generator reaches the matcher)
    none_may_fire: bool = False  # other dtypes: no graphex_fused op at all
    xfail: str = ""  # a known bug: what is wrong
    dynamic: bool = False  # compiled with dynamic=True
    train: bool = False  # floating inputs require grad, grad mode on: outputs and gradients compared


VARIANTS: list[Variant] = []


def variant(id: str, fn: Callable[..., Any], make: Callable[[], tuple[Any, ...]], *, fire: tuple[str, ...] = (),
            none: bool = False, dynamic: bool = False, train: bool = False) -> None:
    assert all(v.id != id for v in VARIANTS), id
    VARIANTS.append(Variant(id, fn, make, frozenset(fire), none, XFAIL.get(id, ""), dynamic, train))


# ---- RMSNorm ---------------------------------------------------------------------------------------------

def rms(x, w):  # patterns.rms_norm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rms_llama(x, w):  # patterns.rms_norm_llama
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


RMS_IN = lambda: (t(2, 3, 16), t(16))  # noqa: E731
def rms_upcast(x, w):  # patterns.rms_norm_upcast (Llama's norm in a bfloat16/float16 model; no-ops on float32)
    h = x.to(torch.float32)
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


RMS_CANON = {"rms_norm": (rms, RMS_IN), "rms_norm_llama": (rms_llama, RMS_IN), "rms_norm_upcast": (rms_upcast, RMS_IN)}

RMS_IN_X = lambda: (t(2, 3, 16),)  # noqa: E731
_W16 = torch.randn(16, generator=torch.Generator().manual_seed(16))


class _RMSModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, generator=torch.Generator().manual_seed(17)))

    def forward(self, x):
        return rms(x, self.weight)


RMS_BF16_IN = lambda: (t(2, 3, 16).bfloat16(), t(16).bfloat16())  # noqa: E731

RMS_MUTATIONS: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = {
    # Llama's upcast norm in a bfloat16 model, spelled with other dtypes (another rounding): stays exact
    "upcast_to_float64_bf16": (lambda x, w: w * (lambda h: h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS))(
        x.to(torch.float64)).to(x.dtype), RMS_BF16_IN),
    "upcast_back_to_float16_bf16": (lambda x, w: w * (lambda h: h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS))(
        x.to(torch.float32)).to(torch.float16), RMS_BF16_IN),
    "upcast_weight_after_cast_back_bf16": (lambda x, w: (w.float() * (lambda h: h * torch.rsqrt(
        h.pow(2).mean(-1, keepdim=True) + EPS))(x.to(torch.float32))).to(x.dtype), RMS_BF16_IN),
    # same meaning (may fire)
    "eps_1e-5": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w, RMS_IN),
    "eps_then_sqrt_reciprocal": (lambda x, w: x * (1.0 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)) * w,
                                 RMS_IN),
    "divide_by_sqrt": (lambda x, w: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w, RMS_IN),
    "x_times_x": (lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w, RMS_IN),
    "square": (lambda x, w: x * torch.rsqrt(torch.square(x).mean(-1, keepdim=True) + EPS) * w, RMS_IN),
    "pow_2_float": (lambda x, w: x * torch.rsqrt(x.pow(2.0).mean(-1, keepdim=True) + EPS) * w, RMS_IN),
    "abs_pow_2": (lambda x, w: x * torch.rsqrt(x.abs().pow(2).mean(-1, keepdim=True) + EPS) * w, RMS_IN),
    "mean_dim_2_positive": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(2, keepdim=True) + EPS) * w, RMS_IN),
    "keepdim_false_unsqueeze": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1).unsqueeze(-1) + EPS) * w, RMS_IN),
    "eps_inside_the_mean": (lambda x, w: x * torch.rsqrt((x.pow(2) + EPS).mean(-1, keepdim=True)) * w, RMS_IN),
    "weight_1xD": (rms, lambda: (t(2, 3, 16), t(1, 16))),
    "weight_first": (lambda x, w: w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS), RMS_IN),
    "rsqrt_times_weight_first": (lambda x, w: x * (torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w), RMS_IN),
    # another meaning
    "eps_outside_rsqrt": (lambda x, w: x * (torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) + EPS) * w, RMS_IN),
    "eps_subtracted": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) - EPS) * w,
                       lambda: (t(2, 3, 16) + 3, t(16))),
    "sqrt_not_rsqrt": (lambda x, w: x * torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w, RMS_IN),
    "mean_dim_0": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + EPS) * w, RMS_IN),
    "mean_dim_-2": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + EPS) * w, RMS_IN),
    "mean_dims_-1_-2": (lambda x, w: x * torch.rsqrt(x.pow(2).mean((-2, -1), keepdim=True) + EPS) * w, RMS_IN),
    "keepdim_false_unsqueeze_0": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1).unsqueeze(0) + EPS)[..., :1] * w,
                                  lambda: (t(3, 3, 16), t(16))),
    "pow_3": (lambda x, w: x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True).abs() + EPS) * w, RMS_IN),
    "pow_1": (lambda x, w: x * torch.rsqrt(x.pow(1).mean(-1, keepdim=True).abs() + EPS) * w, RMS_IN),
    "sum_not_mean": (lambda x, w: x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + EPS) * w, RMS_IN),
    "mean_in_float64": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True, dtype=torch.float64) + EPS) * w,
                        RMS_IN),
    "weight_broadcast_over_dim_-2": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w[:, None],
                                     lambda: (t(2, 16, 16), t(16))),
    "weight_broadcast_over_dim_0": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
                                    * w[:, None, None], lambda: (t(16, 3, 16), t(16))),
    "weight_before_the_norm": (lambda x, w: (x * w) * torch.rsqrt((x * w).pow(2).mean(-1, keepdim=True) + EPS),
                               RMS_IN),
    "weight_inside_the_mean": (lambda x, w: x * torch.rsqrt((x.pow(2) * w).mean(-1, keepdim=True).abs() + EPS) * w,
                               RMS_IN),
    "normalizes_y_by_x": (lambda x, y, w: y * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w,
                          lambda: (t(2, 3, 16), t(2, 3, 16), t(16))),
    "weight_added": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) + w, RMS_IN),
    "rsqrt_of_mean_plus_x": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + x.abs()) * w, RMS_IN),
    "weight_times_weight": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w * w, RMS_IN),
    # Llama on bfloat16: upcast, norm in float32, down-cast before the weight (no float32 weight: no pattern)
    "llama_bf16_upcast": (lambda x, w: w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS))
                          .to(torch.bfloat16), lambda: (t(2, 3, 16).bfloat16(), t(16).bfloat16())),
    # bfloat16 activations, float32 weight: the norm runs on the float32 upcast (may fire), then .to(bf16)
    "bf16_x_upcast_f32_weight": (lambda x, w: rms(x.float(), w).to(torch.bfloat16),
                                 lambda: (t(2, 3, 16).bfloat16(), t(16))),
    "rsqrt_also_returned": (lambda x, w: (lambda r: (x * r * w, r))(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)),
                            RMS_IN),
    "mean_also_used": (lambda x, w: (lambda m: x * torch.rsqrt(m + EPS) * w + m)(x.pow(2).mean(-1, keepdim=True)),
                       RMS_IN),
    "weight_expanded_from_one_value": (lambda x, w: rms(x, w.expand(16)), lambda: (t(2, 3, 16), t(1))),
    "x_expanded_over_rows": (lambda x, w: rms(x.expand(2, 3, 16), w), lambda: (t(1, 3, 16), t(16))),
    "x_expanded_along_the_row": (lambda x, w: rms(x.expand(2, 3, 16), w), lambda: (t(2, 3, 1), t(16))),
    "weight_a_module_parameter": (_RMSModule(), RMS_IN_X),
    "weight_a_captured_constant": (lambda x: rms(x, _W16), RMS_IN_X),
    # values
    "eps_0_zero_row": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * w,
                       lambda: (torch.cat([torch.zeros(1, 16), t(2, 16)]), t(16))),
    "overflowing_square": (rms, lambda: (t(2, 3, 16) * 1e20, t(16))),
    "tiny_values": (rms, lambda: (t(2, 3, 16) * 1e-30, t(16))),
}

# ---- add + RMSNorm ---------------------------------------------------------------------------------------

def add_rms(x, r, w):  # patterns.add_rms_norm
    h = x + r
    return rms(h, w), h


def add_rms_llama(x, r, w):  # patterns.add_rms_norm_llama
    h = x + r
    return rms_llama(h, w), h


ADD_IN = lambda: (t(2, 3, 16), t(2, 3, 16), t(16))  # noqa: E731
def add_rms_upcast(x, r, w):  # patterns.add_rms_norm_upcast
    h = x + r
    return rms_upcast(h, w), h


ADD_CANON = {"add_rms_norm": (add_rms, ADD_IN), "add_rms_norm_llama": (add_rms_llama, ADD_IN),
             "add_rms_norm_upcast": (add_rms_upcast, ADD_IN)}


def _add_then(op: Callable[..., Any]) -> Callable[..., Any]:
    def fn(x, r, w):
        h = op(x, r)
        return rms(h, w), h
    return fn


def _h_changed_after(x, r, w):  # returns h after an in-place change made after the norm
    h = x + r
    y = rms(h, w)
    h.mul_(2)
    return y, h


def _h_changed_before(x, r, w):  # in-place change between the add and the norm
    h = x + r
    h.add_(1.0)
    return rms(h, w), h


def _returns_x(x, r, w):
    return rms(x + r, w), x


def _norm_only(x, r, w):
    return rms(x + r, w)


def _norm_of_h_returns_other_sum(x, r, w):
    h = x + r
    return rms(h, w), x + 2 * r


ADD_MUTATIONS = {
    "add_alpha_1": (_add_then(lambda x, r: torch.add(x, r, alpha=1)), ADD_IN),
    "residual_first": (_add_then(lambda x, r: r + x), ADD_IN),
    "h_unused": (_norm_only, ADD_IN),
    "returns_x": (_returns_x, ADD_IN),
    "sub_not_add": (_add_then(lambda x, r: x - r), ADD_IN),
    "add_alpha_2": (_add_then(lambda x, r: torch.add(x, r, alpha=2)), ADD_IN),
    "add_alpha_-1": (_add_then(lambda x, r: torch.add(x, r, alpha=-1)), ADD_IN),
    "add_scalar_residual": (_add_then(lambda x, r: x + 0.5), ADD_IN),
    "h_changed_in_place_after_the_norm": (_h_changed_after, ADD_IN),
    "h_changed_in_place_before_the_norm": (_h_changed_before, ADD_IN),
    "returns_another_sum": (_norm_of_h_returns_other_sum, ADD_IN),
    "residual_broadcast_1xD": (add_rms, lambda: (t(2, 3, 16), t(1, 16), t(16))),
    "residual_broadcast_3xD": (add_rms, lambda: (t(2, 3, 16), t(3, 16), t(16))),
    "x_broadcast_up_to_residual": (add_rms, lambda: (t(3, 16), t(2, 3, 16), t(16))),
    "residual_transposed_view": (lambda x, r, w: add_rms(x, r.transpose(0, 1), w),
                                 lambda: (t(2, 3, 16), t(3, 2, 16), t(16))),
    "residual_expanded_view": (lambda x, r, w: add_rms(x, r.expand(2, 3, 16), w),
                               lambda: (t(2, 3, 16), t(3, 16), t(16))),
    "residual_bf16": (add_rms, lambda: (t(2, 3, 16), t(2, 3, 16).bfloat16(), t(16))),
    "sum_also_squared_and_returned": (lambda x, r, w: (lambda h: (rms(h, w), h, h.pow(2)))(x + r), ADD_IN),
    "two_norms_of_one_sum": (lambda x, r, w: (lambda h: (rms(h, w), rms(h, w * 2), h))(x + r), ADD_IN),
    "x_is_residual": (lambda x, r, w: add_rms(x, x, w), ADD_IN),
    "add_rms_mul_weight_twice": (lambda x, r, w: (rms(x + r, w) * w, x + r), ADD_IN),
}

# ---- SiLU-gated MLP and silu * up ------------------------------------------------------------------------

def mlp(x, wg, wu, wd):  # patterns.gated_mlp
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


MLP_IN3 = lambda: (t(2, 3, 16), t(32, 16) * 0.3, t(32, 16) * 0.3, t(16, 32) * 0.3)  # noqa: E731
MLP_IN2 = lambda: (t(3, 16), t(32, 16) * 0.3, t(32, 16) * 0.3, t(16, 32) * 0.3)  # noqa: E731
def gelu_mlp(x, wg, wu, wd):  # patterns._gelu_gated_mlp("none", False): the erf GELU
    return F.linear(F.gelu(F.linear(x, wg)) * F.linear(x, wu), wd)


def gelu_tanh_mlp(x, wg, wu, wd):  # patterns._gelu_gated_mlp("tanh", False): Gemma's gelu_pytorch_tanh
    return F.linear(F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd)


def gelu_tanh_mlp_up_first(x, wg, wu, wd):  # patterns._gelu_gated_mlp("tanh", True)
    return F.linear(F.linear(x, wu) * F.gelu(F.linear(x, wg), approximate="tanh"), wd)


MLP_CANON = {"gated_mlp_3d": (mlp, MLP_IN3), "gated_mlp_2d": (mlp, MLP_IN2), "gelu_gated_mlp_3d": (gelu_mlp, MLP_IN3),
             "gelu_tanh_gated_mlp_3d": (gelu_tanh_mlp, MLP_IN3),
             "gelu_tanh_gated_mlp_up_first_2d": (gelu_tanh_mlp_up_first, MLP_IN2)}


def _mlp_act(act: Callable[..., Any]) -> Callable[..., Any]:
    return lambda x, wg, wu, wd: F.linear(act(F.linear(x, wg)) * F.linear(x, wu), wd)


def _mlp_bias(where: str) -> Callable[..., Any]:
    def fn(x, wg, wu, wd, b):
        g = F.linear(x, wg, b if where == "gate" else None)
        u = F.linear(x, wu, b if where == "up" else None)
        return F.linear(F.silu(g) * u, wd, b[:16] if where == "down" else None)
    return fn


class _MLPModule(torch.nn.Module):  # Llama's MLP: nn.Linear without bias
    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():  # built at import: leave the global generator as it was
            torch.manual_seed(18)
            self.gate, self.up, self.down = (torch.nn.Linear(16, 32, bias=False), torch.nn.Linear(16, 32, bias=False),
                                             torch.nn.Linear(32, 16, bias=False))

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


MLP_BIAS_IN = lambda: (*MLP_IN3(), t(32))  # noqa: E731

MLP_MUTATIONS = {
    "gate_and_up_swapped": (lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x, wu)) * F.linear(x, wg), wd), MLP_IN3),
    "matmul_transposed_weights": (lambda x, wg, wu, wd: F.silu(x @ wg.t()) * (x @ wu.t()) @ wd.t(), MLP_IN3),
    "up_times_silu_gate": (lambda x, wg, wu, wd: F.linear(F.linear(x, wu) * F.silu(F.linear(x, wg)), wd), MLP_IN3),
    "silu_inplace": (_mlp_act(lambda v: F.silu(v, inplace=True)), MLP_IN3),
    "sigmoid_spelled_out": (_mlp_act(lambda v: v * torch.sigmoid(v)), MLP_IN3),
    "down_weight_stored_transposed": (lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd.t()),
                                      lambda: (t(2, 3, 16), t(32, 16) * .3, t(32, 16) * .3, t(32, 16) * .3)),
    "gelu_not_silu": (_mlp_act(F.gelu), MLP_IN3),
    "gelu_tanh_not_silu": (_mlp_act(lambda v: F.gelu(v, approximate="tanh")), MLP_IN3),
    "relu_not_silu": (_mlp_act(F.relu), MLP_IN3),
    "sigmoid_not_silu": (_mlp_act(torch.sigmoid), MLP_IN3),
    "no_activation": (_mlp_act(lambda v: v), MLP_IN3),
    "silu_of_silu": (_mlp_act(lambda v: F.silu(F.silu(v))), MLP_IN3),
    "bias_on_gate": (_mlp_bias("gate"), MLP_BIAS_IN),
    "bias_on_up": (_mlp_bias("up"), MLP_BIAS_IN),
    "bias_on_down": (_mlp_bias("down"), MLP_BIAS_IN),
    "add_not_mul": (lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x, wg)) + F.linear(x, wu), wd), MLP_IN3),
    "up_reads_other_input": (lambda x, y, wg, wu, wd: F.linear(F.silu(F.linear(x, wg)) * F.linear(y, wu), wd),
                             lambda: (t(2, 3, 16), t(2, 3, 16), t(32, 16) * .3, t(32, 16) * .3, t(16, 32) * .3)),
    "up_of_width_1_broadcast": (mlp, lambda: (t(2, 3, 16), t(32, 16) * .3, t(1, 16) * .3, t(16, 32) * .3)),
    "silu_then_down_then_up": (lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x, wg)), wd) * F.linear(x, wu)[..., :16],
                               MLP_IN3),
    "gate_projection_also_returned": (lambda x, wg, wu, wd: (lambda g: (F.linear(F.silu(g) * F.linear(x, wu), wd), g))(
        F.linear(x, wg)), MLP_IN3),
    "silu_times_up_also_returned": (lambda x, wg, wu, wd: (lambda h: (F.linear(h, wd), h))(
        F.silu(F.linear(x, wg)) * F.linear(x, wu)), MLP_IN3),
    "weights_module_parameters": (_MLPModule(), lambda: (t(2, 3, 16),)),
    "x_one_row_1d": (mlp, lambda: (t(16), t(32, 16) * .3, t(32, 16) * .3, t(16, 32) * .3)),
    "hidden_0": (mlp, lambda: (t(3, 0), t(32, 0), t(32, 0), t(16, 32))),  # reshape(-1, 0) failed the compile
    "large_activations_bfloat16": (mlp, lambda: ((t(3, 7, 64) * 8).bfloat16(), (t(352, 64) * .1).bfloat16(),
                                                 (t(352, 64) * .1).bfloat16(), (t(64, 352) * .1).bfloat16())),
    "x_4d": (mlp, lambda: (t(2, 2, 3, 16), t(32, 16) * .3, t(32, 16) * .3, t(16, 32) * .3)),
    "x_transposed_view": (lambda x, wg, wu, wd: mlp(x.transpose(0, 1), wg, wu, wd), MLP_IN3),
    # the GELU-gated forms: another activation, the GELU on the other product, the GELU's special values
    "gelu_of_up_times_gate": (lambda x, wg, wu, wd: F.linear(F.gelu(F.linear(x, wu)) * F.linear(x, wg), wd), MLP_IN3),
    "gelu_tanh_of_gelu": (_mlp_act(lambda v: F.gelu(F.gelu(v), approximate="tanh")), MLP_IN3),
    "gelu_times_gelu": (lambda x, wg, wu, wd: F.linear(F.gelu(F.linear(x, wg)) * F.gelu(F.linear(x, wu)), wd), MLP_IN3),
    "gelu_tanh_written_out": (_mlp_act(lambda v: 0.5 * v * (1 + torch.tanh(0.7978845608 * (v + 0.044715 * v ** 3)))),
                              MLP_IN3),
    "gelu_gate_with_inf_and_nan": (gelu_mlp, lambda: (torch.tensor([float("inf"), float("-inf"), float("nan"), 3e38] * 4)
                                                      .reshape(1, 16), t(32, 16) * 1e30, t(32, 16) * .3,
                                                      t(16, 32) * .3)),
    "gelu_tanh_extreme_gate": (gelu_tanh_mlp, lambda: (t(2, 3, 16) * 1e3, t(32, 16), t(32, 16) * .3, t(16, 32) * .3)),
    "gelu_bias_on_gate": (lambda x, wg, wu, wd, b: F.linear(F.gelu(F.linear(x, wg, b)) * F.linear(x, wu), wd),
                          MLP_BIAS_IN),
}


# ---- the gated MLP with one gate_up projection (Phi3) ------------------------------------------------

def _packed(act: Callable[..., Any], up_first: bool = True, dim: int = -1, pieces: int = 2,
            gate_piece: int = 0, up_piece: int = 1) -> Callable[..., Any]:
    def fn(x, w, wd):
        parts = F.linear(x, w).chunk(pieces, dim=dim)
        gate, up = parts[gate_piece], parts[up_piece]
        return F.linear(up * act(gate) if up_first else act(gate) * up, wd)
    return fn


def _packed_cut(cut: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> Callable[..., Any]:
    """Phi3's MLP with the projection cut into (gate, up) by `cut`: Note [Arguments are matched in one spelling]."""
    def fn(x, w, wd):
        gate, up = cut(F.linear(x, w))
        return F.linear(up * F.silu(gate), wd)
    return fn


_gelu_tanh = lambda v: F.gelu(v, approximate="tanh")  # noqa: E731
PACKED_IN3 = lambda: (t(2, 3, 16), t(64, 16) * 0.3, t(16, 32) * 0.3)  # noqa: E731
PACKED_IN2 = lambda: (t(3, 16), t(64, 16) * 0.3, t(16, 32) * 0.3)  # noqa: E731
PACKED_CANON = {"phi3_up_times_silu_3d": (_packed(F.silu), PACKED_IN3),  # patterns._packed_gated_mlp("silu", True)
                "silu_times_up_2d": (_packed(F.silu, up_first=False), PACKED_IN2),
                "gelu_3d": (_packed(F.gelu, up_first=False), PACKED_IN3),
                "gelu_tanh_up_first_2d": (_packed(_gelu_tanh), PACKED_IN2),
                # the other spellings of the two halves (spellings.py, and patterns._slice_halves)
                "chunk_positive_dim_3d": (_packed(F.silu, dim=2), PACKED_IN3),
                "split_sizes": (_packed_cut(lambda h: h.split([32, 32], dim=-1)), PACKED_IN3),
                "split_size_positive_dim": (_packed_cut(lambda h: h.split(32, dim=1)), PACKED_IN2),
                "sliced": (_packed_cut(lambda h: (h[..., :32], h[..., 32:])), PACKED_IN3),
                "sliced_to_its_end": (_packed_cut(lambda h: (h[:, :32], h[:, 32:64])), PACKED_IN2),
                "narrowed": (_packed_cut(lambda h: (h.narrow(-1, 0, 32), h.narrow(-1, 32, 32))), PACKED_IN3),
                "tensor_split": (_packed_cut(lambda h: torch.tensor_split(h, 2, dim=-1)), PACKED_IN3),
                "sliced_from_the_end": (_packed_cut(lambda h: (h[..., :-32], h[..., -32:])), PACKED_IN3)}
PACKED_MUTATIONS = {
    "halves_swapped": (_packed(F.silu, gate_piece=1, up_piece=0), PACKED_IN3),
    "activation_on_both_halves": (_packed(F.silu, gate_piece=0, up_piece=0), PACKED_IN3),
    "second_half_twice": (_packed(F.silu, gate_piece=1, up_piece=1), PACKED_IN3),
    "three_pieces_first_two": (_packed(F.silu, pieces=3), lambda: (t(3, 16), t(48, 16) * .3, t(16, 16) * .3)),
    "four_pieces_middle_two": (_packed(F.silu, pieces=4, gate_piece=1, up_piece=2),
                               lambda: (t(3, 16), t(64, 16) * .3, t(16, 16) * .3)),
    "chunked_over_rows": (_packed(F.silu, dim=0), lambda: (t(4, 16), t(32, 16) * .3, t(16, 32) * .3)),
    "chunked_over_rows_3d": (_packed(F.silu, dim=1), lambda: (t(2, 4, 16), t(32, 16) * .3, t(16, 32) * .3)),
    "split_unevenly": (lambda x, w, wd: (lambda p: F.linear(p[1][..., :24] * F.silu(p[0]), wd))(
        F.linear(x, w).split([24, 40], dim=-1)), lambda: (t(3, 16), t(64, 16) * .3, t(16, 24) * .3)),
    "slices_overlapping": (_packed_cut(lambda h: (h[..., :32], h[..., 1:33])), PACKED_IN3),
    "slices_swapped": (_packed_cut(lambda h: (h[..., 32:], h[..., :32])), PACKED_IN3),
    "slices_strided": (_packed_cut(lambda h: (h[..., 0::2], h[..., 1::2])), PACKED_IN3),
    "narrowed_first_half_twice": (_packed_cut(lambda h: (h.narrow(-1, 0, 32), h.narrow(-1, 0, 32))), PACKED_IN3),
    "split_sizes_swapped": (_packed_cut(lambda h: h.split([32, 32], dim=-1)[::-1]), PACKED_IN3),
    "sliced_over_rows": (_packed_cut(lambda h: (h[:2], h[2:])), lambda: (t(4, 16), t(32, 16) * .3, t(16, 32) * .3)),
    "relu_not_silu": (_packed(F.relu), PACKED_IN3),
    "gelu_tanh_not_gelu": (_packed(_gelu_tanh, up_first=False), PACKED_IN2),
    "sigmoid_spelled_out": (_packed(lambda v: v * torch.sigmoid(v)), PACKED_IN3),
    "add_not_mul": (lambda x, w, wd: (lambda g, u: F.linear(u + F.silu(g), wd))(*F.linear(x, w).chunk(2, -1)),
                    PACKED_IN3),
    "bias_on_projection": (lambda x, w, wd, b: (lambda g, u: F.linear(u * F.silu(g), wd))(
        *F.linear(x, w, b).chunk(2, -1)), lambda: (*PACKED_IN3(), t(64))),
    "product_also_returned": (lambda x, w, wd: (lambda p: (F.linear(p[1] * F.silu(p[0]), wd), p[0]))(
        F.linear(x, w).chunk(2, -1)), PACKED_IN3),
    "projection_stored_transposed": (lambda x, w, wd: (lambda g, u: F.linear(u * F.silu(g), wd))(
        *(x @ w).chunk(2, -1)), lambda: (t(3, 16), t(16, 64) * .3, t(16, 32) * .3)),
    "one_row_bfloat16": (_packed(F.silu), lambda: (t(1, 16).bfloat16(), t(64, 16).bfloat16() * .3,
                                                   t(16, 32).bfloat16() * .3)),
    # a helper's: silu * up rounded once drifted past the tolerance where the down projection cancels (Note [A
    # reduced-precision silu is rounded before its product], gated_mlp.cpp)
    "large_activations_bfloat16": (_packed(F.silu), lambda: ((t(3, 7, 64) * 8).bfloat16(), (t(704, 64) * .1).bfloat16(),
                                                             (t(64, 352) * .1).bfloat16())),
    "large_activations_float16": (_packed(F.silu), lambda: ((t(3, 7, 64) * 8).half(), (t(704, 64) * .1).half(),
                                                            (t(64, 352) * .1).half())),
    "hidden_0": (_packed(F.silu), lambda: (t(3, 0), t(64, 0), t(16, 32))),  # a helper's: reshape(-1, 0) failed
}


def silu_mul(g, u):  # patterns.silu_mul
    return F.silu(g) * u


SM_IN = lambda: (t(2, 3, 32), t(2, 3, 32))  # noqa: E731
SM_CANON = {"silu_mul": (silu_mul, SM_IN)}
SM_MUTATIONS = {
    "sigmoid_g_times_g_times_u": (lambda g, u: torch.sigmoid(g) * g * u, SM_IN),
    "u_times_silu": (lambda g, u: u * F.silu(g), SM_IN),
    "silu_of_up_times_gate": (lambda g, u: F.silu(u) * g, SM_IN),
    "gate_is_up": (lambda g, u: F.silu(g) * g, SM_IN),
    "u_broadcast_column": (silu_mul, lambda: (t(2, 3, 32), t(3, 1))),
    "u_broadcast_row": (silu_mul, lambda: (t(2, 3, 32), t(32))),
    "g_broadcast_up_to_u": (silu_mul, lambda: (t(3, 32), t(2, 3, 32))),
    "u_expanded_view": (lambda g, u: silu_mul(g, u.expand(2, 3, 32)), lambda: (t(2, 3, 32), t(1, 3, 32))),
    "g_transposed_view": (lambda g, u: silu_mul(g.transpose(0, 1), u), lambda: (t(3, 2, 32), t(2, 3, 32))),
    "silu_div_u": (lambda g, u: F.silu(g) / u, SM_IN),
    "silu_plus_u": (lambda g, u: F.silu(g) + u, SM_IN),
    "sigmoid_times_u": (lambda g, u: torch.sigmoid(g) * u, SM_IN),
    "gelu_times_u": (lambda g, u: F.gelu(g) * u, SM_IN),
    "silu_of_neg_gate": (lambda g, u: F.silu(-g) * u, SM_IN),
    "up_expanded_along_the_row": (lambda g, u: silu_mul(g, u.expand(2, 3, 32)), lambda: (t(2, 3, 32), t(2, 3, 1))),
    "gate_with_inf_and_nan": (silu_mul, lambda: (torch.tensor([float("inf"), float("-inf"), float("nan"), 1.0] * 8)
                                                 .reshape(1, 32), t(1, 32))),
    "silu_also_returned": (lambda g, u: (lambda a: (a * u, a))(F.silu(g)), SM_IN),
    "u_int64": (silu_mul, lambda: (t(2, 3, 32), torch.randint(-3, 3, (2, 3, 32)))),
    "extreme_gate": (silu_mul, lambda: (t(2, 3, 32) * 200, t(2, 3, 32))),
}

# ---- rotary ---------------------------------------------------------------------------------------------

def rot(x, cos, sin):  # patterns.rotary
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rot_slices(x, cos, sin):  # patterns.rotary_slices
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return (x * cos) + (torch.cat((-x2, x1), dim=-1) * sin)


def rot_every_two(x, cos, sin):  # patterns.rotary_every_two: GPT-J's rotate_every_two, tables per element
    x1, x2 = x[..., ::2], x[..., 1::2]
    return (x * cos) + (torch.stack((-x2, x1), dim=-1).flatten(-2) * sin)


def rot_pairs(x, cos, sin):  # patterns.rotary_pairs: the pairs written out, tables per pair
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def rot_pairs_swapped(x, cos, sin):  # patterns.rotary_pairs_swapped
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


ROT_IN = lambda: (t(1, 2, 3, 8), t(1, 1, 3, 8), t(1, 1, 3, 8))  # noqa: E731
ROT_PAIRS_IN = lambda: (t(1, 2, 3, 8), t(1, 1, 3, 4), t(1, 1, 3, 4))  # noqa: E731  tables per pair
def rot_narrow(x, cos, sin):  # rotate_half by narrow (spellings.py: the slices' spelling)
    d = x.shape[-1] // 2
    return x * cos + torch.cat((-x.narrow(-1, d, d), x.narrow(-1, 0, d)), dim=-1) * sin


def rot_tensor_split(x, cos, sin):
    x1, x2 = torch.tensor_split(x, 2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rot_positive_dims(x, cos, sin):  # chunk and cat on dim 3 of a 4-d x
    x1, x2 = x.chunk(2, dim=3)
    return x * cos + torch.cat((-x2, x1), dim=3) * sin


ROT_CANON = {"rotary_chunk": (rot, ROT_IN), "rotary_slices": (rot_slices, ROT_IN),
             "rotary_narrow": (rot_narrow, ROT_IN), "rotary_tensor_split": (rot_tensor_split, ROT_IN),
             "rotary_positive_dims": (rot_positive_dims, ROT_IN),
             # a 1-d x: chunk and cat on dim 0 trace with the dim left out (found by a helper)
             "rotary_1d_dim_0": (lambda x, cos, sin: (lambda a, b: x * cos + torch.cat((-b, a)) * sin)(*x.chunk(2, 0)),
                                 lambda: (t(8), t(8), t(8))),
             "rotary_every_two": (rot_every_two, ROT_IN), "rotary_pairs": (rot_pairs, ROT_PAIRS_IN),
             "rotary_pairs_swapped": (rot_pairs_swapped, ROT_PAIRS_IN)}


def _rot_pairs_with(even: Callable[..., Any], odd: Callable[..., Any], dim: int = -1) -> Callable[..., Any]:
    def fn(x, cos, sin):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((even(x1, x2, cos, sin), odd(x1, x2, cos, sin)), dim=dim).flatten(-2 if dim == -1 else -3)
    return fn


def _rot_halves(make_rotated: Callable[..., Any]) -> Callable[..., Any]:
    def fn(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + make_rotated(x1, x2) * sin
    return fn


def _rot_interleaved(x, cos, sin):  # GPT-J / Llama-2 meta: pairs (x0, x1), (x2, x3), ...
    x1, x2 = x[..., ::2], x[..., 1::2]
    return x * cos + torch.stack((-x2, x1), dim=-1).flatten(-2) * sin


def _rot_partial(x, cos, sin):  # only the first half of the head is rotated (GPT-NeoX rotary_pct=0.5)
    d = x.shape[-1] // 2
    xr, xp = x[..., :d], x[..., d:]
    return torch.cat((rot(xr, cos[..., :d], sin[..., :d]), xp), dim=-1)


def _rot_uneven(x, cos, sin):  # split at 2 instead of D/2
    return x * cos + torch.cat((-x[..., 2:], x[..., :2]), dim=-1) * sin


def _rot_dim_m2(x, cos, sin):  # rotate_half over the sequence dimension
    x1, x2 = x.chunk(2, dim=-2)
    return x * cos + torch.cat((-x2, x1), dim=-2) * sin


def rot_complex(x, freqs):  # Meta's Llama apply_rotary_emb (patterns.rotary_complex, between its casts)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], x.shape[-1] // 2, 2))  # Meta's -1 fails on 0 rows
    return torch.view_as_real(pairs * freqs).flatten(3).type_as(x)


def rot_complex_freqs_first(x, freqs):  # patterns.rotary_complex_freqs_first
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], x.shape[-1] // 2, 2))
    return torch.view_as_real(freqs * pairs).flatten(3).type_as(x)


def _rot_complex_with(product: Callable[..., Any], pairs_shape: Callable[..., Any] = lambda x: (*x.shape[:-1], -1, 2)):
    def fn(x, freqs):
        pairs = torch.view_as_complex(x.float().reshape(*pairs_shape(x)))
        return torch.view_as_real(product(pairs, freqs)).reshape(*x.shape[:-1], -1).type_as(x)
    return fn


def _halves_as_pairs(x, freqs):  # rotate_half's pairing (x[i], x[i + D/2]) spelled with complex numbers
    h = x.shape[-1] // 2
    pairs = torch.view_as_complex(torch.stack((x[..., :h], x[..., h:]), -1).contiguous())
    out = torch.view_as_real(pairs * freqs)
    return torch.cat((out[..., 0], out[..., 1]), -1)


def rot_complex_minus_one(x, freqs):  # Meta's code as written: the pairs' view with -1 (another pattern: torch's
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # matcher compares a -1 in a shape list)
    return torch.view_as_real(pairs * freqs).flatten(3).type_as(x)


_polar = lambda *shape: torch.polar(torch.ones(*shape), t(*shape))  # noqa: E731
ROTC_IN = lambda: (t(1, 3, 2, 8), _polar(1, 3, 1, 4))  # noqa: E731
ROTC_CANON = {"meta_llama": (rot_complex, ROTC_IN), "freqs_first": (rot_complex_freqs_first, ROTC_IN),
              "meta_llama_minus_one": (rot_complex_minus_one, ROTC_IN)}
ROTC_MUTATIONS = {
    "conjugate_table": (_rot_complex_with(lambda p, f: p * f.conj()), ROTC_IN),
    "divide_not_multiply": (_rot_complex_with(lambda p, f: p / f), ROTC_IN),
    "add_not_multiply": (_rot_complex_with(lambda p, f: p + f), ROTC_IN),
    "squared_table": (_rot_complex_with(lambda p, f: p * f * f), ROTC_IN),
    "heads_merged_into_pairs": (_rot_complex_with(lambda p, f: p * f, lambda x: (*x.shape[:-2], -1, 2)),
                                lambda: (t(1, 3, 2, 8), _polar(1, 3, 8))),
    "pairs_from_halves": (_halves_as_pairs, ROTC_IN),
    "table_grows_x": (rot_complex, lambda: (t(1, 3, 1, 8), _polar(1, 3, 2, 4))),
    "table_complex128": (rot_complex, lambda: (t(1, 3, 2, 8), _polar(1, 3, 1, 4).to(torch.complex128))),
    "table_not_unit": (rot_complex, lambda: (t(1, 3, 2, 8), torch.polar(torch.rand(1, 3, 1, 4) * 3, t(1, 3, 1, 4)))),
    "table_per_head": (rot_complex, lambda: (t(1, 3, 2, 8), _polar(1, 3, 2, 4))),
    "inf_and_nan_in_x": (rot_complex, lambda: (torch.tensor([float("inf"), 1.0, float("nan"), -2.0, 3e38, 3e38, 0.0,
                                                             -float("inf")] * 6).reshape(1, 3, 2, 8), _polar(1, 3, 1, 4))),
    "zero_batch": (rot_complex, lambda: (t(0, 3, 2, 8), _polar(1, 3, 1, 4))),
    "one_pair": (rot_complex, lambda: (t(1, 3, 2, 2), _polar(1, 3, 1, 1))),
}


ROT_MUTATIONS = {
    "cos_sin_swapped": (lambda x, cos, sin: x * sin + torch.cat((-x.chunk(2, -1)[1], x.chunk(2, -1)[0]), -1) * cos,
                        ROT_IN),
    "partial_rotary_first_half": (_rot_partial, lambda: (t(1, 2, 3, 16), t(1, 1, 3, 16), t(1, 1, 3, 16))),
    "cos_broadcast_over_heads_not_seq": (rot, lambda: (t(1, 2, 3, 8), t(1, 2, 1, 8), t(1, 2, 1, 8))),
    "cos_1d": (rot, lambda: (t(1, 2, 3, 8), t(8), t(8))),
    "cos_and_sin_different_shapes": (rot, lambda: (t(1, 2, 3, 8), t(1, 1, 3, 8), t(8))),
    "x_transposed_view": (lambda x, cos, sin: rot(x.transpose(1, 2), cos, sin),
                          lambda: (t(1, 3, 2, 8), t(1, 1, 3, 8), t(1, 1, 3, 8))),
    "sign_flipped": (_rot_halves(lambda x1, x2: torch.cat((x2, -x1), dim=-1)), ROT_IN),
    "halves_swapped": (_rot_halves(lambda x1, x2: torch.cat((-x1, x2), dim=-1)), ROT_IN),
    "no_neg": (_rot_halves(lambda x1, x2: torch.cat((x2, x1), dim=-1)), ROT_IN),
    "both_negated": (_rot_halves(lambda x1, x2: torch.cat((-x2, -x1), dim=-1)), ROT_IN),
    "interleaved_pairs": (_rot_interleaved, ROT_IN),
    "halves_over_heads": (lambda x, cos, sin: (lambda a, b: x * cos + torch.cat((-b, a), dim=1) * sin)(
        *x.chunk(2, dim=1)), ROT_IN),  # dim 1 of a 4-d x: the heads swapped, not the halves of a row
    "narrow_off_by_one": (lambda x, cos, sin: x * cos + torch.cat((-x.narrow(-1, 3, 4), x.narrow(-1, 0, 4)), -1) * sin,
                          ROT_IN),
    "uneven_split": (_rot_uneven, ROT_IN),
    "rotate_over_dim_-2": (_rot_dim_m2, lambda: (t(1, 2, 4, 8), t(1, 1, 4, 8), t(1, 1, 4, 8))),
    "minus_not_plus": (lambda x, cos, sin: x * cos - torch.cat((-x.chunk(2, -1)[1], x.chunk(2, -1)[0]), -1) * sin,
                       ROT_IN),
    "rotates_another_tensor": (lambda x, y, cos, sin: x * cos + torch.cat((-y.chunk(2, -1)[1], y.chunk(2, -1)[0]), -1)
                               * sin, lambda: (t(1, 2, 3, 8), t(1, 2, 3, 8), t(1, 1, 3, 8), t(1, 1, 3, 8))),
    "cos_times_cos": (lambda x, cos, sin: x * cos + torch.cat((-x.chunk(2, -1)[1], x.chunk(2, -1)[0]), -1) * cos,
                      ROT_IN),
    "cos_last_dim_1": (rot, lambda: (t(1, 2, 3, 8), t(1, 1, 3, 1), t(1, 1, 3, 1))),
    "cos_broadcasts_x_up": (rot, lambda: (t(1, 1, 3, 8), t(1, 2, 3, 8), t(1, 2, 3, 8))),
    "sin_broadcasts_x_up": (rot, lambda: (t(1, 2, 3, 8), t(1, 1, 3, 8), t(2, 2, 3, 8))),
    "cos_sin_expanded_along_the_row": (lambda x, cos, sin: rot(x, cos.expand(1, 1, 3, 8), sin.expand(1, 1, 3, 8)),
                                       lambda: (t(1, 2, 3, 8), t(1, 1, 3, 1), t(1, 1, 3, 1))),
    "x_inf_cos_0": (rot, lambda: (torch.full((1, 2, 3, 8), float("inf")), torch.zeros(1, 1, 3, 8), t(1, 1, 3, 8))),
    "x_times_cos_also_returned": (lambda x, cos, sin: (lambda a: (a + torch.cat((-x.chunk(2, -1)[1], x.chunk(2, -1)[0]),
                                                                              -1) * sin, a))(x * cos), ROT_IN),
    "rotated_half_also_returned": (lambda x, cos, sin: (lambda r: (x * cos + r * sin, r))(
        torch.cat((-x.chunk(2, -1)[1], x.chunk(2, -1)[0]), -1)), ROT_IN),
    "q_and_k_share_cos_sin": (lambda q, k, cos, sin: (rot(q, cos, sin), rot(k, cos, sin)),
                              lambda: (t(1, 4, 3, 8), t(1, 2, 3, 8), t(1, 1, 3, 8), t(1, 1, 3, 8))),
    "D_odd_slices": (rot_slices, lambda: (t(1, 2, 3, 7), t(1, 1, 3, 7), t(1, 1, 3, 7))),
    "D_odd_chunk": (rot, lambda: (t(1, 2, 3, 7), t(1, 1, 3, 7), t(1, 1, 3, 7))),
    "D_2": (rot, lambda: (t(1, 2, 3, 2), t(1, 1, 3, 2), t(1, 1, 3, 2))),
    "D_0_slices": (rot_slices, lambda: (t(1, 2, 3, 0), t(1, 1, 3, 0), t(1, 1, 3, 0))),
    # interleaved pairs: the pair's sign, order, tables or dims changed
    "every_two_sign_flipped": (lambda x, cos, sin: x * cos + torch.stack((x[..., 1::2], -x[..., ::2]), -1).flatten(-2)
                               * sin, ROT_IN),
    "every_two_pair_not_swapped": (lambda x, cos, sin: x * cos + torch.stack((-x[..., ::2], x[..., 1::2]), -1)
                                   .flatten(-2) * sin, ROT_IN),
    "every_two_stacked_on_dim_-2": (lambda x, cos, sin: x * cos + torch.stack((-x[..., 1::2], x[..., ::2]), -2)
                                    .flatten(-2) * sin, ROT_IN),
    "every_two_cos_broadcasts_x_up": (rot_every_two, lambda: (t(1, 1, 3, 8), t(1, 2, 3, 8), t(1, 2, 3, 8))),
    "every_two_x_transposed_view": (lambda x, cos, sin: rot_every_two(x.transpose(1, 2), cos, sin),
                                    lambda: (t(1, 3, 2, 8), t(1, 1, 3, 8), t(1, 1, 3, 8))),
    "pairs_minus_in_the_odd_term": (_rot_pairs_with(lambda a, b, c, s: a * c - b * s, lambda a, b, c, s: a * s - b * c),
                                    ROT_PAIRS_IN),
    "pairs_plus_in_the_even_term": (_rot_pairs_with(lambda a, b, c, s: a * c + b * s, lambda a, b, c, s: a * s + b * c),
                                    ROT_PAIRS_IN),
    "pairs_cos_sin_swapped": (_rot_pairs_with(lambda a, b, c, s: a * s - b * c, lambda a, b, c, s: a * c + b * s),
                              ROT_PAIRS_IN),
    "pairs_halves_not_pairs": (lambda x, cos, sin: (lambda x1, x2: torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos),
                                                                              -1).flatten(-2))(*x.chunk(2, -1)),
                               ROT_PAIRS_IN),
    "pairs_stacked_on_dim_-2": (_rot_pairs_with(lambda a, b, c, s: a * c - b * s, lambda a, b, c, s: a * s + b * c,
                                                dim=-2), ROT_PAIRS_IN),
    "pairs_table_broadcast_over_the_row": (rot_pairs, lambda: (t(1, 2, 3, 8), t(1, 1, 3, 1), t(1, 1, 3, 1))),
    "pairs_x_transposed_view": (lambda x, cos, sin: rot_pairs(x.transpose(1, 2), cos, sin),
                                lambda: (t(1, 3, 2, 8), t(1, 1, 3, 4), t(1, 1, 3, 4))),
    "pairs_x_inf_cos_0": (rot_pairs, lambda: (torch.full((1, 2, 3, 8), float("inf")), torch.zeros(1, 1, 3, 4),
                                              t(1, 1, 3, 4))),
    "pairs_D_2": (rot_pairs, lambda: (t(1, 2, 3, 2), t(1, 1, 3, 1), t(1, 1, 3, 1))),
}

# ---- one-token attention ---------------------------------------------------------------------------------

def attn(q, k, v, mask):  # patterns.decode_attention, with inv_scale = sqrt(8)
    scores = torch.matmul(q, k.transpose(2, 3)) / 2.8284271247461903
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def sdpa(q, k, v, mask):  # patterns.sdpa, scale given
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)


def repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def sdpa_gqa(q, k, v, mask):  # patterns.sdpa_repeat_kv
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask, scale=0.3)


def _mask(*shape: int) -> torch.Tensor:
    m = torch.rand(*shape) > 0.4
    if m.numel():
        m[..., 0] = True  # no row masked everywhere (cases of their own below)
    return m


ATT_IN = lambda: (t(1, 4, 1, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _mask(1, 1, 1, 6))  # noqa: E731
GQA_IN = lambda: (t(1, 4, 1, 8), t(1, 2, 6, 8), t(1, 2, 6, 8), _mask(1, 1, 1, 6))  # noqa: E731


def attn_mul(q, k, v, mask):  # written out, the scale multiplied (attention_patterns._written_form(divide=False))
    scores = torch.matmul(q, k.transpose(2, 3)) * 0.35
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def attn_gqa_interleave(q, k, v, mask):  # written out, GQA by repeat_interleave of the heads
    n = q.shape[1] // k.shape[1]
    return attn(q, k.repeat_interleave(n, dim=1), v.repeat_interleave(n, dim=1), mask)


def sdpa_no_mask(q, k, v, mask):  # SDPA without a mask, its default scale (mask unused)
    return F.scaled_dot_product_attention(q, k, v)


def sdpa_gqa_interleave(q, k, v, mask):  # SDPA, GQA by repeat_interleave, default scale
    n = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(n, dim=1), v.repeat_interleave(n, dim=1),
                                          attn_mask=mask)


def _additive(*shape: int) -> torch.Tensor:  # a float mask: a bias where attended, -inf where masked
    return t(*shape).masked_fill(~_mask(*shape), float("-inf"))


ATT_ADDITIVE_IN = lambda: (t(1, 4, 1, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _additive(1, 1, 1, 6))  # noqa: E731
GQA_ADDITIVE_IN = lambda: (t(1, 4, 1, 8), t(1, 2, 6, 8), t(1, 2, 6, 8), _additive(1, 1, 1, 6))  # noqa: E731


def attn_additive(q, k, v, mask):  # written out, an additive float mask (attention_patterns._written_form(mask_kind="additive"))
    scores = torch.matmul(q, k.transpose(-1, -2)) / 2.8284271247461903 + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def sdpa_additive_gqa(q, k, v, mask):  # SDPA with a float attn_mask, GQA by repeat_kv
    n = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, repeat_kv(k, n), repeat_kv(v, n), attn_mask=mask)


def attn_upcast(q, k, v, mask):  # the float32 softmax of transformers' eager attention (patterns, upcast=True)
    scores = (torch.matmul(q, k.transpose(2, 3)) * 0.35).masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


def attn_no_mask(q, k, v, mask):  # written out, no mask (attention_patterns._written_form(mask_kind="none")); mask unused
    return torch.matmul(torch.softmax(torch.matmul(q, k.mT) * 0.35, dim=-1), v)


# One key/value head broadcast to every query head (Falcon's multi-query attention): SDPA takes its math path there,
# which reaches the graph written out (q and k^T each scaled by sqrt(scale), _safe_softmax): attention_patterns._math_form
MQA_IN = lambda: (t(1, 4, 1, 8), t(1, 1, 6, 8), t(1, 1, 6, 8), _mask(1, 1, 1, 6))  # noqa: E731
MQA_ADDITIVE_IN = lambda: (t(1, 4, 1, 8), t(1, 1, 6, 8), t(1, 1, 6, 8), _additive(1, 1, 1, 6))  # noqa: E731


def sdpa_default_scale(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _mqa_row_masked_everywhere() -> tuple[Any, ...]:
    mask = _mask(2, 4, 1, 6)
    mask[1, 2] = False
    return t(2, 4, 1, 8), t(2, 1, 6, 8), t(2, 1, 6, 8), mask


def _masked_key_is(make: Callable[[], tuple[Any, ...]], value: float, everywhere: bool = False):
    """k's last position masked (every position, `everywhere`) and one of its entries `value`: eager adds the mask to
    the score where the mask is additive or the form is SDPA's (NaN or +inf plus -inf is NaN: the row is NaN), while
    a written masked_fill replaces it (found by a helper: the kernel skipped masked positions)."""
    def fn():
        q, k, v, mask = make()
        k, mask = k.clone(), mask.clone()
        k[..., -1, 0] = value
        if mask.dtype == torch.bool:
            mask[..., -1] = False
            if everywhere:
                mask[...] = False
        else:
            mask[..., -1] = float("-inf")
            if everywhere:
                mask[...] = float("-inf")
        return q, k, v, mask
    return fn


def attn_softcapped(q, k, v, mask, cap=50.0, after_mask=False):  # Gemma2's (attention_patterns._softcapped_form)
    n = q.shape[1] // k.shape[1]
    scores = torch.matmul(q, repeat_kv(k, n).transpose(2, 3)) * 0.125
    if after_mask:
        scores = scores + mask
    scores = torch.tanh(scores / cap) * cap
    if not after_mask:
        scores = scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), repeat_kv(v, n))


ATT_CANON = {"decode_attention": (attn, ATT_IN), "written_mul": (attn_mul, ATT_IN),
             "written_repeat_interleave": (attn_gqa_interleave, GQA_IN), "sdpa": (sdpa, ATT_IN),
             "sdpa_repeat_kv": (sdpa_gqa, GQA_IN), "sdpa_no_mask": (sdpa_no_mask, ATT_IN),
             "sdpa_repeat_interleave": (sdpa_gqa_interleave, GQA_IN),
             "written_additive": (attn_additive, ATT_ADDITIVE_IN), "written_no_mask": (attn_no_mask, ATT_IN),
             "written_upcast": (attn_upcast, ATT_IN),
             "sdpa_additive_repeat_kv": (sdpa_additive_gqa, GQA_ADDITIVE_IN),
             "sdpa_one_kv_head": (sdpa, MQA_IN), "sdpa_one_kv_head_additive": (sdpa_default_scale, MQA_ADDITIVE_IN),
             "sdpa_one_kv_head_no_mask": (sdpa_no_mask, MQA_IN),
             "softcapped_repeat_kv": (attn_softcapped, GQA_ADDITIVE_IN)}


def _attn_with(scores_fn: Callable[..., Any] = lambda q, k: torch.matmul(q, k.transpose(2, 3)) / 2.8284271247461903,
               fill: Callable[..., Any] = lambda s, m: s.masked_fill(~m, float("-inf")),
               softmax: Callable[..., Any] = lambda s: torch.softmax(s, dim=-1)) -> Callable[..., Any]:
    def fn(q, k, v, mask):
        return torch.matmul(softmax(fill(scores_fn(q, k), mask)), v)
    return fn


def _sdpa_with(**kw: Any) -> Callable[..., Any]:
    return lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def _repeat_kv_tiled(x, n_rep):  # head h reads kv head h % Hkv (not h // n_rep)
    b, h, s, d = x.shape
    return x[:, None].expand(b, n_rep, h, s, d).reshape(b, h * n_rep, s, d)


def _row_masked_everywhere() -> tuple[Any, ...]:
    mask = _mask(2, 4, 1, 6)
    mask[1, 2] = False
    return t(2, 4, 1, 8), t(2, 4, 6, 8), t(2, 4, 6, 8), mask


def _underflowed_value(make: Callable[[], tuple[Any, ...]], value: float) -> Callable[[], tuple[Any, ...]]:
    """Position 0 attended (every mask keeps it) with q . k_0 about 200 below the other scores: exp underflows to 0 in
    float32 and the reduced dtypes; v_0 holds `value`."""
    def fn():
        q, k, v, mask = (a.clone() for a in make())
        q[...] = q.abs() + 1.0
        k[:, :, 1:] = k[:, :, 1:].abs() + 1.0
        k[:, :, 0] = -(k[:, :, 0].abs() + 1.0) * 40.0
        v[:, :, 0, 3] = value
        return q, k, v, mask
    return fn


def _finfo_min_mask() -> tuple[Any, ...]:  # an additive mask of finfo.min (transformers' eager attention)
    q, k, v, mask = ATT_ADDITIVE_IN()
    return q, k, v, torch.where(mask.isinf(), torch.finfo(q.dtype).min, mask)


def _with_value(make: Callable[[], tuple[Any, ...]], arg: int, value: float) -> Callable[[], tuple[Any, ...]]:
    def fn():
        args = list(make())
        args[arg] = args[arg].clone()
        args[arg].view(-1)[0] = value
        return tuple(args)
    return fn


ATT_MUTATIONS = {
    # same meaning (may fire)
    "sdpa_default_scale": (_sdpa_with(), ATT_IN),
    "sdpa_enable_gqa": (_sdpa_with(scale=0.3, enable_gqa=True), GQA_IN),
    "mask_per_query_head": (attn, lambda: (t(1, 4, 1, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _mask(1, 4, 1, 6))),
    "sdpa_mask_per_query_head": (sdpa, lambda: (t(1, 4, 1, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _mask(1, 4, 1, 6))),
    "mask_1d": (attn, lambda: (t(1, 4, 1, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _mask(6))),
    "mask_per_batch_row": (attn, lambda: (t(2, 4, 1, 8), t(2, 4, 6, 8), t(2, 4, 6, 8), _mask(2, 1, 1, 6))),
    "sdpa_mask_per_batch_row": (sdpa, lambda: (t(2, 4, 1, 8), t(2, 4, 6, 8), t(2, 4, 6, 8), _mask(2, 1, 1, 6))),
    "one_kv_head_broadcast_by_matmul": (attn, lambda: (t(1, 4, 1, 8), t(1, 1, 6, 8), t(1, 1, 6, 8), _mask(1, 1, 1, 6))),
    "transpose_-1_-2": (_attn_with(scores_fn=lambda q, k: torch.matmul(q, k.transpose(-1, -2)) / 2.8284271247461903),
                        ATT_IN),
    "multiply_by_scale": (_attn_with(scores_fn=lambda q, k: torch.matmul(q, k.transpose(2, 3)) * 0.35), ATT_IN),
    "inv_scale_int": (_attn_with(scores_fn=lambda q, k: torch.matmul(q, k.transpose(2, 3)) / 3), ATT_IN),
    "kv_cache_prefix_views": (lambda q, k, v, mask: attn(q, k[:, :, :6], v[:, :, :6], mask),
                              lambda: (t(1, 4, 1, 8), t(1, 4, 9, 8), t(1, 4, 9, 8), _mask(1, 1, 1, 6))),
    "q_transposed_view": (lambda q, k, v, mask: attn(q.transpose(1, 2), k, v, mask),
                          lambda: (t(1, 1, 4, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _mask(1, 1, 1, 6))),
    "sdpa_scale_0": (_sdpa_with(scale=0.0), ATT_IN),
    "sdpa_scale_negative": (_sdpa_with(scale=-0.5), ATT_IN),
    "mask_expanded_view": (lambda q, k, v, mask: attn(q, k, v, mask.expand(1, 4, 1, 6)), ATT_IN),
    "sdpa_mask_expanded_view": (lambda q, k, v, mask: sdpa(q, k, v, mask.expand(1, 4, 1, 6)), ATT_IN),
    "mask_sliced_from_longer": (lambda q, k, v, mask: attn(q, k, v, mask[..., :6]),
                                lambda: (*ATT_IN()[:3], _mask(1, 1, 1, 9))),
    "kv_from_BSHD_cache": (lambda q, k, v, mask: attn(q, k.transpose(1, 2), v.transpose(1, 2), mask),
                           lambda: (t(1, 4, 1, 8), t(1, 6, 4, 8), t(1, 6, 4, 8), _mask(1, 1, 1, 6))),
    "sdpa_kv_from_BSHD_cache": (lambda q, k, v, mask: sdpa(q, k.transpose(1, 2), v.transpose(1, 2), mask),
                                lambda: (t(1, 4, 1, 8), t(1, 6, 4, 8), t(1, 6, 4, 8), _mask(1, 1, 1, 6))),
    "sdpa_one_kv_head_row_masked_everywhere": (sdpa, _mqa_row_masked_everywhere),
    "sdpa_one_kv_head_scale_negative": (_sdpa_with(scale=-0.5), MQA_IN),
    "sdpa_one_kv_head_scale_0": (_sdpa_with(scale=0.0), MQA_IN),
    "sdpa_one_kv_head_is_causal_one_token": (
        lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, is_causal=True), MQA_IN),
    "sdpa_one_kv_head_inf_score": (sdpa, _with_value(MQA_IN, 0, float("inf"))),
    "sdpa_one_kv_head_nan_in_v": (sdpa, _with_value(MQA_IN, 2, float("nan"))),
    "sdpa_one_kv_head_mask_per_query_head": (sdpa, lambda: (*MQA_IN()[:3], _mask(1, 4, 1, 6))),
    "sdpa_one_kv_head_two_query_tokens": (sdpa, lambda: (t(1, 4, 2, 8), t(1, 1, 6, 8), t(1, 1, 6, 8),
                                                         _mask(1, 1, 2, 6))),
    "sdpa_one_kv_head_two_batches_one_kv_batch": (sdpa, lambda: (t(2, 4, 1, 8), t(1, 1, 6, 8), t(1, 1, 6, 8),
                                                                 _mask(1, 1, 1, 6))),
    "sdpa_one_kv_head_tiny_scale_large_inputs": (  # the unscaled q . k overflows float32, eager's scaled one not
        _sdpa_with(scale=1e-30), lambda: tuple(a * 1e20 if a.is_floating_point() else a for a in MQA_IN())),
    "q_and_k_scaled_1e-40_and_1e40_then_safe_softmax": (  # eager's k * 1e40 is inf: NaN rows
        lambda q, k, v, mask: torch.matmul(torch.ops.aten._safe_softmax(
            torch.matmul(torch.ops.aten.mul.Scalar(q, 1e-40), torch.ops.aten.mul.Scalar(k.transpose(2, 3), 1e40))
            + mask, -1), v), MQA_ADDITIVE_IN),
    "q_and_k_scaled_apart_then_safe_softmax": (
        lambda q, k, v, mask: torch.matmul(torch.ops.aten._safe_softmax(
            torch.matmul(q * 0.5, k.transpose(2, 3) * 0.7) + mask, -1), v), MQA_ADDITIVE_IN),
    "softcapped_large_scores": (attn_softcapped, lambda: (t(1, 4, 1, 8) * 40, *GQA_ADDITIVE_IN()[1:])),
    "softcapped_cap_negative": (lambda q, k, v, mask: attn_softcapped(q, k, v, mask, cap=-30.0), GQA_ADDITIVE_IN),
    "softcapped_inf_score": (attn_softcapped, _with_value(GQA_ADDITIVE_IN, 0, float("inf"))),
    **{f"{name}_{what}_key_at_a_masked_position{'_row_masked_everywhere' if everywhere else ''}":
       (fn, _masked_key_is(make, value, everywhere))
       for name, (fn, make) in {"written": (attn, ATT_IN), "written_additive": (attn_additive, ATT_ADDITIVE_IN),
                                "sdpa": (sdpa, ATT_IN), "sdpa_one_kv_head": (sdpa, MQA_IN),
                                "softcapped": (attn_softcapped, GQA_ADDITIVE_IN)}.items()
       for what, value in (("nan", float("nan")), ("inf", float("inf"))) for everywhere in (False, True)},
    # scores near float16's range: eager computes them in float16, rounding every step (round_scores; found by a helper)
    "written_additive_float16_mask_of_finfo_min_everywhere": (attn_additive, lambda: (
        *(a.half() for a in ATT_ADDITIVE_IN()[:3]), torch.full((1, 1, 1, 6), torch.finfo(torch.float16).min).half())),
    "softcapped_float16_cap_1e6": (lambda q, k, v, mask: attn_softcapped(q, k, v, mask, cap=1e6),
                                   lambda: tuple(a.half() for a in GQA_ADDITIVE_IN())),
    "softcapped_bfloat16_cap_1e30": (lambda q, k, v, mask: attn_softcapped(q, k, v, mask, cap=1e30),
                                     lambda: tuple(a.bfloat16() for a in GQA_ADDITIVE_IN())),
    # finite keys whose score overflows at a masked position: inf + -inf is NaN in eager (the kernel's bound on a
    # masked position's score must not skip it)
    "sdpa_large_finite_key_at_a_masked_position": (sdpa, lambda: (lambda a: (a[0].abs() * 1e20, *a[1:]))(
        _masked_key_is(ATT_IN, 3e19)())),
    "written_additive_float16_score_overflowing_at_a_masked_position": (attn_additive, lambda: tuple(
        x.half() for x in (lambda a: (a[0].abs() * 200, *a[1:]))(_masked_key_is(ATT_ADDITIVE_IN, 3000.0)()))),
    # another meaning
    "softcapped_cap_0": (lambda q, k, v, mask: attn_softcapped(q, k, v, mask, cap=0.0), GQA_ADDITIVE_IN),
    "softcapped_cap_inf": (lambda q, k, v, mask: attn_softcapped(q, k, v, mask, cap=float("inf")), GQA_ADDITIVE_IN),
    "softcapped_after_the_mask": (lambda q, k, v, mask: attn_softcapped(q, k, v, mask, after_mask=True),
                                  GQA_ADDITIVE_IN),
    "softcap_without_the_multiply_back": (
        lambda q, k, v, mask: torch.matmul(torch.softmax(torch.tanh(torch.matmul(q, repeat_kv(k, 2).transpose(2, 3))
                                                                   * 0.125 / 50.0) + mask, dim=-1), repeat_kv(v, 2)),
        GQA_ADDITIVE_IN),
    "softmax_over_dim_-2": (_attn_with(softmax=lambda s: torch.softmax(s, dim=-2)), ATT_IN),
    "softmax_over_dim_1": (_attn_with(softmax=lambda s: torch.softmax(s, dim=1)), ATT_IN),
    "softmax_in_float64": (_attn_with(softmax=lambda s: torch.softmax(s, dim=-1, dtype=torch.float64).float()), ATT_IN),
    "log_softmax": (_attn_with(softmax=lambda s: torch.log_softmax(s, dim=-1).nan_to_num(0.0)), ATT_IN),
    "mask_not_inverted": (_attn_with(fill=lambda s, m: s.masked_fill(m, float("-inf"))), ATT_IN),
    "masked_fill_with_0": (_attn_with(fill=lambda s, m: s.masked_fill(~m, 0.0)), ATT_IN),
    "masked_fill_with_-1e9": (_attn_with(fill=lambda s, m: s.masked_fill(~m, -1e9)), ATT_IN),
    "additive_float_mask": (_attn_with(fill=lambda s, m: s + m), lambda: (*ATT_IN()[:3], t(1, 1, 1, 6))),
    "sdpa_float_mask": (sdpa, lambda: (*ATT_IN()[:3], t(1, 1, 1, 6))),
    "sdpa_is_causal": (lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
                       ATT_IN),
    "sdpa_dropout_p_0.5": (_sdpa_with(scale=0.3, dropout_p=0.5), ATT_IN),
    "mask_batch_broadcast_up": (attn, lambda: (t(1, 4, 1, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _mask(2, 1, 1, 6))),
    "mask_per_query_token_5d": (attn, lambda: (t(1, 4, 1, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _mask(3, 1, 1, 1, 6))),
    "two_query_tokens": (attn, lambda: (t(1, 4, 2, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _mask(1, 1, 2, 6))),
    "sdpa_two_query_tokens": (sdpa, lambda: (t(1, 4, 2, 8), t(1, 4, 6, 8), t(1, 4, 6, 8), _mask(1, 1, 2, 6))),
    "q_batch_broadcast_by_matmul": (attn, lambda: (t(1, 4, 1, 8), t(2, 4, 6, 8), t(2, 4, 6, 8), _mask(1, 1, 1, 6))),
    "v_of_another_head_dim": (attn, lambda: (t(1, 4, 1, 8), t(1, 4, 6, 8), t(1, 4, 6, 16), _mask(1, 1, 1, 6))),
    "sdpa_v_of_another_head_dim": (sdpa, lambda: (t(1, 4, 1, 8), t(1, 4, 6, 8), t(1, 4, 6, 16), _mask(1, 1, 1, 6))),
    "q_at_k_no_transpose": (_attn_with(scores_fn=lambda q, k: torch.matmul(q, k) / 2.8284271247461903),
                            lambda: (t(1, 4, 1, 8), t(1, 4, 8, 6), t(1, 4, 6, 8), _mask(1, 1, 1, 6))),
    "k_transposed_over_heads": (_attn_with(scores_fn=lambda q, k: torch.matmul(q, k.transpose(1, 3).transpose(2, 3))
                                           / 2.8284271247461903),
                                lambda: (t(1, 4, 1, 8), t(1, 8, 6, 4), t(1, 4, 6, 8), _mask(1, 1, 1, 6))),
    "scale_after_softmax": (lambda q, k, v, mask: torch.matmul(
        torch.softmax(torch.matmul(q, k.transpose(2, 3)).masked_fill(~mask, float("-inf")), dim=-1) / 2.0, v), ATT_IN),
    "v_is_k": (lambda q, k, v, mask: attn(q, k, k, mask), ATT_IN),
    "inv_scale_0": (_attn_with(scores_fn=lambda q, k: torch.matmul(q, k.transpose(2, 3)) / 0.0), ATT_IN),
    "repeat_kv_tiled_not_interleaved": (
        lambda q, k, v, mask: F.scaled_dot_product_attention(q, _repeat_kv_tiled(k, 2), _repeat_kv_tiled(v, 2),
                                                             attn_mask=mask, scale=0.3), GQA_IN),
    "repeat_kv_of_k_only": (lambda q, k, v, mask: F.scaled_dot_product_attention(
        q, repeat_kv(k, 2), v.repeat(1, 2, 1, 1), attn_mask=mask, scale=0.3), GQA_IN),
    "probabilities_also_returned": (lambda q, k, v, mask: (lambda p: (torch.matmul(p, v), p))(torch.softmax(
        (torch.matmul(q, k.transpose(2, 3)) / 2.8284271247461903).masked_fill(~mask, float("-inf")), dim=-1)), ATT_IN),
    "scores_also_returned": (lambda q, k, v, mask: (lambda sc: (torch.matmul(torch.softmax(
        sc.masked_fill(~mask, float("-inf")), dim=-1), v), sc))(
            torch.matmul(q, k.transpose(2, 3)) / 2.8284271247461903), ATT_IN),
    "q_k_v_one_tensor": (lambda q, k, v, mask: attn(q, q, q, mask), lambda: (t(1, 4, 1, 8), None, None, _mask(1))),
    # values and degenerate shapes
    "row_masked_everywhere": (attn, _row_masked_everywhere),
    "sdpa_row_masked_everywhere": (sdpa, _row_masked_everywhere),
    "sdpa_empty_kv_cache": (sdpa, lambda: (t(1, 4, 1, 8), t(1, 4, 0, 8), t(1, 4, 0, 8), _mask(1, 1, 1, 0))),
    "nan_in_q": (attn, _with_value(ATT_IN, 0, float("nan"))),
    "inf_in_k": (attn, _with_value(ATT_IN, 1, float("inf"))),
    "huge_scores": (attn, lambda: (t(1, 4, 1, 8) * 1e18, t(1, 4, 6, 8) * 1e18, t(1, 4, 6, 8), _mask(1, 1, 1, 6))),
}

def _inf_score(make: Callable[[], tuple[Any, ...]]) -> Callable[[], tuple[Any, ...]]:
    """q > 0 and the first cached key +inf: that score is +inf in every head (eager's softmax: NaN)."""
    def fn():
        q, k, v, mask = make()
        k = k.clone()
        k[:, :, 0, :] = float("inf")
        return q.abs() + 0.1, k, v, mask
    return fn


def _all_scores_neg_inf() -> tuple[Any, ...]:
    """Every score -inf, no position masked (eager's SDPA: 0; the written-out softmax: NaN)."""
    q = torch.zeros(1, 4, 1, 8)
    q[..., 0] = float("-inf")
    k = t(1, 4, 6, 8)
    k[..., 0] = k[..., 0].abs() + 0.1
    return q, k, t(1, 4, 6, 8), _mask(1, 1, 1, 6)


def _scale_tensor(q, k, v, mask, scale):  # the scale a 0-d tensor (a graph input), not a number
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    return torch.matmul(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1), v)


def _inv_scale_tensor(q, k, v, mask, inv_scale):
    scores = torch.matmul(q, k.transpose(2, 3)) / inv_scale
    return torch.matmul(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1), v)


ATT_MUTATIONS.update({
    # the newer forms (written out with a multiplied scale, repeat_interleave, SDPA without a mask)
    "sdpa_no_mask_given_scale": (lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, scale=0.3), ATT_IN),
    "scale_as_0d_tensor": (_scale_tensor, lambda: (*ATT_IN(), torch.tensor(0.35))),
    "inv_scale_as_0d_tensor": (_inv_scale_tensor, lambda: (*ATT_IN(), torch.tensor(2.5))),
    "repeat_interleave_over_positions": (
        lambda q, k, v, mask: attn(q, k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2), mask),
        lambda: (t(1, 2, 1, 8), t(1, 2, 3, 8), t(1, 2, 3, 8), _mask(1, 1, 1, 6))),
    "repeat_interleave_too_many_then_sliced": (  # head h reads kv head h // 4, not h // 2
        lambda q, k, v, mask: attn(q, k.repeat_interleave(4, dim=1)[:, :4], v.repeat_interleave(4, dim=1)[:, :4], mask),
        GQA_IN),
    "sdpa_repeat_interleave_k_repeat_v": (  # k interleaved, v tiled: two mappings
        lambda q, k, v, mask: F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), v.repeat(1, 2, 1, 1),
                                                             attn_mask=mask), GQA_IN),
    "written_gqa_k_and_v_swapped_heads": (
        lambda q, k, v, mask: attn(q, k.repeat_interleave(2, dim=1), v.flip(1).repeat_interleave(2, dim=1), mask),
        GQA_IN),
    "sdpa_no_mask_is_causal": (lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, is_causal=True), ATT_IN),
    "sdpa_no_mask_dropout": (lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3), ATT_IN),
    "sdpa_no_mask_head_dim_0": (sdpa_no_mask, lambda: (t(1, 4, 1, 0), t(1, 4, 6, 0), t(1, 4, 6, 0), _mask(6))),
    # values and degenerate shapes
    "empty_kv_cache": (attn, lambda: (t(1, 4, 1, 8), t(1, 4, 0, 8), t(1, 4, 0, 8), _mask(1, 1, 1, 0))),
    "written_mul_empty_kv_cache": (attn_mul, lambda: (t(1, 4, 1, 8), t(1, 4, 0, 8), t(1, 4, 0, 8), _mask(1, 1, 1, 0))),
    "sdpa_no_mask_empty_kv_cache": (sdpa_no_mask, lambda: (t(1, 4, 1, 8), t(1, 4, 0, 8), t(1, 4, 0, 8), None)),
    "sdpa_nan_in_q": (sdpa, _with_value(ATT_IN, 0, float("nan"))),
    "sdpa_no_mask_nan_in_k": (sdpa_no_mask, _with_value(ATT_IN, 1, float("nan"))),
    "sdpa_inf_in_k": (sdpa, _with_value(ATT_IN, 1, float("inf"))),
    "inf_score": (attn, _inf_score(ATT_IN)),
    "all_scores_-inf": (attn, _all_scores_neg_inf),
    "sdpa_all_scores_-inf": (sdpa, _all_scores_neg_inf),
    "sdpa_no_mask_all_scores_-inf": (sdpa_no_mask, _all_scores_neg_inf),
    "sdpa_scale_inf": (_sdpa_with(scale=float("inf")), ATT_IN),
    "sdpa_inf_score": (sdpa, _inf_score(ATT_IN)),
    # an attended position whose probability underflows to 0 (its score ~200 below the row's largest), its value inf or
    # NaN: eager's matmul reads it (0 * inf = NaN); the first version skipped it (found by a helper)
    **{f"{name}_v_{what}_at_an_underflowed_position": (fn, _underflowed_value(make, value))
       for name, fn, make in (("written", attn, ATT_IN), ("sdpa", sdpa, ATT_IN), ("sdpa_no_mask", sdpa_no_mask, ATT_IN),
                              ("written_additive", attn_additive, ATT_ADDITIVE_IN),
                              ("written_finfo_min_mask", attn_additive, _finfo_min_mask))
       for what, value in (("inf", float("inf")), ("nan", float("nan")))},
    "sdpa_no_mask_inf_score": (sdpa_no_mask, _inf_score(ATT_IN)),
})

# ---- Bloom's ALiBi attention ------------------------------------------------------------------------------------

def alibi_attn(q, k, v, alibi, mask, beta=1.0, alpha=0.125):  # attention_patterns.alibi_attention, as Bloom writes it
    b, h, tq, d = q.shape
    q3, k3 = q.reshape(b * h, -1, d), k.reshape(b * h, -1, d).transpose(-1, -2)
    scores = alibi.baddbmm(batch1=q3, batch2=k3, beta=beta, alpha=alpha)
    w = scores.view(b, h, tq, -1) + mask
    p = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.bmm(p.view(b * h, tq, -1), v.reshape(b * h, -1, d)).view(b, h, tq, d)  # then Bloom's _merge_heads


def _alibi_in(tq: int = 1, s: int = 6, heads: int = 4, alibi_rows: int = 1, mask_value: float = float("-inf")):
    def make():
        q, k, v = t(1, heads, tq, 8), t(1, heads, s, 8), t(1, heads, s, 8)
        slopes = torch.tensor([2.0 ** -(i + 1) for i in range(heads)])
        alibi = (slopes[:, None, None] * torch.arange(s)).expand(heads, alibi_rows, s).contiguous()
        keep = torch.rand(1, 1, tq, s) > 0.3
        keep[..., :1] = True
        return q, k, v, alibi, torch.zeros(1, 1, tq, s).masked_fill(~keep, mask_value)
    return make


ALIBI_IN = _alibi_in()
ALIBI_CANON = {"bloom": (alibi_attn, ALIBI_IN)}
ALIBI_MUTATIONS = {
    "beta_not_1": (lambda q, k, v, a, m: alibi_attn(q, k, v, a, m, beta=0.5), ALIBI_IN),
    "alpha_negative": (lambda q, k, v, a, m: alibi_attn(q, k, v, a, m, alpha=-0.125), ALIBI_IN),
    "finfo_min_mask": (alibi_attn, _alibi_in(mask_value=torch.finfo(torch.float32).min)),
    "a_row_masked_everywhere": (alibi_attn, lambda: (lambda a: (*a[:4], torch.full_like(a[4], float("-inf"))))(
        ALIBI_IN())),
    "two_query_tokens": (alibi_attn, _alibi_in(tq=2)),
    "alibi_per_query_row": (alibi_attn, _alibi_in(tq=2, alibi_rows=2)),
    "mask_per_head": (alibi_attn, lambda: (lambda a: (*a[:4], a[4].expand(1, 4, 1, 6).contiguous()))(ALIBI_IN())),
    "mask_float64": (alibi_attn, lambda: (lambda a: (*a[:4], a[4].double()))(ALIBI_IN())),  # promotes the scores
    "softmax_over_dim_-2": (lambda q, k, v, a, m: torch.bmm(F.softmax(
        a.baddbmm(q.reshape(4, -1, 8), k.reshape(4, -1, 8).transpose(-1, -2), beta=1.0, alpha=0.125).view(1, 4, 1, -1)
        + m, dim=-2).view(4, 1, -1), v.reshape(4, -1, 8)), ALIBI_IN),
    "alibi_subtracted": (lambda q, k, v, a, m: alibi_attn(q, k, v, -a, m), ALIBI_IN),
    # (an inf in v at a masked position is the documented exception: not read; docs/fused-mode.md)
    "v_inf_at_an_attended_position": (alibi_attn, lambda: (lambda a: (a[0], a[1], a[2].index_fill(2, torch.tensor([0]),
                                                                                                  float("inf")),
                                                                     *a[3:]))(ALIBI_IN())),
    "q_nan": (alibi_attn, lambda: (lambda a: (a[0].index_fill(3, torch.tensor([0]), float("nan")), *a[1:]))(ALIBI_IN())),
    "empty_cache": (alibi_attn, _alibi_in(s=0)),
    "one_position": (alibi_attn, _alibi_in(s=1)),
}


# What this file found, now fixed, each still a variant above: decode_attention took a row as masked everywhere from
# a NaN softmax sum (a NaN input, a +inf score: the SDPA forms gave 0 where eager gives NaN), fired on an empty KV
# cache (NaN where eager gives 0), and the written forms' retrace divided by a head count of 0 (a ZeroDivisionError
# failed the fused compile): Note [A row's edge cases are eager's] (csrc/fused/attention.cpp), _attention_check
# (graphex/fusion/patterns.py), Note [A pattern that cannot retrace a match declines it] (graphex/compat/inductor.py).
XFAIL: dict[str, str] = {}  # variant id: what is wrong (a bug found and not fixed yet stays here, failing strictly)


# ---- the generator ----------------------------------------------------------------------------------------

FAMILIES = {  # family: (canonical spellings, pattern that must fire on them, hand-written mutations)
    "rms_norm": (RMS_CANON, "rms_norm", RMS_MUTATIONS),
    "add_rms_norm": (ADD_CANON, "add_rms_norm", ADD_MUTATIONS),
    "gated_mlp": (MLP_CANON, "gated_mlp", MLP_MUTATIONS),
    "gated_mlp_packed": (PACKED_CANON, "gated_mlp_packed", PACKED_MUTATIONS),
    "silu_mul": (SM_CANON, "silu_mul", SM_MUTATIONS),
    "rotary": (ROT_CANON, "rotary", ROT_MUTATIONS),
    "rotary_complex": (ROTC_CANON, "rotary", ROTC_MUTATIONS),
    "attention": (ATT_CANON, "decode_attention", ATT_MUTATIONS),
    "alibi_attention": (ALIBI_CANON, "decode_attention", ALIBI_MUTATIONS),
}


def _cast(make: Callable[[], tuple[Any, ...]], dtype: torch.dtype, only: int | None = None):
    def fn():
        return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() and only in (None, i) else a
                     for i, a in enumerate(make()))
    return fn


def _reshape(make: Callable[[], tuple[Any, ...]], how: Callable[[tuple[Any, ...]], tuple[Any, ...]]):
    return lambda: how(make())


def _contexts(family: str, fn: Callable[..., Any], make: Callable[[], tuple[Any, ...]]) -> None:
    """The canonical spelling in another context: chained, its output viewed, its input written in place before or
    after it, under autocast."""
    first = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731

    def chained(*a):  # the pattern applied to its own output (x's shape: every family's first output)
        return fn(first(fn(*a)), *a[1:])

    def output_transposed(*a):
        return first(fn(*a)).transpose(0, -2)

    def output_flat(*a):
        return first(fn(*a)).reshape(-1)

    def input_written_before(*a):
        a[0].mul_(0.5)
        return fn(*a)

    def input_written_after(*a):
        out = fn(*a)
        a[0].add_(1.0)
        return out

    def under_autocast(*a):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(*a)

    for name, g in (("chained", chained), ("output_transposed", output_transposed), ("output_flat", output_flat),
                    ("input_written_before", input_written_before), ("input_written_after", input_written_after),
                    ("under_autocast_bf16", under_autocast)):
        variant(f"{family}/context/{name}", g, make)


# torch 2.11's CPU SDPA dies with SIGFPE on 0 heads (eager itself: the process, not a Python error; 2.13 returns an
# empty tensor), so those variants are not generated there: no graphex result could be compared with eager's.
_EAGER_SDPA_DIES_ON_ZERO_HEADS = compat.TORCH_VERSION < (2, 13)


def _generate() -> None:
    for family, (canon, pattern, mutations) in FAMILIES.items():
        for k, (name, (fn, make)) in enumerate(canon.items()):
            must = "decode_attention" if family == "attention" else pattern
            variant(f"{family}/{name}", fn, make, fire=(must,))
            # dtypes: float32, bfloat16 and float16 are fused, float64 is not (float16 on the first spelling of a
            # family only: time)
            for dtype in (torch.float64, torch.bfloat16, torch.float16)[:3 if k == 0 else 2]:
                if family == "rotary_complex" and dtype == torch.float64:
                    continue  # the code itself computes in float32 (x.float()): not another dtype's case
                reduced = dtype != torch.float64
                # a norm without the float32 upcast is not fused in float16 (patterns._norm_checks): not a must
                # nor Bloom's attention in a reduced dtype (attention_patterns: eager's baddbmm rounds in its own order)
                fires = reduced and not (dtype == torch.float16 and family in ("rms_norm", "add_rms_norm")
                                         and "upcast" not in name) and family != "alibi_attention"
                variant(f"{family}/{name}/all_{str(dtype)[6:]}", fn, _cast(make, dtype),
                        none=not reduced, fire=(must,) if fires else ())
            # non-contiguous inputs: a column-major copy (same values); view_as_complex needs each pair adjacent, so
            # eager itself refuses a non-contiguous x there
            if family != "rotary_complex":
                variant(f"{family}/{name}/noncontiguous_inputs", fn,
                        _reshape(make, lambda args: tuple(
                            a.transpose(0, -1).contiguous().transpose(0, -1)
                            if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.dtype != torch.bool else a
                            for a in args)))
            if k:
                continue
            # one input of another dtype (where eager takes it: the elementwise patterns promote)
            if family in ("rms_norm", "add_rms_norm", "silu_mul", "rotary"):
                for i in range(len(make())):
                    variant(f"{family}/{name}/arg{i}_float64", fn, _cast(make, torch.float64, only=i))
            variant(f"{family}/{name}/dynamic", fn, make, dynamic=True)  # symbolic sizes: declined, exact
            variant(f"{family}/{name}/training", fn, make, train=True)
        first_fn, first_make = next(iter(canon.values()))
        _contexts(family, first_fn, first_make)
        if family in ("rms_norm", "add_rms_norm", "silu_mul"):  # shapes: one row, no rows, last dim 1 or odd
            variant(f"{family}/one_row", first_fn, _reshape(first_make, lambda a: tuple(
                x[:1, :1] if x.dim() >= 2 else x for x in a)))
            variant(f"{family}/zero_rows", first_fn, _reshape(first_make, lambda a: tuple(
                x[:0] if x.dim() >= 2 else x for x in a)))
            variant(f"{family}/last_dim_odd", first_fn, _reshape(first_make, lambda a: tuple(x[..., :13] for x in a)))
            variant(f"{family}/last_dim_1", first_fn, _reshape(first_make, lambda a: tuple(x[..., :1] for x in a)))
            variant(f"{family}/last_dim_0", first_fn, _reshape(first_make, lambda a: tuple(x[..., :0] for x in a)))
            variant(f"{family}/1d", first_fn, _reshape(first_make, lambda a: tuple(x[0, 0] if x.dim() >= 2 else x
                                                                                 for x in a)))
        if family == "gated_mlp":
            variant("gated_mlp/zero_rows", first_fn, _reshape(MLP_IN2, lambda a: (a[0][:0], *a[1:])))
            variant("gated_mlp/one_row", first_fn, _reshape(MLP_IN2, lambda a: (a[0][:1], *a[1:])))
            for dtype in (torch.bfloat16, torch.float16):  # a decode step: matvec inside the fused MLP
                variant(f"gated_mlp/one_row_{str(dtype)[6:]}", first_fn,
                        _cast(_reshape(MLP_IN2, lambda a: (a[0][:1], *a[1:])), dtype), fire=("gated_mlp",))
            variant("gated_mlp/intermediate_0", first_fn, lambda: (t(3, 16), t(0, 16), t(0, 16), t(16, 0)))
        if family == "rotary":
            variant("rotary/zero_batch", first_fn, _reshape(first_make, lambda a: (a[0][:0], *a[1:])))
            variant("rotary/one_position", first_fn, _reshape(first_make, lambda a: tuple(x[:, :, :1] for x in a)))
        if family == "attention":
            for name, (fn, make) in canon.items():  # zero batch rows, zero heads (query and key/value)
                variant(f"attention/{name}/zero_batch", fn, _reshape(make, lambda a: (*(x[:0] for x in a[:3]), a[3])))
                if "repeat" in name:
                    continue  # n_rep = 0 // 0: eager itself fails
                if "sdpa" in name and _EAGER_SDPA_DIES_ON_ZERO_HEADS:
                    continue
                zero_heads = _reshape(make, lambda a: (*(x[:, :0] for x in a[:3]), a[3]))
                variant(f"attention/{name}/zero_heads", fn, zero_heads)
            variant("attention/head_dim_0", attn, lambda: (t(1, 4, 1, 0), t(1, 4, 6, 0), t(1, 4, 6, 0), _mask(6)))
            variant("attention/one_position", attn, lambda: (t(1, 4, 1, 8), t(1, 4, 1, 8), t(1, 4, 1, 8),
                                                             torch.ones(1, 1, 1, 1, dtype=torch.bool)))
        for name, (fn, make) in mutations.items():
            variant(f"{family}/{name}", fn, make)


_generate()
assert set(XFAIL) <= {v.id for v in VARIANTS}, set(XFAIL) - {v.id for v in VARIANTS}


# ---- running one variant ----------------------------------------------------------------------------------

# one_token_attention is decode_attention's general form (a scaled q, a cap, rounded scores): either is "the attention
# kernel fired"
_SAME_KERNEL = {"one_token_attention": "decode_attention"}


def _fused_ops(gm: torch.fx.GraphModule) -> collections.Counter[str]:
    return collections.Counter(_SAME_KERNEL.get(n.target._opname, n.target._opname) for n in gm.graph.nodes
                               if n.op == "call_function" and getattr(n.target, "namespace", "") == "graphex_fused")


def _leaves(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    bits = _BITS[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    d = (a.double() - b.double()).abs()
    d = torch.where((a == b) | (a.isnan() & b.isnan()), 0.0, d.nan_to_num(float("inf")))
    return d.max().item()


def _inputs(args: tuple[Any, ...], train: bool) -> list[Any]:
    return [(a.clone().requires_grad_(train and a.is_floating_point())) if isinstance(a, torch.Tensor) else a
            for a in args]


def _call(fn: Callable[..., Any], args: tuple[Any, ...], v: Variant, seed: int) -> list[Any]:
    """fn's outputs, then every input after the call (a fused op must not lose an in-place write), then (training)
    the gradients of sum(outputs) with respect to the floating inputs."""
    inputs = _inputs(args, v.train)
    torch.manual_seed(seed)
    with torch.set_grad_enabled(v.train):
        outs = _leaves(fn(*inputs))
    result = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
    result += [a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]
    if v.train:
        diff = [i for i in inputs if isinstance(i, torch.Tensor) and i.requires_grad]
        loss = sum(o.sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
        grads = torch.autograd.grad(loss, diff, allow_unused=True)
        result += [g if g is not None else torch.zeros(()) for g in grads]
    return result


def _fired_in(new: list[Any]) -> collections.Counter[str]:
    fired: collections.Counter[str] = collections.Counter()
    for g in new:
        fired.update(_fused_ops(g.gm))
    return fired


def _run_alone(v: Variant, args: tuple[Any, ...], seed: int) -> tuple[list[Any], collections.Counter[str]]:
    before = live_graphs()  # (conftest's captures() also runs gc.collect: 0.1 s a call)
    try:
        got = _call(compile_graphex(v.fn, dynamic=v.dynamic, pattern_fusion_pass=True), args, v, seed)
    except Exception as e:  # a fused compile must not fail where exact mode compiles
        torch._dynamo.reset()
        _call(compile_graphex(v.fn, dynamic=v.dynamic), args, v, seed)
        cause = e
        while (getattr(cause, "inner_exception", None) or cause.__cause__) is not None:  # Dynamo's wrapper: the cause
            cause = getattr(cause, "inner_exception", None) or cause.__cause__
        raise AssertionError(f"{v.id}: the fused compile failed where exact mode compiles: "
                             f"{type(cause).__name__}: {cause}") from e
    new = [g for g in live_graphs() if not any(g is b for b in before)]
    assert new, f"{v.id}: no graph captured"
    return got, _fired_in(new)


# Note [Variants are compiled in groups]
# One compile per variant costs ~0.1 s (Dynamo and AOTAutograd, not the matcher), so variants that need no
# compile of their own (not dynamic, not training, not an expected failure, drawing no random numbers) are
# compiled GROUP at a time: one function calls each member on inputs of its own and returns all outputs. The
# members share no tensor, so no match spans two of them; each graphex_fused node is credited to the one member
# whose inputs it reads (the placeholders' graphex_user_name, `flat[i]`). When a group fails to compile, or a
# fused node cannot be credited to exactly one member, every member is compiled alone instead.
GROUP = 12
_RESULTS: dict[str, tuple[list[Any], collections.Counter[str]]] = {}


def _alone(v: Variant) -> bool:
    return v.dynamic or v.train or bool(v.xfail) or "dropout" in v.id


def _make_groups() -> dict[str, list[Variant]]:
    groups: dict[str, list[Variant]] = {}
    chunk: list[Variant] = []
    for v in VARIANTS:
        if _alone(v):
            groups[v.id] = [v]
            continue
        if chunk and (len(chunk) == GROUP or chunk[0].id.split("/")[0] != v.id.split("/")[0]):
            chunk = []
        chunk.append(v)
        groups[v.id] = chunk
    return groups


GROUPS = _make_groups()


def _inputs_of(v: Variant) -> tuple[int, tuple[Any, ...]]:
    seed = zlib.crc32(v.id.encode())
    torch.manual_seed(seed)
    return seed, v.make()


def _run_group(members: list[Variant], counts: list[int]) -> dict[str, tuple[list[Any], collections.Counter[str]]]:
    """Compile the members as one function (Note [Variants are compiled in groups]); {id: (got, fired)}."""
    member_args = [_inputs_of(m)[1] for m in members]
    spans, flat = [], []
    for args in member_args:
        spans.append((len(flat), len(flat) + len(args)))
        flat += _inputs(args, False)

    def group(*flat):
        outs = []
        for m, (lo, hi) in zip(members, spans):
            outs.extend(_leaves(m.fn(*flat[lo:hi])))
        return tuple(outs)

    before = live_graphs()
    with torch.no_grad():
        outs = [o.detach() for o in compile_graphex(group, pattern_fusion_pass=True)(*flat)]
    new = [g for g in live_graphs() if not any(g is b for b in before)]
    if len(new) != 1:
        raise RuntimeError(f"{len(new)} graphs")
    owner = {}  # placeholder -> member
    for node in new[0].gm.graph.find_nodes(op="placeholder"):
        name = node.meta.get("graphex_user_name", "")
        if name.startswith("flat[") and name.endswith("]"):
            i = int(name[5:-1])
            owner[node] = next(k for k, (lo, hi) in enumerate(spans) if lo <= i < hi)
    fired: list[collections.Counter[str]] = [collections.Counter() for _ in members]
    for node in new[0].gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "namespace", "") == "graphex_fused":
            seen, todo, whose = set(), [node], set()
            while todo:
                n = todo.pop()
                if n in seen:
                    continue
                seen.add(n)
                if n in owner:
                    whose.add(owner[n])
                todo.extend(n.all_input_nodes)
            if len(whose) != 1:
                raise RuntimeError(f"{node.name} reads the inputs of {len(whose)} members")
            fired[whose.pop()][_SAME_KERNEL.get(node.target._opname, node.target._opname)] += 1
    results, at = {}, 0
    for m, n, (lo, hi), f in zip(members, counts, spans, fired):
        results[m.id] = (outs[at:at + n] + [a.detach() if isinstance(a, torch.Tensor) else a for a in flat[lo:hi]], f)
        at += n
    return results


def _run(v: Variant) -> tuple[list[Any], list[Any], collections.Counter[str]]:
    """(compiled's results, eager's results, the graphex_fused ops that fired in v's code): outputs, the inputs
    after the call, and (training) the gradients."""
    seed, args = _inputs_of(v)
    want = _call(v.fn, args, v, seed)
    if v.id not in _RESULTS:
        members = GROUPS[v.id]
        if len(members) > 1:
            counts = [len(_leaves(m.fn(*_inputs(_inputs_of(m)[1], False)))) for m in members]
            try:
                _RESULTS.update(_run_group(members, counts))
            except Exception:  # compiled alone below, where a failure is this variant's own
                torch._dynamo.reset()
        if v.id not in _RESULTS:
            _RESULTS[v.id] = _run_alone(v, args, seed)
    got, fired = _RESULTS.pop(v.id)
    return got, want, fired


def _param(v: Variant) -> Any:
    xfail = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=v.xfail)] if v.xfail else []
    return pytest.param(v, id=v.id, marks=xfail)


@pytest.mark.parametrize("v", [_param(v) for v in VARIANTS])
def test_a_generated_near_miss_is_exact_or_close(v: Variant, record_property) -> None:
    got, want, fired = _run(v)
    record_property("fired", dict(fired))
    what = f"{v.id}: fired {dict(fired) or 'nothing'}"
    assert v.must_fire <= set(fired), f"{what}; the canonical spelling must fire {set(v.must_fire)}"
    if v.none_may_fire:
        # float64 is not fused; a float32 island inside (an upcast spelling computes in float32) may be, as a chain
        assert not set(fired) - {"pointwise"}, f"{what}; float64 is not fused"
    assert len(got) == len(want), f"{what}; {len(got)} outputs, eager {len(want)}"  # outputs, inputs, grads
    n = sum(fired.values())
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(w, torch.Tensor):
            assert g == w, f"{what}; output {i}: {g!r} != {w!r}"
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, \
            f"{what}; output {i}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}"
        if not n:
            assert _bitwise_equal(g, w), f"{what}; output {i} differs from eager, max diff {_max_diff(g, w):.3g}"
            continue
        tol = 2 * OP_TOL * n
        if w.is_floating_point() and torch.finfo(w.dtype).eps > torch.finfo(torch.float32).eps:
            # bfloat16/float16: eager rounds after every op, the kernel once (Note [Reduced precision runs the
            # float32 rows]): REDUCED_TOL_EPS units of the dtype's eps per fused op
            tol += REDUCED_TOL_EPS * torch.finfo(w.dtype).eps * max(n, 1)
        ok = torch.isclose(g.double(), w.double(), rtol=tol, atol=tol, equal_nan=True)
        if not bool(ok.all()):
            at = tuple(int(j) for j in (~ok).nonzero()[0])
            raise AssertionError(f"{what}; output {i} is {_max_diff(g, w):.3g} away from eager (tolerance {tol:g}; at "
                                 f"{list(at)}: {g[at].item()} where eager has {w[at].item()}): a fused kernel fired on "
                                 "code it does not compute")
