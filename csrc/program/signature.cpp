#include "program/signature.h"

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <algorithm>

#include <sstream>

namespace graphex {

namespace {

void printDims(std::ostream& os, const std::vector<std::optional<int64_t>>& dims) {
  os << '[';
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) os << ", ";
    if (dims[i]) os << *dims[i];
    else os << '?';
  }
  os << ']';
}

std::string dtypeName(c10::ScalarType t) {
  std::string s = c10::toString(t);  // "Float", "BFloat16", ...
  if (s == "Float") return "float32";
  if (s == "Double") return "float64";
  if (s == "Half") return "float16";
  if (s == "BFloat16") return "bfloat16";
  if (s == "Long") return "int64";
  if (s == "Int") return "int32";
  if (s == "Short") return "int16";
  if (s == "Char") return "int8";
  if (s == "Byte") return "uint8";
  if (s == "Bool") return "bool";
  return s;
}

}  // namespace

std::string TensorSignature::toString(bool with_strides) const {
  std::ostringstream os;
  os << dtypeName(dtype);
  printDims(os, sizes);
  if (with_strides) {
    os << " strides ";
    printDims(os, strides);
  }
  os << " on " << device;
  return os.str();
}

std::string describeTensor(const at::Tensor& t, bool with_strides) {
  std::ostringstream os;
  os << dtypeName(t.scalar_type()) << t.sizes();
  if (with_strides) os << " strides " << t.strides();
  os << " on " << t.device();
  return os.str();
}

std::pair<int64_t, int64_t> repeatedTensor(const std::vector<c10::IValue>& inputs) {
  // a sort of (TensorImpl*, index) pairs: a few hundred inputs at most, no allocation below 64
  c10::SmallVector<std::pair<const void*, int64_t>, 64> seen;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].isTensor()) seen.emplace_back(inputs[i].toTensor().unsafeGetTensorImpl(), static_cast<int64_t>(i));
  std::sort(seen.begin(), seen.end());
  for (size_t i = 1; i < seen.size(); ++i)
    if (seen[i].first == seen[i - 1].first)
      return {std::min(seen[i].second, seen[i - 1].second), std::max(seen[i].second, seen[i - 1].second)};
  return {-1, -1};
}

std::string describeMismatch(const InputSpec& spec, const c10::IValue& value) {
  switch (spec.kind) {
    case InputKind::Tensor: {
      if (!value.isTensor()) return "expected a tensor, got " + value.tagKind();
      const at::Tensor& t = value.toTensor();
      const TensorSignature& sig = *spec.signature;
      bool ok = t.defined() && t.scalar_type() == sig.dtype && t.device() == sig.device &&
                t.dim() == static_cast<int64_t>(sig.sizes.size());
      if (ok) {
        auto sizes = t.sizes();
        auto strides = t.strides();
        for (size_t d = 0; ok && d < sig.sizes.size(); ++d) {
          if (sig.sizes[d] && *sig.sizes[d] != sizes[d]) ok = false;
          if (sig.strides[d] && *sig.strides[d] != strides[d]) ok = false;
        }
      }
      if (ok) return {};
      if (!t.defined()) return "expected " + sig.toString() + ", got an undefined tensor";
      return "expected " + sig.toString() + ", got " + describeTensor(t);
    }
    case InputKind::Int:
      return value.isInt() ? std::string() : "expected an int, got " + value.tagKind();
    case InputKind::Float:
      return (value.isDouble() || value.isInt()) ? std::string()
                                                  : "expected a float, got " + value.tagKind();
    case InputKind::Bool:
      return value.isBool() ? std::string() : "expected a bool, got " + value.tagKind();
    case InputKind::Other:
      return {};
  }
  return {};
}

}  // namespace graphex
