#include "runtime/executor.h"

#include "runtime/sym_ops.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_set>

namespace graphex {

namespace {

using Kind = ArgSource::Kind;

inline c10::IValue readSlot(std::vector<c10::IValue>& slots, int32_t slot, bool move) {
  if (move) return std::move(slots[slot]);
  return slots[slot];
}

template <typename T, typename Convert>
c10::IValue buildList(const ArgSource& a, std::vector<c10::IValue>& slots, Convert&& convert) {
  c10::List<T> list;
  list.reserve(a.items.size());
  for (const ListItem& li : a.items) {
    if (li.slot >= 0) list.push_back(convert(readSlot(slots, li.slot, li.move)));
    else list.push_back(convert(li.constant));
  }
  return list;
}

inline c10::IValue argValue(const ArgSource& a, std::vector<c10::IValue>& slots) {
  switch (a.kind) {
    case Kind::Constant: return a.constant;
    case Kind::Slot: return readSlot(slots, a.slot, a.move);
    case Kind::SlotAsDouble: {
      c10::IValue v = readSlot(slots, a.slot, a.move);
      return v.isInt() ? c10::IValue(static_cast<double>(v.toInt())) : v;
    }
    case Kind::TensorList:
      return buildList<at::Tensor>(a, slots, [](const c10::IValue& v) { return v.toTensor(); });
    case Kind::OptionalTensorList:
      return buildList<std::optional<at::Tensor>>(a, slots, [](const c10::IValue& v) {
        return v.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(v.toTensor());
      });
    case Kind::IntList:
      return buildList<int64_t>(a, slots, [](const c10::IValue& v) { return v.toInt(); });
    case Kind::DoubleList:
      return buildList<double>(a, slots, [](const c10::IValue& v) { return v.isInt() ? double(v.toInt()) : v.toDouble(); });
    case Kind::BoolList:
      return buildList<bool>(a, slots, [](const c10::IValue& v) { return v.toBool(); });
  }
  return {};
}

c10::IValue getItem(const c10::IValue& container, int64_t index) {
  if (container.isTuple()) {
    const auto& elems = container.toTupleRef().elements();
    TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(elems.size()), "getitem index ", index,
                " out of range for a tuple of ", elems.size());
    return elems[index];
  }
  TORCH_CHECK(container.isList(), "getitem on a ", container.tagKind(), ", expected a list or tuple");
  auto items = container.toListRef();
  if (index < 0) index += static_cast<int64_t>(items.size());
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(items.size()), "getitem index ", index,
              " out of range for a list of ", items.size());
  return items[index];
}

void validateOutputs(const Program& p, const Instruction& instr, const torch::jit::Stack& stack) {
  for (size_t r = 0; r < instr.expect.size(); ++r) {
    if (!instr.expect[r] || !stack[r].isTensor()) continue;
    const TensorSignature& want = *instr.expect[r];
    const at::Tensor& got = stack[r].toTensor();
    bool ok = got.scalar_type() == want.dtype && got.device().type() == want.device.type() &&
              got.dim() == static_cast<int64_t>(want.sizes.size());
    for (size_t d = 0; ok && d < want.sizes.size(); ++d)
      if (want.sizes[d] && *want.sizes[d] != got.size(d)) ok = false;
    if (ok) continue;
    std::string expected = want.toString(/*with_strides=*/false);
    std::string actual = describeTensor(got, /*with_strides=*/false);
    const NodeInfo& info = p.nodes[instr.debug];
    throw FakeMismatchError("graphex: " + info.target + " (node '" + info.name + "') output " + std::to_string(r) +
                                ": the fake/Meta function promised " + expected + ", the real kernel returned " +
                                actual,
                            instr.debug, r, expected, actual);
  }
}

ExecutionError replayFailure(const Program& p, const Instruction& instr, const std::exception& e,
                             std::exception_ptr cause) {
  const NodeInfo& info = p.nodes[instr.debug];
  std::string message = kernelMessage(e);
  std::string s = "graphex: " + p.name + ": node '" + info.name + "' (" + info.target + ")";
  if (!info.source.empty()) s += "\n  from user code: " + info.source;
  s += "\n  failed: " + message;
  return ExecutionError(s, instr.debug, p.name, info.name, info.target, info.source, std::move(message),
                        classifyKernelError(e), std::move(cause));
}

