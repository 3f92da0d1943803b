// graphex example operator library: custom operators registered from C++.
//
//   graphex_examples::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor         out-of-place
//   graphex_examples::rotary_embedding(Tensor q, Tensor k, Tensor cos, Tensor sin)
//                                                    -> (Tensor, Tensor)            several in/outputs
//   graphex_examples::kv_cache_update_(Tensor(a!) k_cache, Tensor(b!) v_cache,
//                                      Tensor pos, Tensor k, Tensor v) -> ()        in-place, two mutated args
//   graphex_examples::scale_rows(Tensor x, Tensor scale) -> Tensor                   Meta from Python
//   graphex_examples::scale_rows_(Tensor(a!) x, Tensor scale) -> ()                  Meta from Python
//   graphex_examples::needs_meta(Tensor x) -> Tensor                                 no Meta at all, on
//                                  purpose: the tests and the docs use it to show graphex's error
//
// The first three have their Meta (fake) kernels here in C++; scale_rows and
// scale_rows_ get theirs from Python (examples/ops/meta.py), the "op-plugin" style.
// The CPU kernels use the same ATen calls as the pure-PyTorch decoder
// (examples/models/decoder.py), so both decoders give bit-identical results.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/rsqrt.h>
#include <torch/library.h>

#include <tuple>

namespace {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor variance = x.pow(2).mean(-1, /*keepdim=*/true);
  return at::mul(at::mul(x, at::rsqrt(at::add(variance, eps))), weight);
}

at::Tensor rotate_half(const at::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return at::cat({at::neg(halves[1]), halves[0]}, -1);
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                    const at::Tensor& sin) {
  auto apply = [&](const at::Tensor& x) { return at::add(at::mul(x, cos), at::mul(rotate_half(x), sin)); };
  return {apply(q), apply(k)};
}

// Writes k and v into the caches ([batch, heads, positions, head_dim]) at `pos` along dim 2.
void kv_cache_update_(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& pos, const at::Tensor& k,
                      const at::Tensor& v) {
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4, "kv_cache_update_: caches must be 4-D, got ",
              k_cache.sizes(), " and ", v_cache.sizes());
  const_cast<at::Tensor&>(k_cache).index_copy_(2, pos, k);
  const_cast<at::Tensor&>(v_cache).index_copy_(2, pos, v);
}

at::Tensor scale_rows(const at::Tensor& x, const at::Tensor& scale) { return at::mul(x, scale.unsqueeze(-1)); }

void scale_rows_(const at::Tensor& x, const at::Tensor& scale) { const_cast<at::Tensor&>(x).mul_(scale.unsqueeze(-1)); }

at::Tensor needs_meta(const at::Tensor& x) { return at::mul(x, x); }

// Meta kernels: shapes, dtypes and devices only; never touch data.
at::Tensor rms_norm_meta(const at::Tensor& x, const at::Tensor& weight, double eps) { return at::empty_like(x); }

std::tuple<at::Tensor, at::Tensor> rotary_embedding_meta(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& cos, const at::Tensor& sin) {
  return {at::empty_like(q), at::empty_like(k)};
}

void kv_cache_update_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&) {}

}  // namespace

TORCH_LIBRARY(graphex_examples, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rotary_embedding(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  m.def("kv_cache_update_(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor pos, Tensor k, Tensor v) -> ()");
  m.def("scale_rows(Tensor x, Tensor scale) -> Tensor");
  m.def("scale_rows_(Tensor(a!) x, Tensor scale) -> ()");
  m.def("needs_meta(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(graphex_examples, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rotary_embedding", &rotary_embedding);
  m.impl("kv_cache_update_", &kv_cache_update_);
  m.impl("scale_rows", &scale_rows);
  m.impl("scale_rows_", &scale_rows_);
  m.impl("needs_meta", &needs_meta);
}

TORCH_LIBRARY_IMPL(graphex_examples, Meta, m) {
  m.impl("rms_norm", &rms_norm_meta);
  m.impl("rotary_embedding", &rotary_embedding_meta);
  m.impl("kv_cache_update_", &kv_cache_update_meta);
}
