// graphex_fused::pointwise: a chain of element-wise ops in one pass over memory (Note [A chain of element-wise
// ops is one program], pointwise.h). ATen's TensorIterator walks the broadcast inputs and the outputs (it
// merges dimensions and splits the work over threads as eager's own element-wise kernels do); each run of its
// inner loop is cut into tiles of kPointwiseTile elements, the inputs are read into float32 slots, and the
// program runs on the tile while it is in cache (eager: one pass over memory per op).
//   inputs: float32, bfloat16, float16 or bool tensors (broadcast to one shape); code: {opcode, dst, a, b, c}
//   per instruction; constants: the program's numbers; outputs: {slot, dtype} per output (dtype: an index of
//   GRAPHEX_POINTWISE_DTYPES).
// The program may come from a file (an exported program, graphex-run): every index in it is checked before
// anything runs, so a bad one is an error naming it, never a read or write out of bounds.
#include "fused/pointwise.h"

#include "fused/vec.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <utility>
#include <cstring>
#include <vector>

namespace graphex::fused {
namespace {

constexpr int64_t kMaxSlots = 256;
constexpr int64_t kLanes = 16;  // constants are stored 16 times over: every vector width's lanes
constexpr int64_t kPad = 32;    // tiles are padded to 32 elements: two vectors of every width

struct Checked {
  std::vector<PwInstr> code;
  std::vector<float> consts;  // each constant kLanes times
  int64_t slots = 0;
};

bool reads_float(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

constexpr at::ScalarType kOutputDtypes[] = {
#define GRAPHEX_PW_TYPE(name, type) type,
    GRAPHEX_POINTWISE_DTYPES(GRAPHEX_PW_TYPE)
#undef GRAPHEX_PW_TYPE
};
constexpr int64_t kNumOutputDtypes = sizeof(kOutputDtypes) / sizeof(kOutputDtypes[0]);

int32_t arity(PwOp op) {
  switch (op) {
#define GRAPHEX_PW_ARITY(name, n) \
  case PwOp::name: return n;
    GRAPHEX_POINTWISE_OPS(GRAPHEX_PW_ARITY)
#undef GRAPHEX_PW_ARITY
    case PwOp::kCount: break;
  }
  return 0;
}

// Whether this process's oneDNN takes a dtype (ATen's mkldnn_bf16_device_check / mkldnn_fp16_device_check, through
// the ops Python calls them by): asked once.
bool onednn_supports(const char* op) {
  auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
  return handle.has_value() && handle->typed<bool()>().call();
}

// Note [The erf GELU as eager's kernels give it] (pointwise_kernels.h): each erf GELU runs the kernel eager would
// pick now: oneDNN's while it is switched on and takes the dtype, else ATen's.
void choose_gelu_kernels(std::vector<PwInstr>& code) {
  static const bool bf16 = onednn_supports("mkldnn::_is_mkldnn_bf16_supported");
  static const bool f16 = onednn_supports("mkldnn::_is_mkldnn_fp16_supported");
  const bool on = at::globalContext().userEnabledMkldnn() && at::hasMKLDNN();
  for (PwInstr& ins : code) {
    const auto op = static_cast<PwOp>(ins.op);
    bool onednn;
    if (op == PwOp::gelu_erf) onednn = on;
    else if (op == PwOp::gelu_erf_bf16) onednn = on && bf16;
    else if (op == PwOp::gelu_erf_f16) onednn = on && f16;
    else continue;
    if (!onednn) ins.op = static_cast<int32_t>(PwOp::gelu_erf_aten);  // else kept: its dtype names oneDNN's call
  }
}

// Note [An erf GELU's special inputs are eager's own] (pointwise.h): eager's gelu on the one value x, through the
// kernel eager picks for the opcode's input: oneDNN's on a contiguous tensor of two elements in the input's dtype
// (x, then 0), ATen's on a tensor of one element (use_mkldnn takes no tensor of one). Remembered per thread by the
// value's bits and the opcode, so a tile full of one special value makes one eager call.
float gelu_special(float x, int32_t opcode) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(opcode)) << 32) | bits;
  thread_local std::vector<std::pair<uint64_t, float>> seen;
  for (const auto& [k, v] : seen)
    if (k == key) return v;
  const auto op = static_cast<PwOp>(opcode);
  const at::ScalarType dtype = op == PwOp::gelu_erf_bf16 ? at::kBFloat16 : op == PwOp::gelu_erf_f16 ? at::kHalf
                                                                                                   : at::kFloat;
  const bool onednn = op != PwOp::gelu_erf_aten;
  at::Tensor t = at::zeros({onednn ? 2 : 1}, at::TensorOptions().dtype(dtype));
  t.select(0, 0).fill_(static_cast<double>(x));  // x is the input's value in its dtype (the chain rounds as eager)
  const float y = at::gelu(t).select(0, 0).item<float>();
  if (seen.size() >= 64) seen.erase(seen.begin());
  seen.emplace_back(key, y);
  return y;
}