// Note [Run counters stay out of the hot loop]: the process-wide total is the runs of the live
// executors, summed when asked, plus those of destroyed ones. Registration happens at
// construction and destruction (cold), never per run.
struct RunRegistry {
  std::mutex mutex;
  std::unordered_set<const Executor*> live;
  uint64_t destroyed_runs = 0;
};

RunRegistry& runRegistry() {
  static RunRegistry* registry = new RunRegistry();  // never destroyed: executors may outlive static teardown
  return *registry;
}

// Note [Per-run state is borrowed per thread]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each run needs a slot vector (one IValue per value of the program) and an argument
// stack. Instead of allocating both per run, a run borrows its thread's pair and gives it
// back cleared (every slot reset to None, so no tensor outlives the run; capacity kept).
// One executor shared by several threads is safe (each thread has its own pair), and a
// run nested in another on the same thread (a custom op's Python kernel calling a
// compiled graph) finds the pair busy and allocates its own, as before.
struct RunState {
  std::vector<c10::IValue> slots;
  torch::jit::Stack stack;
  bool busy = false;
};

class BorrowedState {
 public:
  explicit BorrowedState(size_t num_slots) {
    thread_local RunState state;
    if (!state.busy) {
      borrowed_ = &state;
      state.busy = true;
    } else {
      own_ = std::make_unique<RunState>();
      borrowed_ = own_.get();
    }
    if (borrowed_->slots.size() < num_slots) borrowed_->slots.resize(num_slots);
    borrowed_->stack.reserve(16);
    num_slots_ = num_slots;
  }
  ~BorrowedState() {
    for (size_t i = 0; i < num_slots_; ++i) borrowed_->slots[i] = c10::IValue();
    borrowed_->stack.clear();
    borrowed_->busy = false;
  }
  BorrowedState(const BorrowedState&) = delete;
  BorrowedState& operator=(const BorrowedState&) = delete;
  std::vector<c10::IValue>& slots() { return borrowed_->slots; }
  torch::jit::Stack& stack() { return borrowed_->stack; }

 private:
  RunState* borrowed_ = nullptr;
  std::unique_ptr<RunState> own_;
  size_t num_slots_ = 0;
};

// Note [A dumped run hands out clones] (executor.h).
c10::IValue dumpedCopy(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() ? c10::IValue(t.detach().clone()) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(t.defined() ? t.detach().clone() : t);
    return out;
  }
  return v;
}

}  // namespace

KernelErrorKind classifyKernelError(const std::exception& e) {
  using K = KernelErrorKind;
  // Most derived first (DistBackendError is a DistError).
  if (dynamic_cast<const c10::IndexError*>(&e)) return K::Index;
  if (dynamic_cast<const c10::ValueError*>(&e)) return K::Value;
  if (dynamic_cast<const c10::TypeError*>(&e)) return K::Type;
  if (dynamic_cast<const c10::NotImplementedError*>(&e)) return K::NotImplemented;
  if (dynamic_cast<const c10::BufferError*>(&e)) return K::Buffer;
  if (dynamic_cast<const c10::LinAlgError*>(&e)) return K::LinAlg;
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return K::OutOfMemory;
  if (dynamic_cast<const c10::SyntaxError*>(&e)) return K::Syntax;
  if (dynamic_cast<const c10::AcceleratorError*>(&e)) return K::Accelerator;
  if (dynamic_cast<const c10::DistBackendError*>(&e)) return K::DistBackend;
  if (dynamic_cast<const c10::DistQueueEmptyError*>(&e)) return K::DistQueueEmpty;
  if (dynamic_cast<const c10::DistStoreError*>(&e)) return K::DistStore;
  if (dynamic_cast<const c10::DistNetworkError*>(&e)) return K::DistNetwork;
  if (dynamic_cast<const c10::DistError*>(&e)) return K::Dist;
  if (dynamic_cast<const c10::Error*>(&e)) return K::Runtime;
  return K::Foreign;
}

