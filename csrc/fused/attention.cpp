// One-token attention over a KV cache: softmax(q k^T * scale, masked) v in one op, per query row
// (eager: expand, view, transpose, bmm, div, bitwise_not, masked_fill, softmax, bmm, views).
//   q [B, H, T, D]; k, v [B, Hkv, S, D] with H a multiple of Hkv (grouped-query attention: query head
//   h reads key/value head h / (H / Hkv), what repeat_kv does); mask, broadcastable to [B, H, T, S]: bool,
//   true where a position may be attended, or additive, of q's dtype, added to the scaled scores (a -inf
//   position is masked: what SDPA's float attn_mask and `scores + mask` mean); scale multiplies the scores.
// Meant for decode steps (T = 1, one pass over the cache per head); any T works.
// A row whose mask is all false (all -inf) gives NaN, as eager's softmax over all -inf does, or zeros with
// `zero_masked_rows` (what F.scaled_dot_product_attention's CPU kernel returns for such a row); a NaN or
// +inf score makes the row NaN either way (Note [A row's edge cases are eager's]). Not eager's: masked
// positions (false in a bool mask, -inf in an additive one) are skipped, so a NaN or inf in v at a masked position
// does not reach the output (eager's matmul gives 0 * NaN = NaN there); an attended position of probability 0 is
// read, as eager reads it. Eager's SDPA kernel itself gives NaN or 0 for a row with a NaN score depending on the
// cache length, the mask and the CPU's vector width (its row maximum drops NaNs in places); this kernel gives NaN.
// one_token_attention, the general form (decode_attention is it with q_scale 1 and no cap): the score is
// (q * q_scale) . k * scale, as SDPA's math path scales q and k^T apart (q_scale = scale = sqrt of SDPA's scale: an
// unscaled q . k may overflow where eager's scaled one does not), then capped when softcap != 0,
// softcap * tanh(score / softcap), before the mask (Gemma2's attn_logit_softcapping, as transformers writes it).
// round_scores (a written-out attention in bfloat16/float16, whose scores eager computes in that dtype): each step of
// the score (q . k, the scale, the cap's three ops, the mask's add) and each probability are rounded to the dtype as
// eager rounds them, so a row of scores near the dtype's range (an additive mask of finfo.min everywhere, a huge cap)
// is eager's, not float32's (found by a helper).
// Tolerance: Note [Fused kernels are close, not bitwise] (library.cpp): the dot products, the
// softmax sum and the weighted sum add in another order than eager's bmm and softmax.
#include "fused/rows.h"
#include "fused/vec.h"

#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/add.h>
#include <ATen/ops/all.h>
#include <ATen/ops/any.h>
#include <ATen/ops/bitwise_not.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/where.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include <cstring>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace graphex::fused {
namespace {

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "graphex_fused attention: q, k and v must be 4-d [B, H, T, D], got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3) && k.size(1) > 0 &&
                  q.size(1) % k.size(1) == 0,
              "graphex_fused attention: shapes do not fit: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(),
              " (want k = v = [B, Hkv, S, D] with H a multiple of Hkv)");
}

void check_mask(const at::Tensor& q, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == q.scalar_type(),
              "graphex_fused attention: mask must be bool or of q's dtype (", q.scalar_type(), "), got ",
              mask.scalar_type());
  TORCH_CHECK(mask.dim() <= 4, "graphex_fused attention: mask must have at most 4 dims, got ", mask.sizes());
}

void check_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  check_qkv(q, k, v);
  check_mask(q, mask);
}

at::Tensor attention_eager(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           double q_scale, double scale, double softcap, bool zero_masked_rows) {
  // (round_scores needs nothing here: these are eager's ops in q's dtype, rounded as eager rounds them)
  const at::Tensor q = q_scale == 1.0 ? q_in : at::mul(q_in, q_scale);
  const int64_t group = q.size(1) / k.size(1);
  at::Tensor kk = group == 1 ? k : k.repeat_interleave(group, 1);
  at::Tensor vv = group == 1 ? v : v.repeat_interleave(group, 1);
  at::Tensor scores = at::mul(at::matmul(q, kk.transpose(2, 3)), scale);
  if (softcap != 0) scores = at::mul(at::tanh(at::div(scores, softcap)), softcap);
  const bool additive = mask.scalar_type() != at::kBool;
  scores = additive ? at::add(scores, mask) : at::masked_fill(scores, at::bitwise_not(mask), -INFINITY);
  at::Tensor out = at::matmul(at::softmax(scores, -1), vv);
  if (!zero_masked_rows) return out;
  const at::Tensor none_attended = additive ? at::all(at::eq(mask, -INFINITY), -1, /*keepdim=*/true)
                                            : at::bitwise_not(at::any(mask, -1, /*keepdim=*/true));  // [.., T, 1]
  return at::masked_fill(out, none_attended, 0);
}

