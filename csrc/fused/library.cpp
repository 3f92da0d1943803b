// The graphex_fused operators: the fused kernels of graphex's fused mode (option pattern_fusion_pass,
// graphex/fusion/). Only their schemas live here; each kernel family has its own file with its CPU
// and Meta kernels (TORCH_LIBRARY_IMPL), so an op traces (fake/Meta) and lowers like any other.
//
//   rms_norm(Tensor x, Tensor weight, float eps) -> Tensor                     rms_norm.cpp
//   add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps)
//                                      -> (Tensor sum, Tensor normed)         rms_norm.cpp
//   add_layer_norm(Tensor x, Tensor residual, Tensor? weight, Tensor? bias, float eps)
//                                      -> (Tensor sum, Tensor normed)         layer_norm.cpp
//   silu_mul(Tensor gate, Tensor up) -> Tensor                                gated_mlp.cpp
//   gated_mlp(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down,
//             str activation="silu") -> Tensor                               gated_mlp.cpp
//   gated_mlp_packed(Tensor x, Tensor w_gate_up, Tensor w_down,
//             str activation="silu") -> Tensor                               gated_mlp.cpp
//   rotary(Tensor x, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor   rotary.cpp
//   partial_rotary(Tensor x, Tensor cos, Tensor sin) -> Tensor                    rotary.cpp
//   decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale,
//                    bool zero_masked_rows=False) -> Tensor                  attention.cpp
//   one_token_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float q_scale, float scale,
//                    float softcap, bool zero_masked_rows, bool round_scores) -> Tensor   attention.cpp
//   prefill_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool is_causal,
//                    bool zero_masked_rows) -> Tensor                     attention.cpp
//   matvec(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor            matvec.cpp
//   pointwise(Tensor[] inputs, int[] code, float[] constants, int[] outputs)
//                                      -> Tensor[]                            pointwise.cpp
//   pointwise_table() -> str           its opcodes and output dtypes          pointwise.h
//   intra_op_threads(int n) -> int     threads at::parallel_for ran n items on, here (a check)
//   max_pool2d(Tensor x, int[] kernel, int[] stride, int[] padding, int[] dilation,
//              bool ceil_mode) -> Tensor                                      max_pool.cpp
//   batch_norm_scale_shift(Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var,
//                          float eps, int dims, int which) -> Tensor          batch_norm.cpp
//
// Their float32 inner loops are the row kernels of vec_kernels.h, built once per CPU capability
// (Note [One row kernel per CPU capability], vec.h); rows.h walks the rows of broadcast operands.
//
// Note [Fused kernels are close, not bitwise]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Exact mode replays eager's own kernels and is bit for bit equal to eager. These kernels are
// ours: a reduction (the sum of squares of RMSNorm, softmax's sum, a dot product) adds in another
// order than ATen's, and exp comes from another implementation, so results differ in the last
// bits. The promise, for float32, tested against eager in tests/python/test_fused_kernels.py:
//     |fused - eager| <= 1e-5 + 1e-5 * |eager|      (elementwise; torch.testing's atol/rtol)
// for sums of terms no larger than their result, as a trained layer's are: a sum of K terms each of order
// sqrt(K) times its result (unscaled randn weights) differs by more (48x the bound at K = 32768), and the fused
// sum was then the closer to float64's (docs/fused-mode.md, How close to eager).
// Element-wise work that eager does op by op (x * cos + rotate_half(x) * sin, x * r * w) is done
// in eager's order with FMA contraction off (-ffp-contract=off), so it adds no error of its own.
// bfloat16 and float16 run the float32 rows and round once (Note [Reduced precision runs the
// float32 rows], rows.h), where eager rounds after every op; the promise there, tested against
// eager in the same file (and against float64: at most eager's own error plus one rounding step):
//     |fused - eager| <= 4 eps + 4 eps * |eager|    (eps: 2^-7 bfloat16, 2^-10 float16)
// The fast paths need one dtype for all tensor inputs and a last dimension of stride 1 (other
// inputs are made contiguous first); every other case runs the same math with ATen ops (correct,
// not faster). The pattern pass only uses these ops where the fast path applies (its extra checks
// decline the rest).
//
// Note [The fused ops are linked, not loaded]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// These files form an OBJECT library (CMakeLists.txt: graphex_fused) whose objects go into
// graphex._C and graphex-run themselves. In a static library their registrations would be
// dropped by the linker, since nothing refers to them by symbol; tests/python/test_fused_kernels.py
// checks that torch.ops.graphex_fused.* exist after `import graphex`, and test_fusion.py that
// graphex-run runs an exported fused program.
#include "fused/pointwise.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace {
// "add:2,sub:2,...;float32,bfloat16,float16": GRAPHEX_POINTWISE_OPS and GRAPHEX_POINTWISE_DTYPES, which
// graphex/fusion/chains.py numbers by this order.
std::string pointwise_table() {
  std::string ops, dtypes;
#define GRAPHEX_PW_NAME(name, arity) ops += std::string(ops.empty() ? "" : ",") + #name ":" #arity;
  GRAPHEX_POINTWISE_OPS(GRAPHEX_PW_NAME)
#undef GRAPHEX_PW_NAME
#define GRAPHEX_PW_DTYPE(name, type) dtypes += std::string(dtypes.empty() ? "" : ",") + #name;
  GRAPHEX_POINTWISE_DTYPES(GRAPHEX_PW_DTYPE)
#undef GRAPHEX_PW_DTYPE
  return ops + ";" + dtypes;
}