std::string kernelMessage(const std::exception& e) {
  // Like torch's own translation: the message without the C++ backtrace (what() adds
  // "Exception raised from ..." and, with TORCH_SHOW_CPP_STACKTRACES, the frames).
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();  // empty for a Python kernel's error that is not persisted yet: the binding reads the cause
}

uint64_t Executor::totalRunCount() {
  RunRegistry& r = runRegistry();
  std::lock_guard<std::mutex> lock(r.mutex);
  uint64_t total = r.destroyed_runs;
  for (const Executor* e : r.live) total += e->runCount();
  return total;
}

Executor::Executor(Program program) : program_(std::move(program)) {
  RunRegistry& r = runRegistry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live.insert(this);
}

Executor::~Executor() {
  RunRegistry& r = runRegistry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live.erase(this);
  r.destroyed_runs += runCount();
}

void Executor::bindFrozen(std::vector<FrozenInput> frozen) {
  for (FrozenInput& f : frozen) {
    if (f.index >= program_.inputs.size() || !f.tensor.defined())
      throw ProgramError("graphex: " + program_.name + ": frozen input " + std::to_string(f.index) +
                         " is not an input of the program or not a tensor");
    if (f.watch == Watch::Identity) continue;
    const c10::TensorImpl* impl = f.tensor.unsafeGetTensorImpl();
    f.data = impl->has_storage() ? f.tensor.const_data_ptr() : nullptr;
    f.dtype = f.tensor.scalar_type();
    f.sizes = f.tensor.sizes().vec();
    f.strides = f.tensor.strides().vec();
    f.key_set = f.tensor.key_set();
    if (f.watch != Watch::Contents) continue;
    // Note [A frozen parameter is checked by identity]: the bytes the values were folded from (none for an empty
    // tensor, whose data pointer may be null: found by the fuzzer with a 0-size buffer).
    if ((!f.data && f.tensor.numel() != 0) || f.tensor.device().type() != c10::DeviceType::CPU ||
        f.tensor.layout() != c10::kStrided || f.tensor.is_quantized())
      throw ProgramError("graphex: " + program_.name + ": frozen input " + std::to_string(f.index) +
                         " is watched by contents, which needs a dense CPU tensor with storage");
    size_t nbytes = f.tensor.numel() == 0 ? 0 : at::detail::computeStorageNbytes(f.sizes, f.strides, f.tensor.itemsize());
    const auto* begin = static_cast<const unsigned char*>(f.data);
    f.bytes.assign(begin, begin + nbytes);
  }
  frozen_ = std::move(frozen);
}

// Why input `value` no longer is the frozen input `f` the program was built with; nullptr if it still is.
// Note [A frozen parameter is checked by identity].
static const char* frozenChange(const c10::IValue& value, const Executor::FrozenInput& f) {
  if (!value.isTensor() || value.toTensor().unsafeGetTensorImpl() != f.tensor.unsafeGetTensorImpl())
    return "was replaced by another tensor after compiling";
  if (f.watch == Executor::Watch::Identity) return nullptr;
  const at::Tensor& t = f.tensor;
  if (f.data != (t.unsafeGetTensorImpl()->has_storage() ? t.const_data_ptr() : nullptr) ||
      t.scalar_type() != f.dtype || t.sizes() != c10::IntArrayRef(f.sizes) ||
      t.strides() != c10::IntArrayRef(f.strides) || t.key_set() != f.key_set)
    return "was given new memory or another dtype, shape or layout (`.data =`) after compiling, and values folded "
           "from it are stale";
  if (f.watch == Executor::Watch::Contents && !f.bytes.empty() &&
      std::memcmp(f.data, f.bytes.data(), f.bytes.size()) != 0)
    return "was updated in place after compiling (its bytes differ from those values were folded from: a write "
           "through the parameter, `.data`, a view or load_state_dict), and values folded from it are stale";
  return nullptr;
}

