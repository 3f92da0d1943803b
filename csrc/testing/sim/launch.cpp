// The boxed fallback: run an operator's CPU kernel on gxsim memory, or record it into the capture
// (Note [gxsim runs kernels on the host], Note [Captured work does not run during capture]).
#include "launch.h"

#include "allocator.h"
#include "runtime.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/resize_native.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <exception>
#include <utility>

namespace graphex::sim {
namespace {

const c10::DispatchKeySet kCPUKeys(c10::DispatchKey::CPU);
const c10::DispatchKeySet kMetaKeys(c10::DispatchKey::Meta);
const c10::DispatchKeySet kSimKeys(c10::DispatchKey::PrivateUse1);

bool is_sim(const at::Tensor& t) { return t.defined() && t.device().type() == kDeviceType; }

at::Tensor make_tensor(c10::Storage storage, c10::DispatchKeySet keys, caffe2::TypeMeta dtype,
                       c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

// One call's view of gxsim storages on another device: each distinct gxsim storage gets one twin
// storage (a non-owning CPU storage over the same bytes, or a meta storage of the same size), so
// arguments that share memory still share it there and outputs can be traced back.
struct Twins {
  explicit Twins(c10::DeviceType t) : target(t) {}
  c10::DeviceType target;
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> storages;  // gxsim storage -> twin
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> back;      // twin impl -> gxsim storage
  std::vector<std::pair<c10::TensorImpl*, at::Tensor>> args;         // twin tensor -> gxsim argument

  c10::Storage twin_storage(const c10::Storage& sim) {
    for (auto& [impl, twin] : storages) {
      if (impl == sim.unsafeGetStorageImpl()) return twin;
    }
    c10::Storage twin;
    if (target == c10::kCPU) {
      twin = c10::Storage(c10::Storage::use_byte_size_t(), sim.nbytes(),
                          c10::DataPtr(const_cast<void*>(sim.data()), c10::Device(c10::kCPU)),
                          /*allocator=*/nullptr, /*resizable=*/false);
    } else {
      twin = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), c10::SymInt(static_cast<int64_t>(sim.nbytes())),
          c10::DataPtr(nullptr, c10::Device(c10::kMeta)), c10::GetAllocator(c10::kMeta), /*resizable=*/true));
    }
    storages.emplace_back(sim.unsafeGetStorageImpl(), twin);
    back.emplace_back(twin.unsafeGetStorageImpl(), sim);
    return twin;
  }

  at::Tensor twin(const at::Tensor& sim) {
    auto keys = c10::DispatchKeySet(target == c10::kCPU ? c10::DispatchKey::CPU : c10::DispatchKey::Meta);
    auto t = make_tensor(twin_storage(sim.storage()), keys, sim.dtype(), sim.sizes(), sim.strides(),
                         sim.storage_offset());
    args.emplace_back(t.unsafeGetTensorImpl(), sim);
    return t;
  }

  const at::Tensor* arg_of(const at::Tensor& t) const {
    for (auto& [impl, sim] : args) {
      if (impl == t.unsafeGetTensorImpl()) return &sim;
    }
    return nullptr;
  }
  const c10::Storage* sim_storage_of(const at::Tensor& t) const {
    if (!t.has_storage()) return nullptr;
    for (auto& [impl, sim] : back) {
      if (impl == t.storage().unsafeGetStorageImpl()) return &sim;
    }
    return nullptr;
  }
};

// Rebuilds an argument with every tensor (and device) moved by `tensor_fn` / to `device_type`.
template <typename F>
c10::IValue convert(const c10::IValue& v, c10::DeviceType device_type, F& tensor_fn) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    return t.defined() ? c10::IValue(tensor_fn(t)) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(t.defined() ? tensor_fn(t) : t);
    return out;
  }
  if (v.isList()) {
    auto in = v.toList();
    c10::impl::GenericList out(in.elementType());
    for (const c10::IValue& e : in) out.push_back(convert(e, device_type, tensor_fn));
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == kDeviceType) return c10::IValue(c10::Device(device_type));
  return v;
}

at::Tensor meta_like_cpu(const at::Tensor& t, Twins& twins) {
  if (is_sim(t)) return twins.twin(t);
  if (t.dim() == 0) return t;  // CPU scalars mix with any device (and wrapped numbers stay numbers)
  at::Tensor m = at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type());
  m.unsafeGetTensorImpl()->set_wrapped_number(t.unsafeGetTensorImpl()->is_wrapped_number());
  return m;
}

