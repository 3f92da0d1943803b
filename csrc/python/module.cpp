// graphex._C: the only place where C++ meets Python.
//
// Exposes one class, Executor, built from program bytes (see
// csrc/program/format.h) and called with the boxed calling convention that
// AOTAutograd uses: a single list of inputs in, a list of outputs out. C++
// exceptions become the Python classes in graphex/errors.py.
#include "deploy/module.h"
#include "deploy/safetensors.h"
#include "plan/describe.h"
#include "program/program.h"
#include "program/format.h"
#include "python/state_watch.h"
#include "runtime/binder.h"
#include "runtime/executor.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SavedTensorHooks.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

namespace py = pybind11;

namespace graphex {
namespace {

// Note [A dual tensor is refused, never run without its tangent]
// A tensor with a forward-mode AD tangent (torch.autograd.forward_ad.make_dual) reaches the engine as a plain
// tensor: the program runs below autograd, so its outputs carried no tangent and `unpack_dual(out).tangent` was
// silently None where eager has the derivative (found by a helper, through torch.compile and cache_compile alike).
// Every Python run converts its inputs here, so this is the one place that refuses it, naming the input.
bool hasTangent(const at::Tensor& t) {
  const torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(t);
  return meta != nullptr && meta->fw_grad_ && !meta->fw_grad_->empty();
}

c10::IValue toIValue(PyObject* obj, size_t index) {
  if (THPVariable_Check(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (hasTangent(t))
      throw SignatureError("input " + std::to_string(index) + " is a dual tensor (it carries a forward-mode AD "
                           "tangent, torch.autograd.forward_ad): a captured program runs below autograd and would "
                           "return no tangent. Run forward-mode AD on the eager model (torch.func.jvp(model, ...)), "
                           "or call this model outside fwAD.dual_level() with plain tensors.");
    return t;
  }
  if (PyBool_Check(obj)) return obj == Py_True;
  if (PyLong_Check(obj)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow) throw py::value_error("graphex: input " + std::to_string(index) + " does not fit in int64");
    return static_cast<int64_t>(v);
  }
  if (PyFloat_Check(obj)) return PyFloat_AsDouble(obj);
  if (obj == Py_None) return c10::IValue();
  throw py::type_error("graphex: input " + std::to_string(index) + " is a " +
                       std::string(Py_TYPE(obj)->tp_name) +
                       "; a captured graph takes tensors, ints, floats and bools");
}

py::object fromIValue(c10::IValue v) {
  if (v.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(v).toTensor()));
  if (v.isNone()) return py::none();
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isString()) return py::str(v.toStringRef());
  if (v.isList()) {
    py::list out;
    for (const c10::IValue& item : v.toListRef()) out.append(fromIValue(item));
    return out;
  }
  if (v.isTuple()) {
    py::list out;
    for (const c10::IValue& item : v.toTupleRef().elements()) out.append(fromIValue(item));
    return py::tuple(out);
  }
  throw py::type_error("graphex: cannot return a value of kind " + v.tagKind() + " to Python");
}

std::vector<at::Tensor> tensorList(const py::list& items) {
  std::vector<at::Tensor> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    PyObject* obj = items[i].ptr();
    if (!THPVariable_Check(obj)) throw py::type_error("graphex: constant " + std::to_string(i) + " is not a tensor");
    out.push_back(THPVariable_Unpack(obj));
  }
  return out;
}

std::shared_ptr<Executor> makeExecutor(const py::bytes& spec_bytes, const py::list& constants) {
  std::string_view bytes = spec_bytes;
  return std::make_shared<Executor>(Program::load(bytes, tensorList(constants)));
}

std::vector<c10::IValue> toIValues(const py::list& args) {
  std::vector<c10::IValue> inputs;
  inputs.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) inputs.push_back(toIValue(args[i].ptr(), i));
  return inputs;
}

py::list toPyList(std::vector<c10::IValue> outputs) {
  py::list result(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) result[i] = fromIValue(std::move(outputs[i]));
  return result;
}