void Executor::checkFrozen(const std::vector<c10::IValue>& inputs) const {
  for (const FrozenInput& f : frozen_) {
    const char* why = frozenChange(inputs[f.index], f);
    if (!why) continue;
    throw FrozenInputReplaced("graphex: " + program_.name + ": input " + std::to_string(f.index) + " ('" +
                              program_.inputs[f.index].name + "') is a frozen parameter (frozen_parameter=True) and " +
                              why,
                              f.index);
  }
}

bool Executor::fits(const std::vector<c10::IValue>& inputs) const {
  const Program& p = program_;
  if (inputs.size() != p.inputs.size()) return false;
  for (const FrozenInput& f : frozen_)
    if (frozenChange(inputs[f.index], f)) return false;
  if (!p.check_signature) return true;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!describeMismatch(p.inputs[i], inputs[i]).empty()) return false;
  return repeatedTensor(inputs).first < 0;  // Note [A program's tensor inputs are separate tensors]
}

// "inputs 0 ('a') and 1 ('b') are the same tensor ...", or "" (Note [A program's tensor inputs are separate tensors]).
static std::string sameTensorTwice(const Program& p, const std::vector<c10::IValue>& inputs) {
  auto [first, second] = repeatedTensor(inputs);
  if (first < 0) return "";
  return "inputs " + std::to_string(first) + " ('" + p.inputs[first].name + "') and " + std::to_string(second) +
         " ('" + p.inputs[second].name + "') are the same tensor, where the graph was captured with separate "
         "tensors (it may write one while reading the other)";
}

std::string Executor::mismatch(const std::vector<c10::IValue>& inputs) const {
  const Program& p = program_;
  if (inputs.size() != p.inputs.size())
    return std::to_string(inputs.size()) + " inputs, the program takes " + std::to_string(p.inputs.size());
  if (!p.check_signature) return "";
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string why = describeMismatch(p.inputs[i], inputs[i]);
    if (!why.empty()) return "input " + std::to_string(i) + " ('" + p.inputs[i].name + "'): " + why;
  }
  return sameTensorTwice(p, inputs);
}

std::optional<std::vector<c10::IValue>> Executor::tryRun(std::vector<c10::IValue> inputs) const {
  if (!fits(inputs)) return std::nullopt;
  return runImpl<false, false>(std::move(inputs), nullptr);
}

std::vector<c10::IValue> Executor::runFitting(std::vector<c10::IValue> inputs) const {
  return runImpl<false, false>(std::move(inputs), nullptr);
}

void Executor::checkInputs(const std::vector<c10::IValue>& inputs) const {
  const Program& p = program_;
  if (inputs.size() != p.inputs.size())
    throw SignatureError("graphex: " + p.name + " takes " + std::to_string(p.inputs.size()) + " inputs, got " +
                         std::to_string(inputs.size()));
  checkFrozen(inputs);
  if (!p.check_signature) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string why = describeMismatch(p.inputs[i], inputs[i]);
    if (!why.empty())
      throw SignatureError("graphex: " + p.name + ": input " + std::to_string(i) + " ('" + p.inputs[i].name +
                           "') does not match the signature this graph was captured for: " + why +
                           ". A new input signature needs its own capture: torch.compile compiles one "
                           "automatically, unless Dynamo's guards on this input were dropped (a "
                           "guard_filter_fn such as torch.compiler.skip_all_guards_unsafe: keep the tensor "
                           "guards, keep_tensor_guards_unsafe); a loaded program cannot.");
  }
  std::string twice = sameTensorTwice(p, inputs);
  if (!twice.empty())
    throw SignatureError("graphex: " + p.name + ": " + twice + ". torch.compile compiles such a call on its own "
                         "unless its guards were dropped (a guard_filter_fn); pass a copy (x.clone()) as one of them.");
}

std::vector<c10::IValue> Executor::run(std::vector<c10::IValue> inputs) const {
  checkInputs(inputs);
  return runImpl<false, false>(std::move(inputs), nullptr);
}

std::vector<c10::IValue> Executor::runValidated(std::vector<c10::IValue> inputs) const {
  checkInputs(inputs);
  return runImpl<false, true>(std::move(inputs), nullptr);
}