// The largest exponent of a row, as float32's biased exponent (255: the row holds a NaN or an infinity): read from
// the bits, without converting the row. Bounds a masked position's score (Note [A row's edge cases are eager's]).
template <typename E>
int max_exponent(const E* x, int64_t n) {
  int m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<E, float>) {
      uint32_t u;
      std::memcpy(&u, x + i, sizeof(u));
      m = std::max(m, static_cast<int>((u >> 23) & 0xFF));
    } else if constexpr (std::is_same_v<E, c10::BFloat16>) {
      m = std::max(m, static_cast<int>((x[i].x >> 7) & 0xFF));
    } else {  // c10::Half: 5 exponent bits, bias 15
      const int e = (x[i].x >> 10) & 0x1F;
      m = std::max(m, e == 0x1F ? 255 : e == 0 ? 0 : e - 15 + 127);
    }
  }
  return m;
}

// q, k, v (and an additive mask) of one dtype E: float32 rows, or bfloat16/float16 rows read as float32
// (Note [Reduced precision runs the float32 rows], rows.h).
template <typename E>
at::Tensor attention_rows(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                          const at::Tensor& mask_in, double q_scale, double scale, double softcap,
                          bool zero_masked_rows, bool round_scores) {
  // each score step rounded to E where eager computes it in E (round_scores), else kept in float32
  const bool rounding = round_scores && !std::is_same_v<E, float>;
  auto r = [rounding](float x) { return rounding ? static_cast<float>(static_cast<E>(x)) : x; };
  const bool additive = mask_in.scalar_type() != at::kBool;
  const int64_t B = q_in.size(0), H = q_in.size(1), T = q_in.size(2), D = q_in.size(3);
  const int64_t Hkv = k_in.size(1), S = k_in.size(2), group = H / Hkv;
  at::Tensor out = at::empty({B, H, T, D}, q_in.options());
  if (out.numel() == 0) return out;
  auto unit_last = [](const at::Tensor& t) { return t.stride(-1) == 1 || t.size(-1) <= 1 ? t : t.contiguous(); };
  const at::Tensor q = unit_last(q_in), k = unit_last(k_in), v = unit_last(v_in);
  const at::Tensor mask = mask_in.expand({B, H, T, S});
  const E* qp = q.const_data_ptr<E>();
  const E* kp = k.const_data_ptr<E>();
  const E* vp = v.const_data_ptr<E>();
  const bool* mb = additive ? nullptr : mask.const_data_ptr<bool>();
  const E* mf = additive ? mask.const_data_ptr<E>() : nullptr;
  E* op = out.mutable_data_ptr<E>();
  const float fscale = static_cast<float>(scale), fcap = static_cast<float>(softcap),
              fqscale = static_cast<float>(q_scale);
  const RowKernels& K = row_kernels();
  const int64_t rows = B * H * T;
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), qs2 = q.stride(2);
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  const int64_t ms0 = mask.stride(0), ms1 = mask.stride(1), ms2 = mask.stride(2), ms3 = mask.stride(3);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, S * D)), [&](int64_t begin, int64_t end) {
    std::vector<float> p(static_cast<size_t>(S)), q_scaled(fqscale != 1.f ? static_cast<size_t>(D) : 0);
    std::vector<uint8_t> masked(static_cast<size_t>(S));  // Note [A row's edge cases are eager's]: masked, not read
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row % T, h = (row / T) % H, b = row / (T * H), hk = h / group;
      FloatRows<E>& f = float_rows<E>(D);
      const float* qr = f.in(0, qp + b * qs0 + h * qs1 + t * qs2, D);
      if (fqscale != 1.f) {  // q * q_scale, each element rounded to float32 as eager's scaled q
        for (int64_t i = 0; i < D; ++i) q_scaled[i] = qr[i] * fqscale;
        qr = q_scaled.data();
      }
      const E* kb = kp + b * ks0 + hk * ks1;
      const E* vb = vp + b * vs0 + hk * vs1;
      const int64_t mrow = b * ms0 + h * ms1 + t * ms2;
      // Note [A row's edge cases are eager's]: whether a row is masked everywhere is read from the mask, never
      // from the softmax's sum, which is also NaN when a score is NaN or +inf (exp(inf - inf)): such a row is
      // NaN, as eager's softmax makes it, whatever zero_masked_rows says. A row with no position at all (S = 0)
      // is 0, as eager's matmul with an empty value gives. A row whose attended scores are all -inf is what a row
      // masked everywhere is (eager's SDPA adds its mask as -inf: 0 there, NaN for a written-out softmax).
      // Where eager adds the mask to the scores (an additive mask, and every SDPA form, whose bool mask becomes
      // -inf added: zero_masked_rows), a masked position's score is computed too: NaN or +inf plus -inf is NaN,
      // which makes the row NaN in eager, masked everywhere or not (found by a helper). A written-out
      // masked_fill replaces the masked scores, so there they are not read.
      const bool masked_scores_count = additive || zero_masked_rows;
      // A masked position's score needs computing only if it may be NaN or +inf: a NaN or an infinity in q or in
      // that key, or a product that may overflow (float32's range, or the dtype's where the score is rounded to
      // it). |score| < D * 2^(eq + ek + 2) * |scale| with eq, ek the unbiased largest exponents; below the limit
      // the score is finite and the position is skipped without converting its key (bfloat16/float16; measured, one
      // thread, 4 heads x 256 positions, 101 attended: 60.2 -> 42.0 us; a float32 key is cheaper to dot than to scan).
      const int q_exp = masked_scores_count && !std::is_same_v<E, float> ? max_exponent(qr, D) : 0;
      const int limit = rounding && std::is_same_v<E, c10::Half> ? 15 : 127;
      const double log_room = std::log2(static_cast<double>(std::max<int64_t>(D, 1))) + 2.0 +
                              (fscale != 0.f ? std::log2(std::fabs(static_cast<double>(fscale))) : -1000.0);
      float mx = kNegInf;
      int64_t attended = 0;
      bool nan_score = false;
      for (int64_t s = 0; s < S; ++s) {
        // bool: attended where true; additive: masked where -inf, else added to the scaled score (a NaN or +inf
        // there makes the score NaN or +inf, and the row NaN below, as in eager)
        const float add = additive ? static_cast<float>(mf[mrow + s * ms3]) : 0.f;
        const bool attend = additive ? add != kNegInf : mb[mrow + s * ms3];
        masked[s] = !attend;
        if (!attend && !masked_scores_count) {
          p[s] = kNegInf;
          continue;
        }
        if constexpr (!std::is_same_v<E, float>) {  // float32: the vectorized dot costs no more than the scan
          if (!attend) {
            const int k_exp = max_exponent(kb + s * ks2, D);
            if (q_exp < 255 && k_exp < 255 && (q_exp - 127) + (k_exp - 127) + log_room < limit - 1) {
              p[s] = kNegInf;  // a finite score plus -inf
              continue;
            }
          }
        }
        const float dot = r(r(K.dot(qr, f.in(1, kb + s * ks2, D), D)) * fscale);
        const float score = fcap != 0.f ? r(r(std::tanh(r(dot / fcap))) * fcap) : dot;
        if (!attend) {  // score + (-inf): NaN for a NaN or +inf score, else -inf
          nan_score |= std::isnan(score) || score == std::numeric_limits<float>::infinity();
          p[s] = kNegInf;
          continue;
        }
        ++attended;
        p[s] = r(score + add);
        nan_score |= std::isnan(p[s]);
        mx = std::max(mx, p[s]);
      }
      E* const out_row = op + row * D;
      float* orow = f.out(2, out_row, D);
      std::fill(orow, orow + D, 0.f);
      [&] {  // the row into orow; then rounded into out_row (a no-op for float32)
        constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
        if (nan_score) {
          std::fill(orow, orow + D, kNaN);
          return;
        }
        if (attended == 0) {  // every position masked: NaN, as eager's softmax over all -inf (or zeros, as SDPA)
          if (!zero_masked_rows && S > 0) std::fill(orow, orow + D, kNaN);
          return;
        }
        float sum = 0.f;
        for (int64_t s = 0; s < S; ++s) {
          p[s] = p[s] == kNegInf ? 0.f : std::exp(p[s] - mx);
          sum += p[s];
        }
        if (std::isnan(sum)) {  // a +inf score (exp(inf - inf)): NaN, as eager's softmax and SDPA give
          std::fill(orow, orow + D, kNaN);
          return;
        }
        if (!(sum > 0.f)) {  // every attended score -inf: as a row masked everywhere (SDPA cannot tell them apart)
          if (!zero_masked_rows) std::fill(orow, orow + D, kNaN);
          return;
        }
        const float inv_sum = 1.f / sum;
        for (int64_t s = 0; s < S; ++s) {
          // A masked position is not read. An attended one whose probability is 0 (its score too far below the row's
          // largest: an underflow, or a finfo.min mask added) is, as eager's matmul reads it: 0 * inf or 0 * NaN in
          // its value is NaN in the output (the first version skipped it too; found by a helper).
          if (masked[s]) continue;
          K.axpy(r(p[s] * inv_sum), f.in(1, vb + s * vs2, D), orow, D);
        }
      }();
      f.store(orow, out_row, D);
    }
  });
  return out;
}

