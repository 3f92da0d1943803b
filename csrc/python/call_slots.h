// graphex._C's call slots: what a call of a cache_compile'd function (cached_call.cpp), of a compiled graph
// (runner_call.cpp) and of what the backend hands Dynamo (direct_call.cpp) runs before the engine, in C++ with no
// Python frame of ours. This header holds what the three share: the static type they are built from.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

namespace graphex {

// A static type that Python classes derive from (CachedFunction, CompiledGraph) or that is handed out as it is
// (DirectCall): a C call slot, properties, and GC through what the instance holds (Note [Objects that hold Python
// objects take part in GC], gc.h). Static rather than a pybind11 class: pybind11's dispatcher (overload resolution,
// argument casters) is the per-call work these types exist to remove.
PyTypeObject callSlotType(const char* name, Py_ssize_t size, const char* doc, destructor dealloc,
                          traverseproc traverse, inquiry clear, ternaryfunc call, PyGetSetDef* getset);

// Such a type's tp_dealloc: untrack, `Clear` (its tp_clear, which drops what the instance holds), free.
template <inquiry Clear>
void callSlotDealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  Clear(self);
  Py_TYPE(self)->tp_free(self);
}

// PyType_Ready(type), then `m.<name> = type`.
void addCallSlotType(pybind11::module_& m, const char* name, PyTypeObject& type);

void registerCachedCall(pybind11::module_& m);  // FastCall, CachedCall (cached_call.cpp)
void registerRunnerCall(pybind11::module_& m);  // RunnerCall (runner_call.cpp)
void registerDirectCall(pybind11::module_& m);  // DirectCall (direct_call.cpp)
void registerCallSlots(pybind11::module_& m);   // all three

}  // namespace graphex
