// Python's cycle collector and the pybind11 types that hold Python objects.
#pragma once

#include <pybind11/pybind11.h>

namespace graphex {

// Note [Objects that hold Python objects take part in GC]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A StateWatch holds the module's dicts and objects; a FastCall holds the watch; cache_compile's CachedFunction
// holds the FastCall, and the module holds the CachedFunction. A pybind11 instance is invisible to Python's cycle
// collector unless its type traverses what it holds, so that cycle made every module with a cache_compile'd
// method immortal (its parameters never freed after `del model`). Each such type gets tp_traverse / tp_clear
// from its own `traverse` and `clear` (pybind11's custom_type_setup, as its documentation shows).
template <typename T>
void takesPartInGc(PyHeapTypeObject* heap_type) {
  PyTypeObject* type = &heap_type->ht_type;
  type->tp_flags |= Py_TPFLAGS_HAVE_GC;
  type->tp_traverse = [](PyObject* self, visitproc visit, void* arg) -> int {
    Py_VISIT(Py_TYPE(self));  // a heap type's instances own a reference to it
    if (!pybind11::detail::is_holder_constructed(self)) return 0;
    return pybind11::cast<const T&>(pybind11::handle(self)).traverse(visit, arg);
  };
  type->tp_clear = [](PyObject* self) -> int {
    if (pybind11::detail::is_holder_constructed(self)) pybind11::cast<T&>(pybind11::handle(self)).clear();
    return 0;
  };
}

}  // namespace graphex