// Flattens the returned values (Tensor, Tensor[], Tensor?[]) into tensors; false for anything else.
bool flatten_returns(const c10::IValue* begin, const c10::IValue* end, std::vector<at::Tensor>& out) {
  for (auto* v = begin; v != end; ++v) {
    if (v->isTensor()) {
      out.push_back(v->toTensor());
    } else if (v->isTensorList()) {
      for (const at::Tensor& t : v->toTensorList()) out.push_back(t);
    } else if (v->isNone()) {
      out.emplace_back();
    } else if (v->isList() && v->toList().elementType()->kind() == c10::TypeKind::OptionalType) {
      for (const c10::IValue& e : v->toList()) out.push_back(e.isTensor() ? e.toTensor() : at::Tensor());
    } else {
      return false;
    }
  }
  return true;
}

// Rebuilds the returned values from their flattened tensors.
void unflatten_returns(c10::IValue* begin, c10::IValue* end, const std::vector<at::Tensor>& tensors) {
  size_t i = 0;
  for (auto* v = begin; v != end; ++v) {
    if (v->isTensor()) {
      *v = tensors[i++];
    } else if (v->isTensorList()) {
      c10::List<at::Tensor> list;
      for (size_t n = v->toTensorList().size(); n > 0; --n) list.push_back(tensors[i++]);
      *v = list;
    } else if (v->isNone()) {
      ++i;
    } else {
      auto in = v->toList();
      c10::impl::GenericList list(in.elementType());
      for (size_t n = in.size(); n > 0; --n) {
        const auto& t = tensors[i++];
        list.push_back(t.defined() ? c10::IValue(t) : c10::IValue());
      }
      *v = list;
    }
  }
}

at::Tensor new_sim_tensor(const at::Tensor& like) {
  if (like.is_non_overlapping_and_dense()) {
    return at::detail::empty_strided_generic(like.sizes(), like.strides(), allocator(), kSimKeys, like.scalar_type());
  }
  return at::detail::empty_generic(like.sizes(), allocator(), kSimKeys, like.scalar_type(), std::nullopt);
}

// An output computed on `twins`' device back on gxsim: the argument itself, a view of an argument's
// storage, or (null) a fresh tensor the caller materializes.
at::Tensor as_sim_alias(const at::Tensor& out, const Twins& twins) {
  if (const at::Tensor* arg = twins.arg_of(out)) return *arg;
  if (const c10::Storage* storage = twins.sim_storage_of(out)) {
    return make_tensor(*storage, kSimKeys, out.dtype(), out.sizes(), out.strides(), out.storage_offset());
  }
  return at::Tensor();
}

bool has_out_arguments(const c10::FunctionSchema& schema) {
  for (const auto& arg : schema.arguments()) {
    if (arg.kwarg_only() && arg.alias_info() && arg.alias_info()->isWrite()) return true;
  }
  return false;
}

// Runs the Meta kernel on twins of the arguments and resizes the gxsim out= arguments it resized.
// Leaves the meta returns in `stack`, flattened into `outs`; false when a return is a host value.
// Throws what the Meta kernel throws.
bool run_meta(const c10::OperatorHandle& op, const torch::jit::Stack& args, Twins& twins,
              torch::jit::Stack& stack, std::vector<at::Tensor>& outs) {
  auto to_meta = [&](const at::Tensor& t) { return meta_like_cpu(t, twins); };
  stack.clear();
  stack.reserve(args.size());
  for (const auto& a : args) stack.push_back(convert(a, c10::kMeta, to_meta));
  op.redispatchBoxed(kMetaKeys, &stack);
  if (!flatten_returns(stack.data(), stack.data() + stack.size(), outs)) return false;
  for (const auto& out : outs) {
    if (!out.defined()) continue;
    if (const at::Tensor* arg = twins.arg_of(out); arg && !arg->sizes().equals(out.sizes())) {
      at::native::resize_(*arg, out.sizes(), std::nullopt);
    }
  }
  return true;
}

void execute_eager(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  torch::jit::Stack args(stack->end() - n_args, stack->end());
  stack->erase(stack->end() - n_args, stack->end());
  if (has_out_arguments(schema)) {
    // A CPU kernel cannot resize gxsim memory seen through a CPU alias: size out= tensors first.
    try {
      Twins meta(c10::kMeta);
      torch::jit::Stack meta_stack;
      std::vector<at::Tensor> meta_outs;
      run_meta(op, args, meta, meta_stack, meta_outs);
    } catch (const std::exception&) {
      // No usable Meta kernel: the CPU kernel says what is wrong, if anything.
    }
  }
  Twins cpu(c10::kCPU);
  auto to_cpu = [&](const at::Tensor& t) { return is_sim(t) ? cpu.twin(t) : t; };
  for (const auto& a : args) stack->push_back(convert(a, c10::kCPU, to_cpu));
  op.redispatchBoxed(kCPUKeys, stack);
  counters().kernel_launches++;

  const size_t n_returns = schema.returns().size();
  auto* begin = stack->data() + stack->size() - n_returns;
  std::vector<at::Tensor> outs;
  if (!flatten_returns(begin, begin + n_returns, outs)) return;  // host values (item, equal, ...)
  for (auto& out : outs) {
    if (!out.defined()) continue;
    at::Tensor sim = as_sim_alias(out, cpu);
    if (!sim.defined()) {
      sim = new_sim_tensor(out);
      cpu_alias(sim).copy_(out);
    }
    out = sim;
  }
  unflatten_returns(begin, begin + n_returns, outs);
}