at::Tensor one_token_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& mask, double q_scale, double scale, double softcap,
                                   bool zero_masked_rows, bool round_scores) {
  check_attention(q, k, v, mask);
  const bool additive = mask.scalar_type() != at::kBool;
  if (!all_cpu_one_float_dtype(q, k, v) || (additive && !all_cpu_one_float_dtype(q, mask)))
    return attention_eager(q, k, v, mask, q_scale, scale, softcap, zero_masked_rows);
  return dispatch_float(q.scalar_type(), [&](auto t) {
    return attention_rows<decltype(t)>(q, k, v, mask, q_scale, scale, softcap, zero_masked_rows, round_scores);
  });
}

at::Tensor decode_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                double scale, bool zero_masked_rows) {
  return one_token_attention_cpu(q, k, v, mask, /*q_scale=*/1.0, scale, /*softcap=*/0.0, zero_masked_rows,
                                 /*round_scores=*/false);
}

// Note [Prefill attention is ATen's tiled kernel, with the heads as they are]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// prefill_attention(q, k, v, mask?, scale, is_causal, zero_masked_rows): attention over many query rows (a prefill,
// a chunked prefill; also SDPA's is_causal at any length). One row at a time (the decode kernel above) reads every
// key once per query row at a dot product's speed; a prefill wants tiles of queries against tiles of keys through
// matrix products, with an online softmax that never holds the [T, S] score matrix. ATen's CPU flash-attention kernel
// (at::_scaled_dot_product_flash_attention_for_cpu, the one eager's SDPA runs) is that kernel, and it reads grouped
// key/value heads as they are (query head h reads key/value head h / (H / Hkv), what repeat_kv and repeat_interleave
// compute). So this op is that kernel, called without the repeated copy of the cache (where this torch's kernel reads
// grouped heads, checked once per process: flash_reads_grouped_heads; elsewhere the heads are repeated first):
//   - zero_masked_rows (SDPA's forms, every dtype): the same kernel on the same values as eager's SDPA after its
//     repeat (a bool mask made 0 / -inf in q's dtype, as SDPA makes it): eager's result, bit for bit, edges and all
//     (tested: tests/python/test_fusion_prefill.py). The output is laid out as q is, as the kernel lays it out.
//   - !zero_masked_rows (attention written out, float32: softmax(q k^T * scale + mask) v): close, not bitwise (the
//     tiled sums add in another order). Where the kernel's edges are not softmax's the call computes eager's ops
//     instead (attention_eager): a row masked everywhere (softmax gives NaN, the kernel 0), a NaN or an infinity in
//     q, k, v or the mask (a NaN q row gives the kernel 0; found while writing this), scores that may overflow
//     (max |q| * max |k| * D * |scale| past 2^100), and values whose unnormalized sum may (S * max |v| past 2^100:
//     the kernel divides by the row's sum last). The output is contiguous, as eager's matmul gives it.
// The checks read q, k, v and the mask once (O(T D + S D + T S)), against the O(T S D) of the attention itself.
// max |x| over a float32 tensor of 4 dims with a unit last stride (a copy first otherwise), NaN where x holds one: one
// vectorized pass per row, no ATen call (a prefill of 64 tokens paid about 60 us for the same checks in ATen ops).
float max_abs4(const at::Tensor& t_in) {
  const at::Tensor t = t_in.stride(3) == 1 || t_in.size(3) <= 1 ? t_in : t_in.contiguous();
  const RowKernels& K = row_kernels();
  const float* p = t.const_data_ptr<float>();
  float m = 0.f;
  for (int64_t a = 0; a < t.size(0); ++a)
    for (int64_t b = 0; b < t.size(1); ++b)
      for (int64_t c = 0; c < t.size(2); ++c) {
        const float r = K.max_abs(p + a * t.stride(0) + b * t.stride(1) + c * t.stride(2), t.size(3));
        if (std::isnan(r)) return r;
        m = std::max(m, r);
      }
  return m;
}

