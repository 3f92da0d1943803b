// graphex._C: where C++ meets Python, with the other files of this folder (and nowhere else): call_slots.h with
// cached_call.cpp, runner_call.cpp and direct_call.cpp (what a call runs before the engine), state_watch.cpp (the
// guards' dict watch), gc.h, bound_program.h.
//
// Exposes Executor, built from program bytes (see
// csrc/program/format.h) and called with the boxed calling convention that
// AOTAutograd uses: a single list of inputs in, a list of outputs out. C++
// exceptions become the Python classes in graphex/errors.py.
#include "deploy/module.h"
#include "deploy/safetensors.h"
#include "plan/describe.h"
#include "program/program.h"
#include "program/format.h"
#include "python/bound_program.h"
#include "python/call_slots.h"
#include "python/state_watch.h"
#include "runtime/binder.h"
#include "runtime/executor.h"

#include <ATen/ops/alias.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

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

// The graphex.errors classes C++ raises. Imported once, at the first error (graphex.errors imports Dynamo, which a
// process that only replays cache entries never needs: Note [A cache hit imports no compiler]), under pybind11's
// GIL-safe one-time initialization (errors are translated with the GIL held), and never destroyed (a
// function-local `static py::object` would be released after the interpreter is gone, and its initialization can
// deadlock with the GIL).
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

std::shared_ptr<BoundProgram> makeBoundProgram(const py::bytes& program_bytes, const std::string& what) {
  std::string_view bytes = program_bytes;
  const fb::Program& root = format::verify(bytes);
  Program program = Program::fromTable(root);
  Binder binder = Binder::fromTable(root, program, what);
  return std::make_shared<BoundProgram>(BoundProgram{std::make_shared<Executor>(std::move(program)), std::move(binder)});
}

// A call's flattened arguments, a list or a tuple (FastCall hands its call's tuple over as it is), read in place.
struct ArgItems {
  PyObject* const* items;
  size_t size;
  explicit ArgItems(py::handle seq) {
    if (!PyList_Check(seq.ptr()) && !PyTuple_Check(seq.ptr()))
      throw py::type_error("graphex: a program's arguments are a list or a tuple");
    items = PySequence_Fast_ITEMS(seq.ptr());
    size = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
  }
};

// The arguments the bindings read, as values; the others (any Python object: a result leaf may pass it
// through) are left None (Note [One binder]).
std::vector<c10::IValue> boundArguments(const Binder& binder, const ArgItems& args) {
  if (args.size < binder.numArguments())
    throw SignatureError(std::to_string(args.size) + " arguments given, the program takes " +
                         std::to_string(binder.numArguments()));
  std::vector<c10::IValue> values(args.size);
  for (size_t i = 0; i < args.size; ++i)
    if (binder.readsArgument(i)) values[i] = toIValue(args.items[i], i);
  return values;
}

// The flattened result as Python objects: an argument passed through is the caller's object itself.
py::list pyResults(const Binder& binder, std::vector<c10::IValue> outputs, const ArgItems& args) {
  if (binder.leaves().empty()) return toPyList(std::move(outputs));
  py::list result(binder.leaves().size());
  // A graph output the function returns twice (`return h, h`) is one Python object, made once; a second view of it
  // (an OutputView leaf) is a tensor of its own.
  std::vector<py::object> made(outputs.size());
  size_t k = 0;
  for (const Binder::Leaf& l : binder.leaves()) {
    switch (static_cast<fb::LeafKind>(l.kind)) {
      case fb::LeafKind::Output: {
        py::object& out = made[l.index];
        if (!out) out = fromIValue(outputs[l.index]);
        result[k++] = out;
        break;
      }
      case fb::LeafKind::OutputView:  // Note [Two views of one output are two tensors] (graphex/inference/capture.py)
        result[k++] = fromIValue(at::alias(outputs[l.index].toTensor()));
        break;
      case fb::LeafKind::Argument: result[k++] = py::reinterpret_borrow<py::object>(args.items[l.index]); break;
      default: result[k++] = fromIValue(l.value); break;
    }
  }
  return result;
}

// The program's inputs, or None when a shape guard is broken (Note [Entries are found by signature, not by
// exceptions]).
py::object bindBoxed(const BoundProgram& bp, const py::list& args, const py::list& held) {
  std::vector<c10::IValue> inputs = bp.binder.bind(boundArguments(bp.binder, ArgItems(args)), toIValues(held));
  if (bp.binder.hasGuards() && !bp.binder.brokenGuard(inputs, bp.executor->program()).empty()) return py::none();
  return toPyList(std::move(inputs));
}

}  // namespace

// The flattened result, or None (nothing run) when the call breaks a shape guard or does not fit the signature.
py::object tryRunBound(const BoundProgram& bp, py::handle args, const py::list& held) {
  const ArgItems items(args);
  std::vector<c10::IValue> inputs = bp.binder.bind(boundArguments(bp.binder, items), toIValues(held));
  const Executor& ex = *bp.executor;
  if (bp.binder.hasGuards() && !bp.binder.brokenGuard(inputs, ex.program()).empty()) return py::none();
  if (!ex.fits(inputs)) return py::none();
  std::vector<c10::IValue> outs =
      withoutGil(std::move(inputs), [&](std::vector<c10::IValue> in) { return ex.runFitting(std::move(in)); });
  return pyResults(bp.binder, std::move(outs), items);
}

namespace {

void registerErrors(py::module_& m) {
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
      .def("mismatch", [](const Executor& e, const py::list& args) { return e.mismatch(toIValues(args)); },
           py::arg("args"),
           "Why the inputs do not fit the captured signature: the first input that differs, named; '' if none does.")
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
             return pyResults(bp.binder, toIValues(outputs), ArgItems(args));
           },
           py::arg("outputs"), py::arg("args"), "The flattened result of a run's outputs (the result leaves).");

  registerCallSlots(m);

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
