// cache_compile's call (graphex/inference/cache_compile.py): CachedCall, the C type CachedFunction derives from, and
// FastCall, the last plain hit it tries before any Python runs.
#include "python/call_slots.h"

#include "python/bound_program.h"
#include "python/gc.h"
#include "python/state_watch.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SavedTensorHooks.h>
#include <c10/core/GradMode.h>

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace graphex {
namespace {

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
//   * the fast path's other checks, those C++ does not make (`hasattr` on a property, an attribute
//     of an object with its own `__getattribute__`, as transformers' configs have, what an argument
//     holds): one call of the generated residual function `rest(args, func, S)`, which also returns
//     the held inputs (S, the ones the last full check published, and the tensors an argument holds,
//     read through their paths); only when the entry has such guards or inputs;
//   * the held inputs (the residual's, or else the ones the last full check published), then bind,
//     shape guards, signature, run and result leaves, as BoundProgram::try_run.
// A call with keywords takes it when the FastCall was made from one with the same names in the same
// order, each argument a pytree leaf (the call flattens to its arguments, positional then keyword).
// Any "no" returns `miss` with nothing run, and the Python path (which proves the same things,
// and more) answers the call; so the fast path can only be narrower than that path, never wider.

struct FastCall {
  struct Arg {
    PyTypeObject* type;
    py::object value;  // a number or str: the value of the call key; unset for a tensor, None or an object passed in
  };
  std::shared_ptr<BoundProgram> program;
  py::list published;  // the guard function's P: P[0] is (StateWatch, [held inputs]), replaced as one object
  std::vector<Arg> args;
  // The arguments' classes' StateWatches, each once (four tensor arguments share torch.Tensor's); class_watch_refs
  // keeps them alive.
  std::vector<const StateWatch*> class_watches;
  std::vector<py::object> class_watch_refs;
  py::object global_state_check;  // GlobalStateGuard.check, or None when the entry has no such guard
  bool check_saved_hooks = false, check_torch_function = false;
  py::object device_dict;  // torch.utils._device's globals (its CURRENT_DEVICE must be None), or None
  py::object unflatten;  // None: the result is its one leaf
  py::object residual;  // the generated `rest(args, func, S)`: the held inputs when its checks hold, else None
  std::vector<py::object> kwnames;  // the keywords' names, in the call's order (interned str)
  py::object func;      // the function the entry was traced from, the residual's `func`
  py::object miss;
  // The published watch last seen and its C++ object (held, so that its address is not reused while remembered):
  // resolving it is a pybind11 type lookup, and it changes only when a full check publishes a new pair.
  mutable py::object seen_watch;
  mutable const StateWatch* seen_watch_ptr = nullptr;

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
    if (!global_state_check.is_none()) {
      PyObject* r = PyObject_CallNoArgs(global_state_check.ptr());
      if (r == nullptr) throw py::error_already_set();
      int holds = PyObject_IsTrue(r);
      Py_DECREF(r);
      if (holds < 0) throw py::error_already_set();
      if (!holds) return false;
    }
    if (check_saved_hooks && at::SavedTensorDefaultHooks::get_hooks(/*ignore_is_tracing=*/true).has_value()) return false;
    if (check_torch_function && at::impl::PythonTorchFunctionTLS::stack_len() != 0) return false;
    if (!device_dict.is_none()) {  // `torch.utils._device.CURRENT_DEVICE is None`, read from the module's globals
      static PyObject* const key = PyUnicode_InternFromString("CURRENT_DEVICE");
      PyObject* current = PyDict_GetItemWithError(device_dict.ptr(), key);  // borrowed
      if (current != Py_None) {
        if (current == nullptr) PyErr_Clear();  // gone from the module: the Python path decides
        return false;
      }
    }
    return true;
  }

  const StateWatch* publishedWatch(PyObject* watch) const {
    if (watch != seen_watch.ptr()) {
      seen_watch_ptr = asStateWatch(watch);
      seen_watch = py::reinterpret_borrow<py::object>(watch);
    }
    return seen_watch_ptr;
  }

  // Note [Objects that hold Python objects take part in GC] (gc.h). A cleared FastCall always misses.
  int traverse(visitproc visit, void* arg) const {
    Py_VISIT(published.ptr());
    for (const Arg& a : args) Py_VISIT(a.value.ptr());
    for (const py::object& w : class_watch_refs) Py_VISIT(w.ptr());
    Py_VISIT(global_state_check.ptr());
    Py_VISIT(device_dict.ptr());
    Py_VISIT(unflatten.ptr());
    Py_VISIT(residual.ptr());
    for (const py::object& k : kwnames) Py_VISIT(k.ptr());
    Py_VISIT(func.ptr());
    Py_VISIT(seen_watch.ptr());
    return 0;
  }
  void clear() {
    program.reset();
    published = py::list();
    args.clear();
    class_watches.clear();
    class_watch_refs.clear();
    global_state_check = py::none();
    device_dict = py::none();
    unflatten = py::none();
    residual = py::none();
    kwnames.clear();
    func = py::none();
    seen_watch_ptr = nullptr;
    seen_watch = py::object();
  }

  // The call's arguments flattened as the call key flattens them (positional, then keyword values in the call's
  // order), or an empty object when the keywords differ from this FastCall's (names, order, count).
  py::object flatten(const py::tuple& call_args, PyObject* kwargs) const {
    Py_ssize_t nkw = kwargs == nullptr ? 0 : PyDict_GET_SIZE(kwargs);
    if (nkw != static_cast<Py_ssize_t>(kwnames.size())) return py::object();
    if (nkw == 0) return call_args;
    size_t npos = call_args.size();
    py::tuple flat(npos + nkw);
    for (size_t i = 0; i < npos; ++i) flat[i] = call_args[i];
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
      PyObject* want = kwnames[i].ptr();
      // Interned names are one object; otherwise an exact str of the same characters (a str subclass's __eq__ may lie:
      // found by a helper, it matched any name)
      if (key != want && (!PyUnicode_CheckExact(key) || PyUnicode_Compare(key, want) != 0)) {
        if (PyErr_Occurred()) PyErr_Clear();
        return py::object();
      }
      flat[npos + i++] = py::reinterpret_borrow<py::object>(value);
    }
    return flat;
  }

  py::object call(const py::tuple& given_args, PyObject* kwargs = nullptr) const {
    if (!program || c10::GradMode::is_enabled()) return miss;
    py::object flat = flatten(given_args, kwargs);
    if (!flat) return miss;
    py::tuple call_args = py::reinterpret_borrow<py::tuple>(flat);
    if (call_args.size() != args.size()) return miss;
    for (size_t i = 0; i < args.size(); ++i) {
      PyObject* a = PyTuple_GET_ITEM(call_args.ptr(), i);
      const Arg& want = args[i];
      if (Py_TYPE(a) != want.type) return miss;
      if (want.value && !sameValue(a, want.value.ptr())) return miss;
    }
    for (const StateWatch* w : class_watches)
      if (!w->unchanged()) return miss;
    py::object pair = published[0];
    PyObject* p = pair.ptr();
    if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2 || !PyList_Check(PyTuple_GET_ITEM(p, 1))) return miss;
    const StateWatch* watch = publishedWatch(PyTuple_GET_ITEM(p, 0));
    if (watch == nullptr || !watch->unchanged() || !stateHolds()) return miss;
    py::list held = py::reinterpret_borrow<py::list>(PyTuple_GET_ITEM(p, 1));
    if (!residual.is_none()) {  // after the watch, as the generated fast form checks them
      PyObject* r = PyObject_CallFunctionObjArgs(residual.ptr(), call_args.ptr(), func.ptr(), held.ptr(), nullptr);
      if (r == nullptr) throw py::error_already_set();
      py::object got = py::reinterpret_steal<py::object>(r);
      if (!PyList_CheckExact(r)) return miss;  // None: a check failed
      held = py::reinterpret_borrow<py::list>(got);
    }
    py::object leaves = tryRunBound(*program, call_args, held);
    if (leaves.is_none()) return miss;
    if (unflatten.is_none()) return py::reinterpret_borrow<py::list>(leaves)[0];
    return unflatten(leaves);
  }
};