// Whether every row of a 4-d mask (over its own, unexpanded elements) attends somewhere, and for an additive one (of
// float32, the only dtype written-out prefill fuses) the largest |value| that is not -inf (NaN where one is NaN).
bool mask_rows_attend(const at::Tensor& m, float* largest) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const bool is_bool = m.scalar_type() == at::kBool;
  const bool* mb = is_bool ? m.const_data_ptr<bool>() : nullptr;
  const float* mf = is_bool ? nullptr : m.const_data_ptr<float>();
  *largest = 0.f;
  for (int64_t a = 0; a < m.size(0); ++a)
    for (int64_t b = 0; b < m.size(1); ++b)
      for (int64_t c = 0; c < m.size(2); ++c) {
        const int64_t row = a * m.stride(0) + b * m.stride(1) + c * m.stride(2);
        bool any = false;
        for (int64_t s = 0; s < m.size(3); ++s) {
          const int64_t i = row + s * m.stride(3);
          if (is_bool) {
            any |= mb[i];
          } else if (mf[i] != kNegInf) {
            any = true;
            const float v = std::fabs(mf[i]);
            *largest = std::isnan(v) || std::isnan(*largest) ? NAN : std::max(*largest, v);
          }
        }
        if (!any) return false;
      }
  return true;
}