const char* kindName(KernelErrorKind kind) {
  switch (kind) {
    case KernelErrorKind::Runtime: return "RuntimeError";
    case KernelErrorKind::Index: return "IndexError";
    case KernelErrorKind::Value: return "ValueError";
    case KernelErrorKind::Type: return "TypeError";
    case KernelErrorKind::NotImplemented: return "NotImplementedError";
    case KernelErrorKind::Buffer: return "BufferError";
    case KernelErrorKind::LinAlg: return "LinAlgError";
    case KernelErrorKind::OutOfMemory: return "OutOfMemoryError";
    case KernelErrorKind::Syntax: return "SyntaxError";
    case KernelErrorKind::Accelerator: return "AcceleratorError";
    case KernelErrorKind::Dist: return "DistError";
    case KernelErrorKind::DistBackend: return "DistBackendError";
    case KernelErrorKind::DistStore: return "DistStoreError";
    case KernelErrorKind::DistNetwork: return "DistNetworkError";
    case KernelErrorKind::DistQueueEmpty: return "QueueEmptyError";
    case KernelErrorKind::Foreign: return "RuntimeError";
  }
  return "RuntimeError";
}

// The Python exception inside a kernel's error, or None. A Python kernel (a custom op
// written in Python, or a TorchDispatchMode such as the one AOTAutograd runs on a
// graph's first call) fails with torch's python_error, which leaves the exception in
// this thread's error indicator until persist() fetches it; pybind11 kernels fail with
// error_already_set. Must run with the GIL held, before any other Python call.
py::object pythonCause(const std::exception_ptr& cause) {
  if (!cause) return py::none();
  try {
    std::rethrow_exception(cause);
  } catch (python_error& e) {
    e.persist();
    if (!e.value) return py::none();
    PyObject *type = e.type, *value = e.value, *tb = e.traceback;
    Py_XINCREF(type);
    Py_XINCREF(value);
    Py_XINCREF(tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb && value) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return py::reinterpret_steal<py::object>(value);
  } catch (py::error_already_set& e) {
    return e.value();
  } catch (...) {
    return py::none();
  }
}

// The graphex.errors classes C++ raises. Imported once, under pybind11's GIL-safe one-time
// initialization, and never destroyed (a function-local `static py::object` would be released
// after the interpreter is gone, and its initialization can deadlock with the GIL).
struct ErrorClasses {
  py::object program_error, signature_error, frozen_input_replaced, replay_error, fake_mismatch;
};

const ErrorClasses& errorClasses() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<ErrorClasses> storage;
  return storage
      .call_once_and_store_result([] {
        py::module_ errors = py::module_::import("graphex.errors");
        return ErrorClasses{errors.attr("ProgramError"), errors.attr("SignatureError"),
                            errors.attr("FrozenInputReplaced"), errors.attr("ReplayError"),
                            errors.attr("FakeMismatch")};
      })
      .get_stored();
}

// graphex.runtime.make_replay_error: imported at the first replay error, not at module init (graphex.runtime
// imports this module), the same one-time way.
const py::object& makeReplayError() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> storage;
  return storage
      .call_once_and_store_result([] { return py::module_::import("graphex.runtime").attr("make_replay_error"); })
      .get_stored();
}

// Note [A replay error keeps its cause] (runtime/executor.h): raise the ReplayError that is
// also what eager raises, built by graphex.runtime.make_replay_error from the error's fields.
[[noreturn]] void raiseReplayError(const ExecutionError& e) {
  py::object cause = e.kind == KernelErrorKind::Foreign ? pythonCause(e.cause) : py::none();  // first: see above
  py::object err = makeReplayError()(kindName(e.kind), e.kernel_message, e.graph, e.node, e.op, e.source, cause);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
  throw py::error_already_set();
}

// Run `fn(inputs)` with the GIL released: Python kernels of custom ops take it back as needed.
// An operator's failure is raised as soon as the GIL is back (its Python cause, if any, is
// still in the error indicator then).
template <typename Fn>
std::vector<c10::IValue> withoutGil(std::vector<c10::IValue> inputs, Fn&& fn) {
  std::optional<ExecutionError> failure;
  {
    py::gil_scoped_release no_gil;
    try {
      return fn(std::move(inputs));
    } catch (const ExecutionError& e) {
      failure.emplace(e);
    }
  }
  raiseReplayError(*failure);
}

template <typename Fn>
std::vector<c10::IValue> withoutGil(const py::list& args, Fn&& fn) {
  return withoutGil(toIValues(args), std::forward<Fn>(fn));
}

py::list runBoxed(const Executor& ex, const py::list& args) {
  return toPyList(withoutGil(args, [&](std::vector<c10::IValue> in) { return ex.run(std::move(in)); }));
}

// Note [Entries are found by signature, not by exceptions]: None when the inputs do not fit.
py::object tryRunBoxed(const Executor& ex, const py::list& args) {
  std::vector<c10::IValue> inputs = toIValues(args);
  if (!ex.fits(inputs)) return py::none();
  return toPyList(withoutGil(std::move(inputs), [&](std::vector<c10::IValue> in) { return ex.runFitting(std::move(in)); }));
}

