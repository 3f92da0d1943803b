// What a program expects of each input, and the check run on every call.
//
// Note [A program never runs on inputs it was not built for]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Dynamo's guards already route a call to the graph compiled for its shapes,
// dtypes, devices and strides. The executor checks again, because a Program can
// also be reached without Dynamo (cache_compile, a C++ application), and because
// a mismatch there would silently compute garbage. The check is a few integer
// compares per input; on failure it names the input and prints both sides.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace graphex {

enum class InputKind : uint8_t { Tensor, Int, Float, Bool, Other };

struct TensorSignature {
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  // nullopt: a symbolic (dynamic) dimension, any value accepted.
  std::vector<std::optional<int64_t>> sizes;
  std::vector<std::optional<int64_t>> strides;

  std::string toString(bool with_strides = true) const;
};

struct InputSpec {
  std::string name;  // placeholder name in the graph, e.g. "arg3_1"
  InputKind kind = InputKind::Other;
  std::optional<TensorSignature> signature;  // tensors only
};

// Empty string when `value` fits `spec`, else a one-line description of the mismatch.
std::string describeMismatch(const InputSpec& spec, const c10::IValue& value);

// Note [A program's tensor inputs are separate tensors]
// Dynamo passes a tensor read through two sources once (a DUPLICATE_INPUT guard), so every program's tensor inputs
// were separate tensors when it was traced, and it may write one while reading another. The same tensor given twice
// (`f(x, x)` to an entry traced as `f(a, b)`, or to a torch.compile graph whose guards a guard_filter_fn dropped)
// would read the write: 32 for eager's 16 (a helper's find). So the signature check refuses it, as it refuses
// another shape. Views of one tensor are other tensors and are not compared: they are the tracer's to guard.
// The indices of the first two inputs that are one tensor, or {-1, -1}.
std::pair<int64_t, int64_t> repeatedTensor(const std::vector<c10::IValue>& inputs);

// "float32[2, 4] strides [4, 1] on cpu" for a concrete tensor.
std::string describeTensor(const at::Tensor& t, bool with_strides = true);

}  // namespace graphex