// Note [cache_compile's call enters C++ at once]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Even one Python frame between the caller and the FastCall costs ~18 us after a real step (the interpreter's own
// code and the frame's objects are evicted by the step's weights; bench/cache_call_cost.py). So CachedFunction
// (graphex/inference/cache_compile.py) derives from CachedCall, a type whose call slot is C++: a call tries the
// FastCall set on it (`_fast`), and anything else (no FastCall yet, a miss) calls the instance's Python
// `_call(*args, **kwargs)`, the path that decides everything and installs the next FastCall.
struct CachedCallObject {
  PyObject_HEAD
  PyObject* fast;           // the FastCall (a pybind11 instance), or nullptr
  const FastCall* fast_ptr;  // its C++ object, valid while `fast` is held
};

PyObject* cachedCallInvoke(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* c = reinterpret_cast<CachedCallObject*>(self);
  if (c->fast_ptr != nullptr) {
    PyObject* fast = c->fast;
    const FastCall* f = c->fast_ptr;
    Py_INCREF(fast);  // kept alive through the call, even if another thread replaces it while the engine runs
    try {
      py::object result = f->call(py::reinterpret_borrow<py::tuple>(args), kwargs);
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

PyTypeObject cachedCallType = callSlotType(
    "graphex._C.CachedCall", sizeof(CachedCallObject),
    "Note [cache_compile's call enters C++ at once] (csrc/python/cached_call.cpp): the base of CachedFunction.",
    callSlotDealloc<cachedCallClear>, cachedCallTraverse, cachedCallClear, cachedCallInvoke, cachedCallGetSet);


}  // namespace

void registerCachedCall(py::module_& m) {
  py::class_<FastCall>(m, "FastCall", "Note [A plain call's fast path is one C++ call] (csrc/python/cached_call.cpp)",
                       py::custom_type_setup(takesPartInGc<FastCall>))
      .def(py::init([](std::shared_ptr<BoundProgram> program, py::list published,
                       const std::vector<std::tuple<py::object, py::object, py::object>>& args,
                       py::object global_state_check, bool saved_hooks, bool torch_function, py::object device_module,
                       py::object unflatten, py::object residual, py::object func,
                       const std::vector<py::object>& kwnames, py::object miss) {
             FastCall f;
             f.program = std::move(program);
             f.published = std::move(published);
             f.global_state_check = std::move(global_state_check);
             f.check_saved_hooks = saved_hooks;
             f.check_torch_function = torch_function;
             f.device_dict = device_module.is_none() ? py::none() : py::object(device_module.attr("__dict__"));
             f.unflatten = std::move(unflatten);
             f.residual = std::move(residual);
             f.func = std::move(func);
             for (const py::object& k : kwnames) {
               if (!PyUnicode_Check(k.ptr())) throw py::type_error("graphex: FastCall: a keyword's name is not a str");
               PyObject* name = Py_NewRef(k.ptr());
               PyUnicode_InternInPlace(&name);
               f.kwnames.push_back(py::reinterpret_steal<py::object>(name));
             }
             f.miss = std::move(miss);
             for (const auto& [type, value, class_watch] : args) {
               if (!PyType_Check(type.ptr())) throw py::type_error("graphex: FastCall: an argument's type is not a type");
               // a tensor (None) is checked by its type alone; so is None itself, NoneType's one value
               f.args.push_back({reinterpret_cast<PyTypeObject*>(type.ptr()), value.is_none() ? py::object() : value});
               if (class_watch.is_none()) continue;
               const StateWatch* w = asStateWatch(class_watch);
               if (w == nullptr) throw py::type_error("graphex: FastCall: a class watch is not a StateWatch");
               if (std::find(f.class_watches.begin(), f.class_watches.end(), w) == f.class_watches.end()) {
                 f.class_watches.push_back(w);
                 f.class_watch_refs.push_back(class_watch);
               }
             }
             return f;
           }),
           py::arg("program"), py::arg("published"), py::arg("args"), py::arg("global_state_check"),
           py::arg("saved_hooks"), py::arg("torch_function"), py::arg("device_module"), py::arg("unflatten"),
           py::arg("residual"), py::arg("func"), py::arg("kwnames"), py::arg("miss"),
           "args: (type, value of a number or str or else None, class StateWatch or None) per flattened argument; "
           "global_state_check: a GlobalStateGuard's bound check, or None; saved_hooks / torch_function: whether no "
           "saved-tensors hooks / no torch function mode must be active; device_module: torch.utils._device when no "
           "default device must be set, or None; residual: the generated `rest(args, func, S)`, the checks C++ does "
           "not make and the held inputs, or None; kwnames: the keywords' names in the call's order (their values are "
           "the last args).")
      .def("__call__",
           [](const FastCall& f, const py::tuple& args, const py::dict& kwargs) { return f.call(args, kwargs.ptr()); },
           py::arg("args"), py::arg("kwargs") = py::dict(),
           "The call's result, or `miss` (nothing run) when anything differs from what the entry was proved for.");

  addCallSlotType(m, "CachedCall", cachedCallType);
}

}  // namespace graphex