void record(const c10::OperatorHandle& op, torch::jit::Stack* stack, CaptureState& capture) {
  check_capture_valid(capture);
  const auto& schema = op.schema();
  const std::string name = schema.operator_name().overload_name.empty()
                               ? schema.name()
                               : schema.name() + "." + schema.overload_name();
  const size_t n_args = schema.arguments().size();
  torch::jit::Stack args(stack->end() - n_args, stack->end());
  stack->erase(stack->end() - n_args, stack->end());

  Twins meta(c10::kMeta);
  torch::jit::Stack meta_stack;
  std::vector<at::Tensor> meta_outs;
  bool host_value = false;
  try {
    host_value = !run_meta(op, args, meta, meta_stack, meta_outs);
  } catch (const std::exception& e) {
    capture_violation(capture, name + " cannot be captured: its output shapes cannot be computed without "
                                      "running it (its Meta kernel failed: " + std::string(e.what()) + ")");
  }
  if (host_value) {
    // A query its Meta kernel answers from metadata alone (_fused_sdp_choice) runs now, on the CPU
    // kernel; one that reads data to answer (item, equal) has no Meta kernel and failed above.
    bool returns_tensor = false;
    for (const auto& r : schema.returns()) returns_tensor |= r.type()->kind() != c10::TypeKind::IntType &&
                                                            r.type()->kind() != c10::TypeKind::BoolType &&
                                                            r.type()->kind() != c10::TypeKind::FloatType;
    if (schema.is_mutable() || returns_tensor) capture_violation(capture, name + " returns a value to the host");
    for (auto& a : args) stack->push_back(std::move(a));
    execute_eager(op, stack);
    counters().kernel_launches--;  // a host-side query, not device work
    return;
  }

  // The launch: CPU aliases of the (possibly resized) gxsim arguments; CPU tensors copied now.
  Launch launch{op, {}, {}};
  Twins cpu(c10::kCPU);
  auto to_cpu = [&](const at::Tensor& t) {
    if (is_sim(t)) return cpu.twin(t);
    auto snapshot = t.clone();
    snapshot.unsafeGetTensorImpl()->set_wrapped_number(t.unsafeGetTensorImpl()->is_wrapped_number());
    return snapshot;
  };
  for (const auto& a : args) launch.args.push_back(convert(a, c10::kCPU, to_cpu));

  std::vector<at::Tensor> outs;
  for (const auto& m : meta_outs) {
    if (!m.defined()) {
      outs.emplace_back();
      launch.targets.emplace_back();
      continue;
    }
    at::Tensor sim = as_sim_alias(m, meta);
    if (sim.defined()) {
      launch.targets.emplace_back();
    } else {
      sim = at::detail::empty_strided_generic(m.sizes(), m.strides(), allocator(), kSimKeys, m.scalar_type());
      launch.targets.emplace_back(cpu_alias(sim));
    }
    outs.push_back(sim);
  }
  launch.stream = current_stream().id();
  capture.launches.push_back(std::move(launch));
  if (current_stream().id() != capture.origin) capture.unjoined.insert(current_stream().id());
  counters().captured_launches++;

  // The returns: the meta results' structure, holding the gxsim tensors.
  unflatten_returns(meta_stack.data(), meta_stack.data() + meta_stack.size(), outs);
  for (auto& v : meta_stack) stack->push_back(std::move(v));
}

}  // namespace

at::Tensor cpu_alias(const at::Tensor& sim) {
  Twins twins(c10::kCPU);
  return twins.twin(sim);
}

void run_launch(const Launch& launch) {
  torch::jit::Stack stack(launch.args.begin(), launch.args.end());
  launch.op.redispatchBoxed(kCPUKeys, &stack);
  const size_t n_returns = launch.op.schema().returns().size();
  std::vector<at::Tensor> outs;
  flatten_returns(stack.data() + stack.size() - n_returns, stack.data() + stack.size(), outs);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (launch.targets[i]) const_cast<at::Tensor&>(*launch.targets[i]).copy_(outs[i]);
  }
}

void sim_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (auto capture = current_capture()) {
    record(op, stack, *capture);
  } else {
    execute_eager(op, stack);
  }
}

}  // namespace graphex::sim
