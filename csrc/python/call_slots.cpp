// The static type graphex._C's call slots are built from (call_slots.h), and their registration.
#include "python/call_slots.h"

namespace py = pybind11;

namespace graphex {

PyTypeObject callSlotType(const char* name, Py_ssize_t size, const char* doc, destructor dealloc,
                          traverseproc traverse, inquiry clear, ternaryfunc call, PyGetSetDef* getset) {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = name;
  t.tp_basicsize = size;
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  t.tp_doc = doc;
  t.tp_new = PyType_GenericNew;
  t.tp_dealloc = dealloc;
  t.tp_traverse = traverse;
  t.tp_clear = clear;
  t.tp_call = call;
  t.tp_getset = getset;
  return t;
}

void addCallSlotType(py::module_& m, const char* name, PyTypeObject& type) {
  if (PyType_Ready(&type) < 0) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&type)));
}

void registerCallSlots(py::module_& m) {
  registerRunnerCall(m);
  registerDirectCall(m);
  registerCachedCall(m);
}

}  // namespace graphex