bool written_edges_are_softmaxs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& mask, double scale) {
  constexpr double kRoom = 1.2676506002282294e30;  // 2^100: far below float32's 2^128
  if (q.scalar_type() != at::kFloat || k.scalar_type() != at::kFloat || v.scalar_type() != at::kFloat) return false;
  const double qa = max_abs4(q), ka = max_abs4(k);
  // NaN compares false: a NaN or an infinity anywhere takes eager's ops
  if (!(qa * ka * static_cast<double>(q.size(3)) * std::fabs(scale) < kRoom)) return false;
  // the kernel sums p * v over a row before dividing by the row's sum (p <= 1), where softmax divides first: S * max |v|
  // must not overflow either (v of 1e37 over 64 positions gave inf where eager's is 1e37; found by a helper)
  if (!(max_abs4(v) * static_cast<double>(k.size(2)) < kRoom)) return false;
  if (!mask.has_value()) return true;
  float largest = 0.f;
  if (!mask_rows_attend(*mask, &largest)) return false;  // a row masked everywhere
  return largest < kRoom;  // no NaN, no +inf, nothing that overflows a score
}

// Whether this torch's CPU flash kernel reads grouped key/value heads (query head h reads key/value head h / (H / Hkv)),
// checked once per process on a small case against the heads repeated, bit for bit. The 2.13 kernel does; an older one
// indexes the key by the query's own head (a read past the key's heads), so a torch of the supported range whose kernel
// fails the check gets the heads repeated first, as eager's graph repeats them: the same result, with the copy.
bool flash_reads_grouped_heads() {
  static const bool reads = [] {
    try {
      const auto opts = at::TensorOptions().dtype(at::kFloat);
      const at::Tensor q = at::linspace(-1.0, 1.0, 4 * 3 * 8, opts).view({1, 4, 3, 8});
      const at::Tensor k = at::linspace(1.0, -0.5, 2 * 5 * 8, opts).view({1, 2, 5, 8}).sin();
      const at::Tensor v = at::linspace(-2.0, 2.0, 2 * 5 * 8, opts).view({1, 2, 5, 8}).cos();
      const at::Tensor grouped = std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(q, k, v));
      const at::Tensor repeated = std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(
          q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)));
      return at::equal(grouped, repeated);
    } catch (const c10::Error&) {
      return false;
    }
  }();
  return reads;
}