py::tuple runTimedBoxed(const Executor& ex, const py::list& args) {
  std::vector<int64_t> ns;
  py::list result =
      toPyList(withoutGil(args, [&](std::vector<c10::IValue> in) { return ex.runTimed(std::move(in), ns); }));
  return py::make_tuple(result, ns);
}

py::list runValidatedBoxed(const Executor& ex, const py::list& args) {
  return toPyList(withoutGil(args, [&](std::vector<c10::IValue> in) { return ex.runValidated(std::move(in)); }));
}

// Note [A dumped run hands out clones] (runtime/executor.h): (outputs, [(node, target, [values])]).
py::tuple runDumpedBoxed(const Executor& ex, const py::list& args) {
  std::vector<DumpedOp> dumped;
  py::list result =
      toPyList(withoutGil(args, [&](std::vector<c10::IValue> in) { return ex.runDumped(std::move(in), dumped); }));
  py::list ops;
  const Program& p = ex.program();
  for (DumpedOp& d : dumped) {
    const NodeInfo& info = p.nodes[d.node_index];
    ops.append(py::make_tuple(info.name, info.target, toPyList(std::move(d.values))));
  }
  return py::make_tuple(result, ops);
}

std::string programSummary(const Program& p) { return describeProgram(p); }

// Note [One binder]: a program with the binder of its tables, what a cache entry runs. The executor is
// shared with Python (first-run validation, dumps); every other run goes through try_run.
struct BoundProgram {
  std::shared_ptr<Executor> executor;
  Binder binder;
};

std::shared_ptr<BoundProgram> makeBoundProgram(const py::bytes& program_bytes, const std::string& what) {
  std::string_view bytes = program_bytes;
  const fb::Program& root = format::verify(bytes);
  Program program = Program::fromTable(root);
  Binder binder = Binder::fromTable(root, program, what);
  return std::make_shared<BoundProgram>(BoundProgram{std::make_shared<Executor>(std::move(program)), std::move(binder)});
}

// The arguments the bindings read, as values; the others (any Python object: a result leaf may pass it
// through) are left None (Note [One binder]).
std::vector<c10::IValue> boundArguments(const Binder& binder, const py::list& args) {
  if (args.size() < binder.numArguments())
    throw SignatureError(std::to_string(args.size()) + " arguments given, the program takes " +
                         std::to_string(binder.numArguments()));
  std::vector<c10::IValue> values(args.size());
  for (size_t i = 0; i < args.size(); ++i)
    if (binder.readsArgument(i)) values[i] = toIValue(args[i].ptr(), i);
  return values;
}

// The flattened result as Python objects: an argument passed through is the caller's object itself.
py::list pyResults(const Binder& binder, std::vector<c10::IValue> outputs, const py::list& args) {
  if (binder.leaves().empty()) return toPyList(std::move(outputs));
  py::list result(binder.leaves().size());
  size_t k = 0;
  for (const Binder::Leaf& l : binder.leaves()) {
    switch (static_cast<fb::LeafKind>(l.kind)) {
      case fb::LeafKind::Output: result[k++] = fromIValue(outputs[l.index]); break;
      case fb::LeafKind::Argument: result[k++] = args[l.index]; break;
      default: result[k++] = fromIValue(l.value); break;
    }
  }
  return result;
}

// The program's inputs, or None when a shape guard is broken (Note [Entries are found by signature, not by
// exceptions]).
py::object bindBoxed(const BoundProgram& bp, const py::list& args, const py::list& held) {
  std::vector<c10::IValue> inputs = bp.binder.bind(boundArguments(bp.binder, args), toIValues(held));
  if (bp.binder.hasGuards() && !bp.binder.brokenGuard(inputs, bp.executor->program()).empty()) return py::none();
  return toPyList(std::move(inputs));
}

// The flattened result, or None (nothing run) when the call breaks a shape guard or does not fit the signature.
py::object tryRunBound(const BoundProgram& bp, const py::list& args, const py::list& held) {
  std::vector<c10::IValue> inputs = bp.binder.bind(boundArguments(bp.binder, args), toIValues(held));
  const Executor& ex = *bp.executor;
  if (bp.binder.hasGuards() && !bp.binder.brokenGuard(inputs, ex.program()).empty()) return py::none();
  if (!ex.fits(inputs)) return py::none();
  std::vector<c10::IValue> outs =
      withoutGil(std::move(inputs), [&](std::vector<c10::IValue> in) { return ex.runFitting(std::move(in)); });
  return pyResults(bp.binder, std::move(outs), args);
}

