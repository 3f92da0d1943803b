// Note [A watched dict proves its guards still hold]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A cache entry's Dynamo guards (graphex/inference/guards.py) read hundreds of values per call
// on a real model: every submodule's type and hooks dicts, attributes, globals. Almost all of them
// are reached through dicts: an instance's __dict__, nn.Module's _modules / _parameters / hook
// dicts, a module's globals, a class's own dict. CPython gives every dict a version tag
// (PyDictObject.ma_version_tag, PEP 509: a new, globally unique value on every change to that
// dict), every object a type pointer and every function a code pointer. So once the full check
// has passed, the guards that read only through watched dicts (and check types of watched objects
// or code of watched functions) still hold exactly as long as every watched dict has the version
// it had then, every watched object the type and every watched function the code it had then.
// `unchanged()` compares those: a few nanoseconds per dict, no Python call. When it answers
// false, the caller runs the full generated check again and, if it passes, `snapshot()`s.
// Guards that read through anything else (a list, a closure cell, a function's defaults, a
// tensor's metadata, the global torch state) are checked on every call by Python
// (guards.py, GuardSet: the "always" records).
//
// Note [A watched dict must stay its object's dict]
// A dict's version says nothing about whether its object still uses it: `cfg.__dict__ = state` (the usual
// __setstate__) gives `cfg` a new dict and leaves the watched one as it was. So an instance dict is watched with
// its owner, and `unchanged()` also asks that each owner's __dict__ is still that dict (found by a helper: the
// replaced config's old value was replayed on every call).
//
// PEP 509's tag is deprecated from Python 3.12 (PEP 699) but still maintained through 3.13;
// `supported()` says whether this interpreter has it, and without it every call runs the full
// check (slower, never stale).
#include "python/state_watch.h"

#include "python/gc.h"

#include <Python.h>

#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

namespace py = pybind11;

namespace graphex {
namespace {

constexpr bool kHasDictVersion = PY_VERSION_HEX >= 0x030600F0 && PY_VERSION_HEX < 0x030E0000;

uint64_t dictVersion(PyObject* d) {
#if PY_VERSION_HEX < 0x030E0000
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")
  return reinterpret_cast<PyDictObject*>(d)->ma_version_tag;
  _Pragma("GCC diagnostic pop")
#else
  (void)d;
  return 0;
#endif
}

class StateWatch {
 public:
  // dicts: the dicts the watched guards read through; objects: the objects whose types they check;
  // functions: the Python functions whose code objects they check (`f.__code__ is C`); owners: (object, dict) pairs,
  // each object's own __dict__ a watched dict that must stay its __dict__ (Note [A watched dict must stay its
  // object's dict]).
  StateWatch(const std::vector<py::object>& dicts, const std::vector<py::object>& objects,
             const std::vector<py::object>& functions, const std::vector<std::pair<py::object, py::object>>& owners) {
    for (const auto& [owner, dict] : owners) {
      if (!PyDict_Check(dict.ptr())) throw py::type_error("graphex: StateWatch: an owner's __dict__ must be a dict");
      owners_.push_back(owner);
      owned_.push_back(dict);
    }
    for (const py::object& f : functions) {
      if (!PyFunction_Check(f.ptr())) throw py::type_error("graphex: StateWatch watches Python functions' code");
      functions_.push_back(f);
    }
    codes_.resize(functions_.size());
    for (const py::object& d : dicts) {
      if (!PyDict_Check(d.ptr())) throw py::type_error("graphex: StateWatch watches dicts only");
      dicts_.push_back(d);
    }
    objects_ = objects;
    versions_.resize(dicts_.size());
    types_.resize(objects_.size());
    valid_ = false;
  }