Checked check_program(at::TensorList inputs, at::IntArrayRef code, at::ArrayRef<double> constants,
                      at::IntArrayRef outputs) {
  const int64_t k = static_cast<int64_t>(inputs.size());
  TORCH_CHECK(k >= 1 && k < kMaxSlots, "graphex_fused::pointwise: want 1 to ", kMaxSlots - 1, " inputs, got ", k);
  TORCH_CHECK(code.size() % 5 == 0, "graphex_fused::pointwise: the code has ", code.size(),
              " ints, not 5 per instruction (Note [A chain of element-wise ops is one program])");
  TORCH_CHECK(!outputs.empty() && outputs.size() % 2 == 0, "graphex_fused::pointwise: outputs must be {slot, dtype} "
              "pairs, got ", outputs.size(), " ints");
  Checked c;
  c.slots = k;
  const int64_t n_consts = static_cast<int64_t>(constants.size());
  for (size_t i = 0; i < code.size(); i += 5) {
    const int64_t op = code[i], dst = code[i + 1];
    TORCH_CHECK(op >= 0 && op < static_cast<int64_t>(PwOp::kCount), "graphex_fused::pointwise: instruction ", i / 5,
                ": no opcode ", op);
    TORCH_CHECK(dst >= k && dst < kMaxSlots, "graphex_fused::pointwise: instruction ", i / 5, " writes slot ", dst,
                ", want one of ", k, "..", kMaxSlots - 1, " (slots 0..", k - 1, " are the inputs)");
    const int32_t n = arity(static_cast<PwOp>(op));
    int32_t operands[3] = {0, 0, 0};
    for (int32_t j = 0; j < n; ++j) {
      const int64_t r = code[i + 2 + j];
      TORCH_CHECK((r >= 0 && r < kMaxSlots) || (r < 0 && -1 - r < n_consts), "graphex_fused::pointwise: instruction ",
                  i / 5, " operand ", j, " is ", r, ": neither a slot nor one of the ", n_consts, " constants");
      operands[j] = static_cast<int32_t>(r);
      c.slots = std::max(c.slots, r + 1);
    }
    c.slots = std::max(c.slots, dst + 1);
    c.code.push_back({static_cast<int32_t>(op), static_cast<int32_t>(dst), operands[0], operands[1], operands[2]});
  }
  for (size_t i = 0; i < outputs.size(); i += 2) {
    TORCH_CHECK(outputs[i] >= 0 && outputs[i] < c.slots, "graphex_fused::pointwise: output ", i / 2, " reads slot ",
                outputs[i], ", which the program does not have");
    TORCH_CHECK(outputs[i + 1] >= 0 && outputs[i + 1] < kNumOutputDtypes, "graphex_fused::pointwise: output ", i / 2,
                " has dtype number ", outputs[i + 1], ", want 0..", kNumOutputDtypes - 1,
                " (GRAPHEX_POINTWISE_DTYPES: float32, bfloat16, float16)");
  }
  c.consts.reserve(constants.size() * kLanes);
  for (double v : constants) c.consts.insert(c.consts.end(), kLanes, static_cast<float>(v));
  return c;
}

at::DimVector broadcast_shape(at::TensorList inputs) {
  at::DimVector shape(inputs[0].sizes().begin(), inputs[0].sizes().end());
  for (size_t i = 1; i < inputs.size(); ++i) shape = at::infer_size_dimvector(shape, inputs[i].sizes());
  return shape;
}

std::vector<at::Tensor> allocate_outputs(at::TensorList inputs, at::IntArrayRef outputs, const at::DimVector& shape) {
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < outputs.size(); i += 2)
    outs.push_back(at::empty(shape, inputs[0].options().dtype(kOutputDtypes[outputs[i + 1]])));
  return outs;
}

// n elements of `p` (stride in bytes) as float32 into dst.
void load(float* dst, const char* p, int64_t stride, int64_t n, at::ScalarType t) {
  if (stride == 0 && n > 1) {  // a broadcast value (a batch norm's per-channel factor): one read, then a fill
    load(dst, p, /*stride: never used for one element*/ 1, 1, t);
    std::fill(dst + 1, dst + n, dst[0]);
    return;
  }
  switch (t) {
    case at::kFloat:
      if (stride == sizeof(float)) std::memcpy(dst, p, n * sizeof(float));
      else for (int64_t i = 0; i < n; ++i) dst[i] = *reinterpret_cast<const float*>(p + i * stride);
      break;
    case at::kBFloat16:
      if (stride == sizeof(c10::BFloat16)) {  // a loop the compiler vectorizes (a shift per element)
        const auto* q = reinterpret_cast<const uint16_t*>(p);
        for (int64_t i = 0; i < n; ++i) {
          const uint32_t bits = static_cast<uint32_t>(q[i]) << 16;
          std::memcpy(dst + i, &bits, sizeof(float));
        }
      } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(*reinterpret_cast<const c10::BFloat16*>(p + i * stride));
      }
      break;
    case at::kHalf:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(*reinterpret_cast<const c10::Half*>(p + i * stride));
      break;
    default:  // bool (check_inputs admits nothing else)
      for (int64_t i = 0; i < n; ++i) dst[i] = *reinterpret_cast<const bool*>(p + i * stride) ? 1.f : 0.f;
      break;
  }
}