// Note [A plain call's fast path is one C++ call]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// After a real step has streamed its weights through the CPU's caches, every Python frame a
// cache_compile call walks (the call key, the entry loop, the generated guard function) finds
// its bytecode and objects evicted, and costs several times what it costs in a loop
// (Note [Per-call costs are measured after a real engine run], bench/per_call.py). So the call
// that hit last is remembered as one FastCall, and the next call with the same key tries it
// first, in C++ alone:
//   * the call key: as many positional arguments, each of exactly the type it had (a tensor
//     exactly torch.Tensor), numbers and strings of the same value (a float by its bits);
//   * grad mode off (on, the Python path decides whether autograd is needed);
//   * the entry's guards, through what the generated fast path itself proves by
//     (Note [One function checks the guards and binds the inputs], graphex/inference/guards.py):
//     the published StateWatch unchanged, each argument's class unchanged (its StateWatch), and
//     the global torch state (torch's GlobalStateGuard, the saved-tensors hooks, the torch
//     function stack, the default device), called as the generated code calls them;
//   * the held inputs the last full check published, then bind, shape guards, signature, run
//     and result leaves, as BoundProgram::try_run.
// Any "no" returns `miss` with nothing run, and the Python path (which proves the same things,
// and more) answers the call; so the fast path can only be narrower than that path, never wider.
// An entry whose fast path would need other checks (a guard read through a list, a closure, a
// tensor an argument holds) gets no FastCall (guards.py, GuardSet.native).
struct FastCall {
  struct Arg {
    PyTypeObject* type;
    py::object value;        // a number or str: the value of the call key; unset for a tensor or None
    py::object class_watch;  // the argument class's StateWatch, or None
  };
  std::shared_ptr<BoundProgram> program;
  py::list published;  // the guard function's P: P[0] is (StateWatch, [held inputs]), replaced as one object
  std::vector<Arg> args;
  py::object global_state_check;  // GlobalStateGuard.check, or None when the entry has no such guard
  bool check_saved_hooks = false, check_torch_function = false;
  py::object device_module;  // torch.utils._device (CURRENT_DEVICE must be None), or None
  py::object unflatten;  // None: the result is its one leaf
  py::object miss;

  static bool sameValue(PyObject* a, PyObject* want) {
    if (Py_TYPE(a) != Py_TYPE(want)) return false;
    if (PyFloat_CheckExact(a)) {  // by its bits: -0.0 is not 0.0 (the call key's float.hex())
      double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(want);
      return std::memcmp(&x, &y, sizeof x) == 0;
    }
    if (a == want) return true;
    int eq = PyObject_RichCompareBool(a, want, Py_EQ);
    if (eq < 0) {
      PyErr_Clear();
      return false;
    }
    return eq == 1;
  }

  // As the generated fast path checks them (guards.py, _state_check(fast=True)): what its Python calls return, read
  // from the same C++ state (the saved-tensors hooks and torch function mode stacks) or by the same call.
  bool stateHolds() const {
    if (!global_state_check.is_none() && !PyObject_IsTrue(global_state_check().ptr())) return false;
    if (check_saved_hooks && at::SavedTensorDefaultHooks::get_hooks(/*ignore_is_tracing=*/true).has_value()) return false;
    if (check_torch_function && at::impl::PythonTorchFunctionTLS::stack_len() != 0) return false;
    if (!device_module.is_none() && !device_module.attr("CURRENT_DEVICE").is_none()) return false;
    return true;
  }

  // Note [Objects that hold Python objects take part in GC] (state_watch.h). A cleared FastCall always misses.
  int traverse(visitproc visit, void* arg) const {
    Py_VISIT(published.ptr());
    for (const Arg& a : args) {
      Py_VISIT(a.value.ptr());
      Py_VISIT(a.class_watch.ptr());
    }
    Py_VISIT(global_state_check.ptr());
    Py_VISIT(device_module.ptr());
    Py_VISIT(unflatten.ptr());
    return 0;
  }
  void clear() {
    program.reset();
    published = py::list();
    args.clear();
    global_state_check = py::none();
    device_module = py::none();
    unflatten = py::none();
  }