  bool unchanged() const {
    if (!valid_) return false;
    for (size_t i = 0; i < dicts_.size(); ++i)
      if (dictVersion(dicts_[i].ptr()) != versions_[i]) return false;
    for (size_t i = 0; i < objects_.size(); ++i)
      if (Py_TYPE(objects_[i].ptr()) != types_[i]) return false;
    for (size_t i = 0; i < functions_.size(); ++i)
      if (PyFunction_GET_CODE(functions_[i].ptr()) != codes_[i]) return false;
    for (size_t i = 0; i < owners_.size(); ++i) {
      // Note [A watched dict must stay its object's dict]: `obj.__dict__ = other` (a __setstate__ idiom) leaves the
      // watched dict unchanged, and its version with it; so the object must still own that very dict.
      PyObject* now = PyObject_GenericGetDict(owners_[i].ptr(), nullptr);
      if (now == nullptr) {
        PyErr_Clear();
        return false;
      }
      bool same = now == owned_[i].ptr();
      Py_DECREF(now);
      if (!same) return false;
    }
    return true;
  }

  void snapshot() {
    for (size_t i = 0; i < dicts_.size(); ++i) versions_[i] = dictVersion(dicts_[i].ptr());
    for (size_t i = 0; i < objects_.size(); ++i) types_[i] = Py_TYPE(objects_[i].ptr());
    for (size_t i = 0; i < functions_.size(); ++i) codes_[i] = PyFunction_GET_CODE(functions_[i].ptr());
    valid_ = kHasDictVersion;
  }

  void invalidate() { valid_ = false; }

  // Note [Objects that hold Python objects take part in GC]: what it holds, for tp_traverse / tp_clear. A cleared
  // watch holds nothing and never answers unchanged.
  int traverse(visitproc visit, void* arg) const {
    for (const py::object& o : dicts_) Py_VISIT(o.ptr());
    for (const py::object& o : objects_) Py_VISIT(o.ptr());
    for (const py::object& o : functions_) Py_VISIT(o.ptr());
    for (const py::object& o : owners_) Py_VISIT(o.ptr());
    for (const py::object& o : owned_) Py_VISIT(o.ptr());
    return 0;
  }
  void clear() {
    valid_ = false;
    dicts_.clear();
    versions_.clear();
    objects_.clear();
    types_.clear();
    functions_.clear();
    codes_.clear();
    owners_.clear();
    owned_.clear();
  }
  size_t numDicts() const { return dicts_.size(); }
  size_t numObjects() const { return objects_.size(); }

 private:
  std::vector<py::object> dicts_;
  std::vector<uint64_t> versions_;
  std::vector<py::object> objects_;
  std::vector<PyTypeObject*> types_;
  std::vector<py::object> functions_;
  std::vector<PyObject*> codes_;  // borrowed: compared by address only, never dereferenced
  std::vector<py::object> owners_, owned_;  // owners_[i].__dict__ must be owned_[i]
  bool valid_;
};

}  // namespace

bool stateWatchUnchanged(py::handle watch) {
  // A StateWatch is only ever created by registerStateWatch's class; anything else (None before a first check) fails.
  if (!py::isinstance<StateWatch>(watch)) return false;
  return watch.cast<const StateWatch&>().unchanged();
}

void registerStateWatch(py::module_& m) {
  py::class_<StateWatch>(m, "StateWatch",
                         "Note [A watched dict proves its guards still hold] (csrc/python/state_watch.cpp)",
                         py::custom_type_setup(takesPartInGc<StateWatch>))
      .def(py::init<const std::vector<py::object>&, const std::vector<py::object>&, const std::vector<py::object>&,
                    const std::vector<std::pair<py::object, py::object>>&>(),
           py::arg("dicts"), py::arg("objects"), py::arg("functions") = std::vector<py::object>{},
           py::arg("owners") = std::vector<std::pair<py::object, py::object>>{})
      .def("unchanged", &StateWatch::unchanged)
      .def("snapshot", &StateWatch::snapshot)
      .def("invalidate", &StateWatch::invalidate)
      .def_property_readonly("num_dicts", &StateWatch::numDicts)
      .def_property_readonly("num_objects", &StateWatch::numObjects)
      .def_static("supported", [] { return kHasDictVersion; });
}

}  // namespace graphex