std::vector<c10::IValue> Executor::runTimed(std::vector<c10::IValue> inputs, std::vector<int64_t>& ns) const {
  checkInputs(inputs);
  ns.resize(program_.instructions.size(), 0);
  return runImpl<true, false>(std::move(inputs), ns.data());
}

std::vector<c10::IValue> Executor::runDumped(std::vector<c10::IValue> inputs, std::vector<DumpedOp>& dumped) const {
  checkInputs(inputs);
  return runImpl<false, false, true>(std::move(inputs), nullptr, &dumped);
}

template <bool kTimed, bool kValidate, bool kDump>
std::vector<c10::IValue> Executor::runImpl(std::vector<c10::IValue> inputs, int64_t* ns,
                                           std::vector<DumpedOp>* dumped) const {
  const Program& p = program_;
  runs_.fetch_add(1, std::memory_order_relaxed);
  RECORD_USER_SCOPE(p.name.c_str());

  // Under no_grad the autograd kernels only forward to the next key; skip them.
  // (Inference tensors skip them anyway.) View and version-counter bookkeeping
  // (ADInplaceOrView) still runs where eager's autograd kernel would let it
  // (Note [Under no_grad an operator's inner calls track no views]), so results are
  // indistinguishable from eager's.
  std::optional<c10::impl::ExcludeDispatchKeyGuard> no_autograd;
  if (!at::GradMode::is_enabled()) no_autograd.emplace(c10::autograd_dispatch_keyset);

  BorrowedState state(p.num_slots);  // Note [Per-run state is borrowed per thread]
  std::vector<c10::IValue>& slots = state.slots();
  for (size_t i = 0; i < inputs.size(); ++i)
    if (p.input_slots[i] >= 0) slots[p.input_slots[i]] = std::move(inputs[i]);

  torch::jit::Stack& stack = state.stack();
  const size_t n = p.instructions.size();
  size_t pc = 0;
  try {
    for (; pc < n; ++pc) {
      const Instruction& instr = p.instructions[pc];
      std::chrono::steady_clock::time_point start;
      if constexpr (kTimed) start = std::chrono::steady_clock::now();
      stack.clear();
      for (const ArgSource& a : instr.args) stack.push_back(argValue(a, slots));
      switch (instr.kind) {
        case InstrKind::Op:
          if (no_autograd && instr.below_inplace_or_view) {
            // Note [Under no_grad an operator's inner calls track no views]
            c10::impl::ExcludeDispatchKeyGuard below(c10::DispatchKey::ADInplaceOrView);
            instr.op->callBoxed(stack);
          } else {
            instr.op->callBoxed(stack);
          }
          TORCH_INTERNAL_ASSERT(stack.size() == instr.outs.size(), "operator returned ", stack.size(),
                                " values, schema promises ", instr.outs.size());
          if constexpr (kValidate) validateOutputs(p, instr, stack);
          if constexpr (kDump) {
            DumpedOp op{instr.debug, {}};
            op.values.reserve(stack.size());
            for (const c10::IValue& v : stack) op.values.push_back(dumpedCopy(v));
            dumped->push_back(std::move(op));
          }
          for (size_t r = 0; r < instr.outs.size(); ++r)
            if (instr.outs[r] >= 0) slots[instr.outs[r]] = std::move(stack[r]);
          break;
        case InstrKind::GetItem:
          if (instr.outs[0] >= 0) slots[instr.outs[0]] = getItem(stack[0], stack[1].toInt());
          break;
        case InstrKind::Sym:
          if (instr.outs[0] >= 0) slots[instr.outs[0]] = applySymFn(instr.sym, stack.data(), stack.size());
          break;
      }
      for (int32_t s : instr.frees) slots[s] = c10::IValue();
      if constexpr (kTimed)
        ns[pc] += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    }
  } catch (const FakeMismatchError&) {
    throw;
  } catch (const std::exception& e) {
    throw replayFailure(p, p.instructions[pc], e, std::current_exception());
  }

  std::vector<c10::IValue> outputs;
  outputs.reserve(p.outputs.size());
  for (const ArgSource& out : p.outputs) outputs.push_back(out.kind == Kind::Slot ? slots[out.slot] : out.constant);
  return outputs;
}

}  // namespace graphex