  py::object call(const py::tuple& call_args) const {
    if (!program || call_args.size() != args.size() || c10::GradMode::is_enabled()) return miss;
    for (size_t i = 0; i < args.size(); ++i) {
      PyObject* a = PyTuple_GET_ITEM(call_args.ptr(), i);
      const Arg& want = args[i];
      if (Py_TYPE(a) != want.type) return miss;
      if (want.value && !sameValue(a, want.value.ptr())) return miss;
      if (!want.class_watch.is_none() && !stateWatchUnchanged(want.class_watch)) return miss;
    }
    py::object pair = published[0];
    PyObject* p = pair.ptr();
    if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2 || !PyList_Check(PyTuple_GET_ITEM(p, 1)) ||
        !stateWatchUnchanged(PyTuple_GET_ITEM(p, 0)))
      return miss;
    if (!stateHolds()) return miss;
    py::list held = py::reinterpret_borrow<py::list>(PyTuple_GET_ITEM(p, 1));
    py::list flat(call_args.size());
    for (size_t i = 0; i < call_args.size(); ++i) flat[i] = call_args[i];
    py::object leaves = tryRunBound(*program, flat, held);
    if (leaves.is_none()) return miss;
    if (unflatten.is_none()) return py::reinterpret_borrow<py::list>(leaves)[0];
    return unflatten(leaves);
  }
};

// Note [cache_compile's call enters C++ at once]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Even one Python frame between the caller and the FastCall costs ~18 us after a real step (the interpreter's own
// code and the frame's objects are evicted by the step's weights; bench/cache_call_cost.py). So CachedFunction
// (graphex/inference/cache_compile.py) derives from CachedCall, a type whose call slot is C++: a call without
// keywords tries the FastCall set on it (`_fast`), and anything else (no FastCall yet, a miss, keywords) calls the
// instance's Python `_call(*args, **kwargs)`, the path that decides everything and installs the next FastCall.
// A static type rather than a pybind11 class: pybind11's dispatcher (overload resolution, argument casters) is
// exactly the per-call work this removes.
struct CachedCallObject {
  PyObject_HEAD
  PyObject* fast;           // the FastCall (a pybind11 instance), or nullptr
  const FastCall* fast_ptr;  // its C++ object, valid while `fast` is held
};

PyObject* cachedCallInvoke(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* c = reinterpret_cast<CachedCallObject*>(self);
  if (c->fast_ptr != nullptr && (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0)) {
    PyObject* fast = c->fast;
    const FastCall* f = c->fast_ptr;
    Py_INCREF(fast);  // kept alive through the call, even if another thread replaces it while the engine runs
    try {
      py::object result = f->call(py::reinterpret_borrow<py::tuple>(args));
      bool missed = result.ptr() == f->miss.ptr();
      Py_DECREF(fast);
      if (!missed) return result.release().ptr();
    } catch (py::error_already_set& e) {
      Py_DECREF(fast);
      e.restore();
      return nullptr;
    } catch (...) {
      Py_DECREF(fast);
      py::detail::try_translate_exceptions();  // graphex's translators (registerErrors), then pybind11's own
      return nullptr;
    }
  }
  PyObject* slow = PyObject_GetAttrString(self, "_call");
  if (slow == nullptr) return nullptr;
  PyObject* result = PyObject_Call(slow, args, kwargs);
  Py_DECREF(slow);
  return result;
}

int cachedCallTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<CachedCallObject*>(self)->fast);
  return 0;
}

int cachedCallClear(PyObject* self) {
  auto* c = reinterpret_cast<CachedCallObject*>(self);
  c->fast_ptr = nullptr;
  Py_CLEAR(c->fast);
  return 0;
}

void cachedCallDealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  cachedCallClear(self);
  Py_TYPE(self)->tp_free(self);
}

PyObject* cachedCallGetFast(PyObject* self, void*) {
  PyObject* fast = reinterpret_cast<CachedCallObject*>(self)->fast;
  return Py_NewRef(fast != nullptr ? fast : Py_None);
}

int cachedCallSetFast(PyObject* self, PyObject* value, void*) {
  auto* c = reinterpret_cast<CachedCallObject*>(self);
  const FastCall* ptr = nullptr;
  if (value != nullptr && value != Py_None) {
    try {
      ptr = &py::cast<const FastCall&>(py::handle(value));
    } catch (const py::cast_error&) {
      PyErr_SetString(PyExc_TypeError, "graphex: CachedCall._fast takes a graphex._C.FastCall or None");
      return -1;
    }
  }
  PyObject* old = c->fast;
  c->fast = ptr != nullptr ? Py_NewRef(value) : nullptr;
  c->fast_ptr = ptr;
  Py_XDECREF(old);
  return 0;
}