void store(char* p, int64_t stride, const float* src, int64_t n, at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      if (stride == sizeof(float)) std::memcpy(p, src, n * sizeof(float));
      else for (int64_t i = 0; i < n; ++i) *reinterpret_cast<float*>(p + i * stride) = src[i];
      break;
    case at::kBFloat16:
      if (stride == sizeof(c10::BFloat16)) {
        auto* q = reinterpret_cast<c10::BFloat16*>(p);
        for (int64_t i = 0; i < n; ++i) q[i] = c10::BFloat16(src[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<c10::BFloat16*>(p + i * stride) = c10::BFloat16(src[i]);
      }
      break;
    default:  // float16
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<c10::Half*>(p + i * stride) = c10::Half(src[i]);
      break;
  }
}

std::vector<at::Tensor> pointwise_cpu(at::TensorList inputs, at::IntArrayRef code, at::ArrayRef<double> constants,
                                      at::IntArrayRef outputs) {
  Checked prog = check_program(inputs, code, constants, outputs);
  choose_gelu_kernels(prog.code);
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].device().is_cpu() && (reads_float(inputs[i].scalar_type()) || inputs[i].scalar_type() == at::kBool),
                "graphex_fused::pointwise: input ", i, " is ", inputs[i].scalar_type(), " on ", inputs[i].device(),
                "; the CPU kernel reads float32, bfloat16, float16 and bool tensors");
  }
  const at::DimVector shape = broadcast_shape(inputs);
  std::vector<at::Tensor> outs = allocate_outputs(inputs, outputs, shape);
  if (outs[0].numel() == 0) return outs;

  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false).resize_outputs(false);
  for (const at::Tensor& o : outs) config.add_output(o);
  for (const at::Tensor& t : inputs) config.add_const_input(t);
  at::TensorIterator iter = config.build();

  const int64_t n_in = static_cast<int64_t>(inputs.size()), n_out = static_cast<int64_t>(outs.size());
  const int64_t n_ops = n_in + n_out;
  std::vector<at::ScalarType> in_types, out_types;
  for (const at::Tensor& t : inputs) in_types.push_back(t.scalar_type());
  for (const at::Tensor& o : outs) out_types.push_back(o.scalar_type());
  const RowKernels& K = row_kernels();

  iter.for_each([&](char** data, const int64_t* strides, int64_t size0, int64_t size1) {
    // This thread's slots: kPointwiseTile floats each, zeroed once (the padding lanes of a tile hold numbers).
    static thread_local std::vector<float> scratch;
    static thread_local std::vector<float*> slot;
    const size_t need = static_cast<size_t>(prog.slots * kPointwiseTile);
    if (scratch.size() < need) scratch.assign(need, 0.f);
    slot.resize(static_cast<size_t>(prog.slots));
    std::vector<char*> ptr(data, data + n_ops);
    for (int64_t row = 0; row < size1; ++row) {
      for (int64_t start = 0; start < size0; start += kPointwiseTile) {
        const int64_t len = std::min(kPointwiseTile, size0 - start);
        const int64_t padded = (len + kPad - 1) / kPad * kPad;
        for (int64_t s = 0; s < prog.slots; ++s) slot[s] = scratch.data() + s * kPointwiseTile;
        for (int64_t j = 0; j < n_in; ++j) {
          const char* p = ptr[n_out + j] + start * strides[n_out + j];
          if (in_types[j] == at::kFloat && strides[n_out + j] == sizeof(float) && len == padded) {
            slot[j] = reinterpret_cast<float*>(const_cast<char*>(p));  // read in place; no instruction writes slot j
          } else {
            load(slot[j], p, strides[n_out + j], len, in_types[j]);
          }
        }
        K.pointwise_tile(prog.code.data(), static_cast<int64_t>(prog.code.size()), slot.data(), prog.consts.data(),
                         padded, &gelu_special);
        for (int64_t o = 0; o < n_out; ++o)
          store(ptr[o] + start * strides[o], strides[o], slot[outputs[2 * o]], len, out_types[o]);
      }
      for (int64_t j = 0; j < n_ops; ++j) ptr[j] += strides[n_ops + j];
    }
  });
  return outs;
}

std::vector<at::Tensor> pointwise_meta(at::TensorList inputs, at::IntArrayRef code, at::ArrayRef<double> constants,
                                       at::IntArrayRef outputs) {
  check_program(inputs, code, constants, outputs);
  return allocate_outputs(inputs, outputs, broadcast_shape(inputs));
}

}  // namespace
}  // namespace graphex::fused

TORCH_LIBRARY_IMPL(graphex_fused, CPU, m) { m.impl("pointwise", &graphex::fused::pointwise_cpu); }

TORCH_LIBRARY_IMPL(graphex_fused, Meta, m) { m.impl("pointwise", &graphex::fused::pointwise_meta); }