at::Tensor prefill_attention_cpu(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                 const std::optional<at::Tensor>& mask_in, double scale, bool is_causal,
                                 bool zero_masked_rows) {
  check_qkv(q_in, k_in, v_in);
  // The flash kernel reads each row of q, k and v (and of the mask, unless broadcast along it) as contiguous: a
  // cache kept [B, Hkv, D, S] and transposed, or a q made [B, H, D, T], is copied first (eager's repeat made such a
  // key contiguous before its SDPA; passing it as it was gave garbage, found by a helper).
  auto unit_last = [](const at::Tensor& t) { return t.stride(-1) == 1 || t.size(-1) <= 1 ? t : t.contiguous(); };
  const at::Tensor q = unit_last(q_in), k = unit_last(k_in), v = unit_last(v_in);
  if (mask_in.has_value()) check_mask(q, *mask_in);
  TORCH_CHECK(!(is_causal && mask_in.has_value()),
              "graphex_fused::prefill_attention: is_causal and a mask cannot both be given (as in SDPA)");
  std::optional<at::Tensor> mask;
  if (mask_in.has_value()) {
    at::Tensor m = *mask_in;
    while (m.dim() < 4) m = m.unsqueeze(0);  // the kernel takes 2-d or 4-d masks; the same broadcast
    mask = m.stride(3) == 0 ? m : unit_last(m);
  }
  if (!zero_masked_rows) {
    TORCH_CHECK(!is_causal, "graphex_fused::prefill_attention: is_causal is SDPA's (zero_masked_rows=True)");
    if (!written_edges_are_softmaxs(q, k, v, mask, scale)) {
      const at::Tensor m = mask.has_value() ? *mask : at::ones({1, 1, 1, k.size(2)}, q.options().dtype(at::kBool));
      return attention_eager(q, k, v, m, /*q_scale=*/1.0, scale, /*softcap=*/0.0, /*zero_masked_rows=*/false)
          .contiguous();
    }
  }
  if (mask.has_value() && mask->scalar_type() == at::kBool)  // SDPA's conversion: 0 where attended, else -inf
    mask = at::where(*mask, at::scalar_tensor(0.0, q.options()), at::scalar_tensor(-INFINITY, q.options()));
  const int64_t group = q.size(1) / k.size(1);
  const bool repeat = group > 1 && !flash_reads_grouped_heads();
  at::Tensor out = std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(
      q, repeat ? k.repeat_interleave(group, 1) : k, repeat ? v.repeat_interleave(group, 1) : v, /*dropout_p=*/0.0,
      is_causal, mask, scale));
  // The layout the meta kernel promised (Note [A replacement keeps the layout], graphex/fusion/manager.py): q's own
  // (empty_like keeps a dense q's strides) for SDPA's forms, contiguous for the written-out ones. Compared without
  // allocating; copied only where the kernel laid the output out otherwise.
  if (zero_masked_rows && !q_in.is_non_overlapping_and_dense()) return at::empty_like(q_in).copy_(out);
  const c10::DimVector contiguous = c10::contiguous_strides(q.sizes());
  const at::IntArrayRef want = zero_masked_rows ? q_in.strides() : at::IntArrayRef(contiguous);
  if (out.strides() != want) return at::empty_strided(q.sizes(), want, q.options()).copy_(out);
  return out;
}

at::Tensor prefill_attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::optional<at::Tensor>& mask, double /*scale*/, bool /*is_causal*/,
                                  bool zero_masked_rows) {
  check_qkv(q, k, v);
  if (mask.has_value()) check_mask(q, *mask);
  return zero_masked_rows ? at::empty_like(q) : at::empty(q.sizes(), q.options());
}

at::Tensor one_token_attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& mask, double /*q_scale*/, double /*scale*/, double /*softcap*/,
                                    bool /*zero_masked_rows*/, bool /*round_scores*/) {
  check_attention(q, k, v, mask);
  return at::empty(q.sizes(), q.options());
}

at::Tensor decode_attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                 double scale, bool /*zero_masked_rows*/) {
  check_attention(q, k, v, mask);
  return at::empty(q.sizes(), q.options());
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) {
  m.impl("decode_attention", &graphex::fused::decode_attention_cpu);
  m.impl("one_token_attention", &graphex::fused::one_token_attention_cpu);
  m.impl("prefill_attention", &graphex::fused::prefill_attention_cpu);
}

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) {
  m.impl("decode_attention", &graphex::fused::decode_attention_meta);
  m.impl("one_token_attention", &graphex::fused::one_token_attention_meta);
  m.impl("prefill_attention", &graphex::fused::prefill_attention_meta);
}