PyGetSetDef cachedCallGetSet[] = {
    {"_fast", cachedCallGetFast, cachedCallSetFast,
     "The FastCall tried first by a call without keywords (Note [cache_compile's call enters C++ at once]), or None.",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject cachedCallType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "graphex._C.CachedCall";
  t.tp_basicsize = sizeof(CachedCallObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  t.tp_doc = "Note [cache_compile's call enters C++ at once] (csrc/python/module.cpp): the base of CachedFunction.";
  t.tp_new = PyType_GenericNew;
  t.tp_dealloc = cachedCallDealloc;
  t.tp_traverse = cachedCallTraverse;
  t.tp_clear = cachedCallClear;
  t.tp_call = cachedCallInvoke;
  t.tp_getset = cachedCallGetSet;
  return t;
}();

// Note [A compiled graph's call enters its runner at once]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// AOTAutograd calls the compiled graph once per step. Its Python `__call__` (`return self.runner(args)`) was one
// frame of ours per call, 5-6 us after a real step (bench/per_call.py, "graphex Python"). CompiledGraph
// (graphex/runtime/compiled_graph.py) derives from RunnerCall instead, whose call slot hands the arguments to the
// `runner` it holds (the executor itself in the steady phase; the first-call or validating method before) with no
// frame between. The runner is usually a bound method of the graph itself, a cycle, so the type takes part in GC.
struct RunnerCallObject {
  PyObject_HEAD
  PyObject* runner;  // nullptr until set
};

PyObject* runnerCallInvoke(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject* runner = reinterpret_cast<RunnerCallObject*>(self)->runner;
  if (runner == nullptr) {
    PyErr_SetString(PyExc_TypeError, "graphex: this compiled graph has no runner yet");
    return nullptr;
  }
  Py_INCREF(runner);  // the call may replace it (a phase change)
  PyObject* result = PyObject_Call(runner, args, kwargs);
  Py_DECREF(runner);
  return result;
}

int runnerCallTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<RunnerCallObject*>(self)->runner);
  return 0;
}

int runnerCallClear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<RunnerCallObject*>(self)->runner);
  return 0;
}

void runnerCallDealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  runnerCallClear(self);
  Py_TYPE(self)->tp_free(self);
}

PyObject* runnerCallGet(PyObject* self, void*) {
  PyObject* runner = reinterpret_cast<RunnerCallObject*>(self)->runner;
  if (runner == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "runner");
    return nullptr;
  }
  return Py_NewRef(runner);
}

int runnerCallSet(PyObject* self, PyObject* value, void*) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "graphex: a compiled graph's runner cannot be deleted");
    return -1;
  }
  if (!PyCallable_Check(value)) {
    PyErr_SetString(PyExc_TypeError, "graphex: a compiled graph's runner must be callable");
    return -1;
  }
  Py_XSETREF(reinterpret_cast<RunnerCallObject*>(self)->runner, Py_NewRef(value));
  return 0;
}

PyGetSetDef runnerCallGetSet[] = {
    {"runner", runnerCallGet, runnerCallSet,
     "What a call runs: runner(args) (Note [A compiled graph's call enters its runner at once]).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject runnerCallType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "graphex._C.RunnerCall";
  t.tp_basicsize = sizeof(RunnerCallObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  t.tp_doc = "Note [A compiled graph's call enters its runner at once] (csrc/python/module.cpp): the base of "
             "CompiledGraph.";
  t.tp_new = PyType_GenericNew;
  t.tp_dealloc = runnerCallDealloc;
  t.tp_traverse = runnerCallTraverse;
  t.tp_clear = runnerCallClear;
  t.tp_call = runnerCallInvoke;
  t.tp_getset = runnerCallGetSet;
  return t;
}();

void registerErrors(py::module_& m) {
  (void)errorClasses();  // imported now, with the GIL held by module init
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ProgramError& e) {
      PyErr_SetString(errorClasses().program_error.ptr(), e.what());
    } catch (const format::FormatError& e) {
      PyErr_SetString(errorClasses().program_error.ptr(), e.what());
    } catch (const deploy::WeightsError& e) {
      PyErr_SetString(errorClasses().program_error.ptr(), e.what());
    } catch (const FrozenInputReplaced& e) {
      const py::object& cls = errorClasses().frozen_input_replaced;
      py::object err = cls(e.what(), e.input);
      PyErr_SetObject(cls.ptr(), err.ptr());
    } catch (const SignatureError& e) {
      PyErr_SetString(errorClasses().signature_error.ptr(), e.what());
    } catch (const ExecutionError& e) {  // runs translate it themselves (withoutGil); this is a fallback
      PyErr_SetString(errorClasses().replay_error.ptr(), e.what());
    } catch (const FakeMismatchError& e) {
      const py::object& cls = errorClasses().fake_mismatch;
      py::object err = cls(e.what(), e.node_index, e.output, e.expected, e.actual);
      PyErr_SetObject(cls.ptr(), err.ptr());
    }
  });
}

}  // namespace
}  // namespace graphex

