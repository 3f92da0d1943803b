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
// Guards that read through anything else (a tensor's metadata, the global torch state, a property) are
// checked on every call by Python (guards.py, GuardSet: the "always" records).
//
// Note [A slot or a list is watched by what it points to]
// Some state a guard reads through has no version tag but is one pointer the object holds: a
// closure cell's contents, a function's `__defaults__` / `__kwdefaults__` / `__name__` /
// `__qualname__`, a class's `__mro__` (a new tuple when `__bases__` is assigned), a heap class's
// `__name__` / `__qualname__`, a property's `fget` / `fset` / `fdel` (`property.__init__` called again on a
// live property replaces them: found by a helper) and a classmethod's or staticmethod's function (the same with
// `classmethod.__init__`); and a list is its size and its item pointers. Each is read straight
// from the object (no Python call) and compared by address with what it held at the snapshot; the
// snapshot holds a reference to every such value, so no other object can be allocated at that
// address while it is remembered (an address compared after its object was freed could match a new
// object). The value itself is then the very object the full check read: a guard on it (its type,
// an immutable constant's value, a tuple's length) holds while the pointer does. A mutable value (a
// kwdefaults dict, a list's item) is watched on its own (pins.py).
//
// Note [A watched dict must stay its object's dict]
// A dict's version says nothing about whether its object still uses it: `cfg.__dict__ = state` (the usual
// __setstate__) gives `cfg` a new dict and leaves the watched one as it was. So an instance dict is watched with
// its owner, and `unchanged()` also asks that each owner's __dict__ is still that dict (found by a helper: the
// replaced config's old value was replayed on every call).
//
// Note [A counter is watched by its value]
// Some state has neither a version tag nor one pointer to compare, only a counter its module bumps on every change:
// `abc.get_cache_token()` changes whenever any class is registered with any ABC (`Base.register(T)` makes
// `isinstance(t, Base)` true, and no dict changes). Such a counter is a builtin StateWatch calls (C, no Python frame)
// and compares by value.
//
// PEP 509's tag is deprecated from Python 3.12 (PEP 699) but still maintained through 3.13;
// `supported()` says whether this interpreter has it, and without it every call runs the full
// check (slower, never stale).
#include "python/state_watch.h"

#include "python/gc.h"

#include <Python.h>

#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <string>
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

// The head of CPython's propertyobject (Objects/descrobject.c, not in the headers): its three functions come first
// after the object header in every CPython 3 (the fields after them differ between versions and are not read).
struct PropertyHead {
  PyObject_HEAD
  PyObject* prop_get;
  PyObject* prop_set;
  PyObject* prop_del;
};

// The head of CPython's classmethod and staticmethod objects (Objects/funcobject.c, not in the headers): the wrapped
// callable comes first after the object header (`cm_callable`, `sm_callable`) in every CPython 3.
struct MethodWrapperHead {
  PyObject_HEAD
  PyObject* callable;
};

// What `object` holds for one slot kind (borrowed, may be null: a function with no defaults), read as the attribute's
// getter reads it (the getter returns this very object, or None for null).
PyObject* slotValue(PyObject* object, StateWatch::SlotKind kind) {
  switch (kind) {
    case StateWatch::kCellContents: return PyCell_GET(object);
    case StateWatch::kFuncDefaults: return PyFunction_GET_DEFAULTS(object);
    case StateWatch::kFuncKwDefaults: return PyFunction_GET_KW_DEFAULTS(object);
    case StateWatch::kFuncName: return reinterpret_cast<PyFunctionObject*>(object)->func_name;
    case StateWatch::kFuncQualname: return reinterpret_cast<PyFunctionObject*>(object)->func_qualname;
    case StateWatch::kTypeMro: return reinterpret_cast<PyTypeObject*>(object)->tp_mro;
    case StateWatch::kTypeName: return reinterpret_cast<PyHeapTypeObject*>(object)->ht_name;
    case StateWatch::kTypeQualname: return reinterpret_cast<PyHeapTypeObject*>(object)->ht_qualname;
    case StateWatch::kPropertyGet: return reinterpret_cast<PropertyHead*>(object)->prop_get;
    case StateWatch::kPropertySet: return reinterpret_cast<PropertyHead*>(object)->prop_set;
    case StateWatch::kPropertyDel: return reinterpret_cast<PropertyHead*>(object)->prop_del;
    case StateWatch::kClassMethodFunc:
    case StateWatch::kStaticMethodFunc: return reinterpret_cast<MethodWrapperHead*>(object)->callable;
    case StateWatch::kNumSlotKinds: break;
  }
  return nullptr;
}

