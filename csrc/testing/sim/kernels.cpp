// The gxsim kernels registered one by one: allocation, views and metadata (no device work, so never
// recorded), copies between gxsim and the CPU, host reads; everything else is the boxed fallback
// (launch.cpp). As PyTorch's OpenReg registers them.
#include "allocator.h"
#include "launch.h"
#include "runtime.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/TensorOptions.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace graphex::sim {
namespace {

const c10::DispatchKeySet kSimKeys(c10::DispatchKey::PrivateUse1);

void check_options(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "gxsim: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "gxsim: pinned memory is only for CPU tensors");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device_opt,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_options(layout, pin_memory);
  if (device_opt) check_device_index(device_opt->index());
  return at::detail::empty_generic(size, allocator(), kSimKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device_opt,
                         std::optional<bool> pin_memory) {
  check_options(layout, pin_memory);
  if (device_opt) check_device_index(device_opt->index());
  return at::detail::empty_strided_generic(size, stride, allocator(), kSimKeys, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset) offset = storage_offset->expect_int();
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) { return at::native::set_(self, source); }

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, c10::SymInt storage_offset,
                               c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, source, storage_offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocator(), /*resizable=*/true);
  return at::native::set_storage_cpu_(self, storage, 0, {0}, {});
}


// Copies: gxsim to gxsim is device work (recorded during capture, through the fallback as
// aten::copy_); a copy between the CPU and gxsim synchronizes, as it does on CUDA.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const bool src_sim = self.device().type() == kDeviceType;
  const bool dst_sim = dst.device().type() == kDeviceType;
  if (src_sim && dst_sim) {
    static const auto copy_op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
    torch::jit::Stack stack{dst, self, non_blocking};
    sim_fallback(copy_op, &stack);
    return dst;
  }
  if (auto capture = current_capture()) {
    capture_violation(*capture, src_sim ? "aten::_copy_from: copying a gxsim tensor to the CPU (device to host)"
                                        : "aten::_copy_from: copying a CPU tensor to gxsim (host to device)");
  }
  TORCH_CHECK(src_sim || self.is_cpu(), "gxsim: cannot copy from ", self.device(), " to ", dst.device());
  TORCH_CHECK(dst_sim || dst.is_cpu(), "gxsim: cannot copy from ", self.device(), " to ", dst.device());
  at::Tensor dst_cpu = dst_sim ? cpu_alias(dst) : dst;
  dst_cpu.copy_(src_sim ? cpu_alias(self) : self, non_blocking);
  counters().kernel_launches++;
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  if (auto capture = current_capture()) {
    capture_violation(*capture, "aten::_local_scalar_dense (Tensor.item() or another read of a gxsim value on "
                                "the host, which synchronizes)");
  }
  counters().kernel_launches++;
  return at::native::_local_scalar_dense_cpu(cpu_alias(self));
}

void record_stream(at::Tensor& /*self*/, c10::Stream /*stream*/) {}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize_);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("view", view);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("record_stream", record_stream);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sim_fallback>());
}

// Note [CPU kernels win over composites on gxsim]
// A CompositeExplicitAutograd(NonFunctional) kernel takes precedence over a backend fallback, so an
// operator with both a CPU kernel and such a composite (native_layer_norm's math version, the
// structured ops' functional wrappers) would run the composite on gxsim and can round differently
// from the CPU. Every such operator registered when the library loads gets the fallback as its
// PrivateUse1 kernel, so gxsim runs the CPU kernel. Operators that change a tensor's metadata in
// place (inplace_view: t_, squeeze_, as_strided_, ...) keep the composite: it changes the gxsim
// tensor itself.
namespace {
const bool routed = [] {
  static std::vector<std::unique_ptr<torch::Library>> libraries;
  std::map<std::string, torch::Library*> by_namespace;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) || op->hasTag(at::Tag::inplace_view)) {
      continue;
    }
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    const auto sep = name.name.find("::");
    if (sep == std::string::npos) continue;
    const std::string ns = name.name.substr(0, sep);
    auto& lib = by_namespace[ns];
    if (lib == nullptr) {
      libraries.push_back(std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1,
                                                           __FILE__, __LINE__));
      lib = libraries.back().get();
    }
    std::string op_name = name.name.substr(sep + 2);
    if (!name.overload_name.empty()) op_name += "." + name.overload_name;
    lib->impl(op_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&sim_fallback>());
  }
  return true;
}();
}  // namespace

}  // namespace graphex::sim