PYBIND11_MODULE(_C, m) {
  using namespace graphex;
  m.doc() = "graphex C++ core: programs built from specs, run through the c10 dispatcher";
  registerErrors(m);
  registerStateWatch(m);

  m.attr("SPEC_FORMAT_VERSION") = format::kFormatVersion;

  // What the engine watches on a frozen input (Executor::Watch, the one definition; graphex/lowering/fold.py reads these).
  m.attr("WATCH_IDENTITY") = static_cast<int>(Executor::Watch::Identity);
  m.attr("WATCH_DATA") = static_cast<int>(Executor::Watch::Data);
  m.attr("WATCH_CONTENTS") = static_cast<int>(Executor::Watch::Contents);

  py::class_<Executor, std::shared_ptr<Executor>>(m, "Executor")
      .def(py::init(&makeExecutor), py::arg("program"), py::arg("constants"),
           "Build a program from program bytes (verified first) and the constant tensors it refers to "
           "(empty: the ones stored in the program).")
      .def("__call__", &runBoxed, py::arg("args"),
           "Run on a list of inputs (boxed calling convention); returns a list of outputs.")
      .def("bind_frozen",
           [](Executor& e, const std::vector<std::tuple<size_t, at::Tensor, int>>& frozen) {
             std::vector<Executor::FrozenInput> inputs;
             for (const auto& [index, tensor, watch] : frozen) {
               if (watch < static_cast<int>(Executor::Watch::Identity) || watch > static_cast<int>(Executor::Watch::Contents))
                 throw py::value_error("graphex: watch level must be WATCH_IDENTITY, WATCH_DATA or WATCH_CONTENTS");
               inputs.push_back({index, tensor, static_cast<Executor::Watch>(watch)});
             }
             e.bindFrozen(std::move(inputs));
           },
           py::arg("frozen"),
           "Note [A frozen parameter is checked by identity]: every run requires input i to be tensor t itself, "
           "for each (i, t, watch); watch 1 also its data pointer, dtype, sizes, strides and key set, 2 also its "
           "bytes, copied now and compared on every run (values folded from it, Note [Folding frozen parameters]). "
           "A change raises graphex.FrozenInputReplaced.")
      .def("try_run", &tryRunBoxed, py::arg("args"),
           "Run if the inputs fit the captured signature; None (nothing run) if they do not.")
      .def("fits", [](const Executor& e, const py::list& args) { return e.fits(toIValues(args)); }, py::arg("args"),
           "Whether the inputs fit the captured signature (what __call__ raises SignatureError for).")
      .def("run_validated", &runValidatedBoxed, py::arg("args"),
           "Run once, checking custom ops' outputs against their fake/Meta promises (raises FakeMismatch).")
      .def("run_timed", &runTimedBoxed, py::arg("args"),
           "Run once, also timing every instruction: returns (outputs, [nanoseconds per instruction]).")
      .def("run_dumped", &runDumpedBoxed, py::arg("args"),
           "Run once, also handing out every op's outputs, cloned: returns (outputs, [(node, target, [values])]).")
      .def("node_names", [](const Executor& e) {
             std::vector<std::pair<std::string, std::string>> out;
             for (const auto& i : e.program().instructions)
               out.emplace_back(e.program().nodes[i.debug].name, e.program().nodes[i.debug].target);
             return out;
           }, "(node name, target) of each instruction, in execution order.")
      .def_property_readonly("name", [](const Executor& e) { return e.program().name; })
      .def_property_readonly("num_ops", [](const Executor& e) { return e.program().numOps(); })
      .def_property_readonly("num_inputs", [](const Executor& e) { return e.program().inputs.size(); })
      .def_property_readonly("num_slots", [](const Executor& e) { return e.program().num_slots; })
      .def_property_readonly("run_count", &Executor::runCount, "How many times the program has been run.")
      .def("describe", [](const Executor& e) { return programSummary(e.program()); },
           "A readable listing of the program: instructions, slots, moves and frees.")
      .def_property_readonly_static("_boxed_call", [](py::object) { return true; });

  py::class_<BoundProgram, std::shared_ptr<BoundProgram>>(m, "BoundProgram")
      .def(py::init(&makeBoundProgram), py::arg("program"), py::arg("what"),
           "A program (bytes, verified) with its binder (Note [One binder]): bindings, shape guards and result "
           "leaves read from its tables; `what` names it in errors.")
      .def_readonly("executor", &BoundProgram::executor)
      .def_property_readonly("held_bindings", [](const BoundProgram& bp) { return bp.binder.heldBindings(); },
                             "The program inputs the caller hands over as `held` (parameters, buffers, tensors an "
                             "argument holds), in binding order.")
      .def("bind", &bindBoxed, py::arg("args"), py::arg("held"),
           "The program's inputs for the flattened arguments and the held tensors; None when a shape guard fails.")
      .def("broken_guard",
           [](const BoundProgram& bp, const py::list& inputs) {
             return bp.binder.brokenGuard(toIValues(inputs), bp.executor->program());
           },
           py::arg("inputs"), "'' when every shape guard holds for the bound inputs, else the first that fails.")
      .def("try_run", &tryRunBound, py::arg("args"), py::arg("held"),
           "Bind, check the shape guards and the signature, run, and return the flattened result; None (nothing "
           "run) when the call does not fit.")
      .def("results",
           [](const BoundProgram& bp, const py::list& outputs, const py::list& args) {
             return pyResults(bp.binder, toIValues(outputs), args);
           },
           py::arg("outputs"), py::arg("args"), "The flattened result of a run's outputs (the result leaves).");

  py::class_<FastCall>(m, "FastCall", "Note [A plain call's fast path is one C++ call] (csrc/python/module.cpp)",
                       py::custom_type_setup(takesPartInGc<FastCall>))
      .def(py::init([](std::shared_ptr<BoundProgram> program, py::list published,
                       const std::vector<std::tuple<py::object, py::object, py::object>>& args,
                       py::object global_state_check, bool saved_hooks, bool torch_function, py::object device_module,
                       py::object unflatten, py::object miss) {
             FastCall f{std::move(program), std::move(published), {}, std::move(global_state_check), saved_hooks,
                        torch_function, std::move(device_module), std::move(unflatten), std::move(miss)};
             for (const auto& [type, value, class_watch] : args) {
               if (!PyType_Check(type.ptr())) throw py::type_error("graphex: FastCall: an argument's type is not a type");
               // a tensor (None) is checked by its type alone; so is None itself, NoneType's one value
               f.args.push_back({reinterpret_cast<PyTypeObject*>(type.ptr()), value.is_none() ? py::object() : value,
                                 class_watch});
             }
             return f;
           }),
           py::arg("program"), py::arg("published"), py::arg("args"), py::arg("global_state_check"),
           py::arg("saved_hooks"), py::arg("torch_function"), py::arg("device_module"), py::arg("unflatten"),
           py::arg("miss"),
           "args: (type, value or None for a tensor, class StateWatch or None) per positional argument; "
           "global_state_check: a GlobalStateGuard's bound check, or None; saved_hooks / torch_function: whether no "
           "saved-tensors hooks / no torch function mode must be active; device_module: torch.utils._device when no "
           "default device must be set, or None.")
      .def("__call__", &FastCall::call, py::arg("args"),
           "The call's result, or `miss` (nothing run) when anything differs from what the entry was proved for.");

  if (PyType_Ready(&runnerCallType) < 0) throw py::error_already_set();
  m.add_object("RunnerCall", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&runnerCallType)));
  if (PyType_Ready(&cachedCallType) < 0) throw py::error_already_set();
  m.add_object("CachedCall", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&cachedCallType)));

  py::class_<Module, std::shared_ptr<Module>>(m, "Module")
      .def(py::init([](const std::string& path) { return std::make_shared<Module>(Module::load(path)); }),
           py::arg("path"), "graphex::Module::load: an exported artifact, loaded by the C++ runtime alone.")
      .def("__call__", [](const Module& mod, const py::list& args) {
             return toPyList(withoutGil(args, [&](std::vector<c10::IValue> in) { return mod.run(in); }));
           }, py::arg("args"), "Run on the flattened arguments; returns the flattened result.")
      .def_property_readonly("tree", &Module::tree);

  m.def("total_run_count", &Executor::totalRunCount,
        "Runs of every program in this process so far (tests use it to prove the engine ran).");
}