// Whether `object` is of the kind a slot kind reads (checked once, at construction: slotValue casts).
bool slotFits(PyObject* object, int kind) {
  switch (kind) {
    case StateWatch::kCellContents: return PyCell_Check(object);
    case StateWatch::kFuncDefaults:
    case StateWatch::kFuncKwDefaults:
    case StateWatch::kFuncName:
    case StateWatch::kFuncQualname: return PyFunction_Check(object);
    case StateWatch::kTypeMro: return PyType_Check(object);
    case StateWatch::kTypeName:
    case StateWatch::kTypeQualname:
      return PyType_Check(object) && PyType_HasFeature(reinterpret_cast<PyTypeObject*>(object), Py_TPFLAGS_HEAPTYPE);
    case StateWatch::kPropertyGet:
    case StateWatch::kPropertySet:
    // a subclass's instance begins with its base's layout (CPython lays a subclass's fields after its base's)
    case StateWatch::kPropertyDel: return PyObject_TypeCheck(object, &PyProperty_Type);
    case StateWatch::kClassMethodFunc: return PyObject_TypeCheck(object, &PyClassMethod_Type);
    case StateWatch::kStaticMethodFunc: return PyObject_TypeCheck(object, &PyStaticMethod_Type);
    default: return false;
  }
}

// A counter's value now (Note [A counter is watched by its value]); -2 when reading it failed (never a snapshot's).
long long readCounter(PyObject* read) {
  PyObject* r = PyObject_CallNoArgs(read);
  if (r == nullptr) {
    PyErr_Clear();
    return -2;
  }
  long long v = PyLong_Check(r) ? PyLong_AsLongLong(r) : -2;
  Py_DECREF(r);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return -2;
  }
  return v;
}

}  // namespace

StateWatch::StateWatch(const std::vector<py::object>& dicts, const std::vector<py::object>& objects,
                       const std::vector<py::object>& functions,
                       const std::vector<std::pair<py::object, py::object>>& owners,
                       const std::vector<std::pair<py::object, int>>& slots, const std::vector<py::object>& lists,
                       const std::vector<py::object>& counters) {
  for (const py::object& c : counters) {
    if (!PyCFunction_Check(c.ptr()))
      throw py::type_error("graphex: StateWatch: a counter is read by a builtin function");
    held_.push_back(c);
    counters_.push_back({c.ptr(), -1});
  }
  for (const auto& [object, kind] : slots) {
    if (!slotFits(object.ptr(), kind))
      throw py::type_error("graphex: StateWatch: slot kind " + std::to_string(kind) + " does not read a " +
                           std::string(Py_TYPE(object.ptr())->tp_name));
    held_.push_back(object);
    slots_.push_back({object.ptr(), static_cast<SlotKind>(kind), nullptr});
  }
  for (const py::object& l : lists) {
    if (!PyList_CheckExact(l.ptr())) throw py::type_error("graphex: StateWatch watches lists of exactly type list");
    held_.push_back(l);
    lists_.push_back({l.ptr(), 0, -1});
  }
  for (const auto& [owner, dict] : owners) {
    if (!PyDict_Check(dict.ptr())) throw py::type_error("graphex: StateWatch: an owner's __dict__ must be a dict");
    held_.push_back(owner);
    held_.push_back(dict);
    owners_.push_back({owner.ptr(), dict.ptr()});
  }
  for (const py::object& f : functions) {
    if (!PyFunction_Check(f.ptr())) throw py::type_error("graphex: StateWatch watches Python functions' code");
    held_.push_back(f);
    functions_.push_back({f.ptr(), nullptr});
  }
  for (const py::object& d : dicts) {
    if (!PyDict_Check(d.ptr())) throw py::type_error("graphex: StateWatch watches dicts only");
    held_.push_back(d);
    dicts_.push_back({d.ptr(), 0});
  }
  for (const py::object& o : objects) {
    // An object of an immutable type (a dict, an OrderedDict, a tuple) keeps that type: CPython refuses `__class__`
    // assignment to or from such a type (ModuleType's subclasses excepted), so there is nothing to compare per call.
    if (PyType_HasFeature(Py_TYPE(o.ptr()), Py_TPFLAGS_IMMUTABLETYPE) && !PyModule_Check(o.ptr())) continue;
    held_.push_back(o);
    objects_.push_back({o.ptr(), nullptr});
  }
}

