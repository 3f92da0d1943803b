// graphex._C.StateWatch: a cheap per-call proof that the Python state a cache entry's guards read is untouched
// (Note [A watched dict proves its guards still hold], state_watch.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace graphex {

class StateWatch {
 public:
  // dicts: the dicts the watched guards read through; objects: the objects whose types they check;
  // functions: the Python functions whose code objects they check (`f.__code__ is C`); owners: (object, dict) pairs,
  // each object's own __dict__ a watched dict that must stay its __dict__ (Note [A watched dict must stay its
  // object's dict]); slots: (object, SlotKind) pairs, a pointer each object holds that must stay the object it was
  // (Note [A slot or a list is watched by what it points to]); lists: lists whose items must stay the same objects.
  StateWatch(const std::vector<pybind11::object>& dicts, const std::vector<pybind11::object>& objects,
             const std::vector<pybind11::object>& functions,
             const std::vector<std::pair<pybind11::object, pybind11::object>>& owners,
             const std::vector<std::pair<pybind11::object, int>>& slots = {},
             const std::vector<pybind11::object>& lists = {}, const std::vector<pybind11::object>& counters = {});

  // The pointers an object holds that a slot watch compares (Note [A slot or a list is watched by what it points
  // to]); the numbers are graphex/inference/state_watch.py's SLOT_KINDS.
  enum SlotKind : int {
    kCellContents = 0,   // a cell's contents (`cell.cell_contents`)
    kFuncDefaults = 1,   // a function's `__defaults__` tuple
    kFuncKwDefaults = 2, // a function's `__kwdefaults__` dict
    kFuncName = 3,       // a function's `__name__`
    kFuncQualname = 4,   // a function's `__qualname__`
    kTypeMro = 5,        // a class's `__mro__` tuple
    kTypeName = 6,       // a heap class's `__name__`
    kTypeQualname = 7,   // a heap class's `__qualname__`
    kPropertyGet = 8,    // a property's `fget` (`property.__init__` called again on a live property replaces it)
    kPropertySet = 9,    // a property's `fset`
    kPropertyDel = 10,   // a property's `fdel`
    kClassMethodFunc = 11,   // a classmethod's function (`classmethod.__init__` called again replaces it)
    kStaticMethodFunc = 12,  // a staticmethod's function (the same)
    kNumSlotKinds = 13,
  };

  // Whether everything watched is as it was at the last snapshot(); false before the first and after invalidate().
  bool unchanged() const;
  void snapshot();
  void invalidate() { valid_ = false; }

  // Note [Objects that hold Python objects take part in GC] (gc.h): what it holds, for tp_traverse / tp_clear. A
  // cleared watch holds nothing and never answers unchanged.
  int traverse(visitproc visit, void* arg) const;
  void clear();
  size_t numDicts() const { return dicts_.size(); }
  size_t numObjects() const { return objects_.size(); }
  size_t numSlots() const { return slots_.size(); }
  size_t numFunctions() const { return functions_.size(); }
  size_t numLists() const { return lists_.size(); }

 private:
  // Each watched thing beside the value it had: one sequential array per kind, read once per call. The pointers are
  // borrowed from held_, which owns one reference to each.
  struct Dict {
    PyObject* dict;
    uint64_t version;
  };
  struct Object {
    PyObject* object;
    PyTypeObject* type;
  };
  struct Function {
    PyObject* function;
    PyObject* code;  // compared by address only, never dereferenced
  };
  struct Owner {
    PyObject* owner;
    PyObject* dict;  // owner.__dict__ must be this very dict
  };
  std::vector<Dict> dicts_;
  std::vector<Object> objects_;
  std::vector<Function> functions_;
  struct Slot {
    PyObject* object;
    SlotKind kind;
    PyObject* value;  // compared by address; held in snapshot_held_, so that no other object takes its address
  };
  struct List {
    PyObject* list;
    size_t first;  // its items at the snapshot: items_[first, first + size)
    Py_ssize_t size;
  };
  struct Counter {
    PyObject* read;   // a builtin that returns an int (`abc.get_cache_token`): Note [A counter is watched by its value]
    long long value;
  };
  std::vector<Owner> owners_;
  std::vector<Counter> counters_;
  std::vector<Slot> slots_;
  std::vector<List> lists_;
  std::vector<PyObject*> items_;
  std::vector<pybind11::object> held_;
  std::vector<pybind11::object> snapshot_held_;  // the slots' values and the lists' items of the last snapshot
  bool valid_ = false;
};

void registerStateWatch(pybind11::module_& m);
// The StateWatch `watch` is (a graphex._C.StateWatch), or nullptr for any other object (None before a first check).
// Valid while `watch` is alive.
const StateWatch* asStateWatch(pybind11::handle watch);

}  // namespace graphex