// How many threads at::parallel_for runs n items on (grain 1) when it is compiled as the fused kernels are: ATen's
// thread count (torch.set_num_threads, at most n) where OpenMP is on, 1 where it is not (Note [The fused kernels run
// on ATen's OpenMP threads], CMakeLists.txt; tests/python/test_fused_kernels.py).
int64_t intra_op_threads(int64_t n) {
  std::mutex m;
  std::set<std::thread::id> seen;
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(m);
    seen.insert(std::this_thread::get_id());
  });
  return static_cast<int64_t>(seen.size());
}
}  // namespace

TORCH_LIBRARY(graphex_fused, m) {
  // weight_offset: the norm multiplies by (weight_offset + weight), Gemma's (1 + w); 0 (the default, and every
  // program exported before it) multiplies by the weight itself.
  m.def("rms_norm(Tensor x, Tensor weight, float eps, float weight_offset=0.0) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, float weight_offset=0.0) -> (Tensor, Tensor)");
  m.def("add_layer_norm(Tensor x, Tensor residual, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor)");
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  // activation: "silu" (the default, and every program exported before it), "gelu" (erf) or "gelu_tanh"
  m.def("gated_mlp(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, str activation=\"silu\") -> Tensor");
  // the gate and up projections as one weight [2I, H], the gate's rows first (Phi3's gate_up_proj)
  m.def("gated_mlp_packed(Tensor x, Tensor w_gate_up, Tensor w_down, str activation=\"silu\") -> Tensor");
  // interleaved: rotate the pairs (x[2i], x[2i + 1]) (GPT-J), cos/sin per element or per pair; False (the default, and
  // every program exported before it): the two halves (rotate_half)
  m.def("rotary(Tensor x, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor");
  // the first cos.size(-1) elements of each row rotated (rotate_half), the rest copied: a partial rotary and the cat
  // after it (Note [A partial rotary writes its tail in the same pass], rotary.cpp)
  m.def("partial_rotary(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale, bool zero_masked_rows=False) -> Tensor");
  m.def("one_token_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float q_scale, float scale, float softcap, "
        "bool zero_masked_rows, bool round_scores) -> Tensor");
  // many query rows (a prefill): ATen's tiled CPU kernel with grouped heads as they are (Note [Prefill attention is
  // ATen's tiled kernel, with the heads as they are], attention.cpp)
  m.def("prefill_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool is_causal, "
        "bool zero_masked_rows) -> Tensor");
  m.def("matvec(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  m.def("pointwise(Tensor[] inputs, int[] code, float[] constants, int[] outputs) -> Tensor[]");
  m.def("pointwise_table() -> str", &pointwise_table);
  m.def("intra_op_threads(int n) -> int", &intra_op_threads);
  m.def("max_pool2d(Tensor x, int[] kernel, int[] stride, int[] padding, int[] dilation, bool ceil_mode) -> Tensor");
  m.def("batch_norm_scale_shift(Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, float eps, "
        "int dims, int which) -> Tensor");
}