bool StateWatch::unchanged() const {
  if (!valid_) return false;
  // After a real step the watched objects are out of the CPU's caches (bench/cache_call_cost.py): ask for all of them
  // at once, so that their misses overlap instead of each waiting for the one before.
  for (const Dict& d : dicts_) __builtin_prefetch(d.dict);
  for (const Object& o : objects_) __builtin_prefetch(o.object);
  for (const Function& f : functions_)  // the code pointer's own line: an object may start late in a line
    __builtin_prefetch(&reinterpret_cast<PyFunctionObject*>(f.function)->func_code);
  for (const Owner& o : owners_) __builtin_prefetch(o.owner);
  for (const Slot& s : slots_) __builtin_prefetch(s.object);
  for (const List& l : lists_) __builtin_prefetch(l.list);
  for (const Dict& d : dicts_)
    if (dictVersion(d.dict) != d.version) return false;
  for (const Object& o : objects_)
    if (Py_TYPE(o.object) != o.type) return false;
  for (const Function& f : functions_)
    if (PyFunction_GET_CODE(f.function) != f.code) return false;
  for (const Owner& o : owners_) {
    // Note [A watched dict must stay its object's dict]: `obj.__dict__ = other` (a __setstate__ idiom) leaves the
    // watched dict unchanged, and its version with it; so the object must still own that very dict. Read through
    // the object's dict slot (no reference taken: nothing is written per call).
    PyObject** slot = _PyObject_GetDictPtr(o.owner);
    if (slot == nullptr) {
      PyErr_Clear();  // a failure to materialize the dict leaves an error set
      return false;
    }
    if (*slot != o.dict) return false;
  }
  // Note [A slot or a list is watched by what it points to]
  for (const Slot& s : slots_)
    if (slotValue(s.object, s.kind) != s.value) return false;
  for (const List& l : lists_) {
    if (PyList_GET_SIZE(l.list) != l.size) return false;
    PyObject** items = reinterpret_cast<PyListObject*>(l.list)->ob_item;
    if (l.size > 0 && std::memcmp(items, items_.data() + l.first, sizeof(PyObject*) * l.size) != 0) return false;
  }
  for (const Counter& c : counters_)  // Note [A counter is watched by its value]
    if (readCounter(c.read) != c.value) return false;
  return true;
}

void StateWatch::snapshot() {
  for (Counter& c : counters_) c.value = readCounter(c.read);
  for (Dict& d : dicts_) d.version = dictVersion(d.dict);
  for (Object& o : objects_) o.type = Py_TYPE(o.object);
  for (Function& f : functions_) f.code = PyFunction_GET_CODE(f.function);
  // Note [A slot or a list is watched by what it points to]: each value held until the next snapshot.
  std::vector<py::object> held;
  for (Slot& s : slots_) {
    s.value = slotValue(s.object, s.kind);
    if (s.value != nullptr) held.push_back(py::reinterpret_borrow<py::object>(s.value));
  }
  items_.clear();
  for (List& l : lists_) {
    l.first = items_.size();
    l.size = PyList_GET_SIZE(l.list);
    for (Py_ssize_t i = 0; i < l.size; ++i) {
      PyObject* item = PyList_GET_ITEM(l.list, i);
      items_.push_back(item);
      held.push_back(py::reinterpret_borrow<py::object>(item));
    }
  }
  snapshot_held_.swap(held);  // the old values are released last, after nothing points to them
  valid_ = kHasDictVersion;
}

int StateWatch::traverse(visitproc visit, void* arg) const {
  for (const py::object& o : held_) Py_VISIT(o.ptr());
  for (const py::object& o : snapshot_held_) Py_VISIT(o.ptr());
  return 0;
}

void StateWatch::clear() {
  valid_ = false;
  dicts_.clear();
  objects_.clear();
  functions_.clear();
  owners_.clear();
  counters_.clear();
  slots_.clear();
  lists_.clear();
  items_.clear();
  snapshot_held_.clear();
  held_.clear();  // last: the raw pointers above are borrowed from these
}

const StateWatch* asStateWatch(py::handle watch) {
  // A StateWatch is only ever created by registerStateWatch's class; anything else (None before a first check) is not.
  if (!py::isinstance<StateWatch>(watch)) return nullptr;
  return &watch.cast<const StateWatch&>();
}

void registerStateWatch(py::module_& m) {
  py::class_<StateWatch>(m, "StateWatch",
                         "Note [A watched dict proves its guards still hold] (csrc/python/state_watch.cpp)",
                         py::custom_type_setup(takesPartInGc<StateWatch>))
      .def(py::init<const std::vector<py::object>&, const std::vector<py::object>&, const std::vector<py::object>&,
                    const std::vector<std::pair<py::object, py::object>>&,
                    const std::vector<std::pair<py::object, int>>&, const std::vector<py::object>&,
                    const std::vector<py::object>&>(),
           py::arg("dicts"), py::arg("objects"), py::arg("functions") = std::vector<py::object>{},
           py::arg("owners") = std::vector<std::pair<py::object, py::object>>{},
           py::arg("slots") = std::vector<std::pair<py::object, int>>{},
           py::arg("lists") = std::vector<py::object>{}, py::arg("counters") = std::vector<py::object>{})
      .def("unchanged", &StateWatch::unchanged)
      .def("snapshot", &StateWatch::snapshot)
      .def("invalidate", &StateWatch::invalidate)
      .def_property_readonly("num_dicts", [](const StateWatch& w) { return w.numDicts(); })
      .def_property_readonly("num_objects", [](const StateWatch& w) { return w.numObjects(); })
      .def_property_readonly("num_slots", [](const StateWatch& w) { return w.numSlots(); })
      .def_property_readonly("num_functions", [](const StateWatch& w) { return w.numFunctions(); })
      .def_property_readonly("num_lists", [](const StateWatch& w) { return w.numLists(); })
      .def_static("supported", [] { return kHasDictVersion; });
}

}  // namespace graphex
