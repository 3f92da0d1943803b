// What the backend hands Dynamo for a plain inference graph (graphex/compile.py): DirectCall.
#include "python/call_slots.h"

#include <c10/core/GradMode.h>

namespace py = pybind11;

namespace graphex {
namespace {

// Note [A plain inference graph skips AOTAutograd's wrapper]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Dynamo calls what the backend returned once per step. For an inference graph that is AOTAutograd's runtime
// wrapper: Python code (its generated `_runtime_wrapper`, aot_module_simplified's `forward`) that applies input
// mutations the graph left out, regenerates outputs that alias inputs, dedupes arguments, turns grad mode off, and
// bumps the version counters of inputs the graph mutates. After a real step that Python runs on evicted memory:
// 24-52 us on the shipped decoder (bench/per_call.py, "AOTAutograd wrapper"). When AOTAutograd compiled its
// inference graph (not a training forward: grad re-enabled inside a no_grad graph picks that path), the graph takes
// and returns Dynamo's values one to one (no tensor subclass unwrapped, no argument deduped) and AOTAutograd's own
// metadata says all but the last two jobs are no-ops (graphex/compile.py, graphex/compat/aot.py: the
// ViewAndMutationMeta it hands the compiler), the backend returns a DirectCall instead, which does exactly those two
// in C++:
//   * the inputs whose mutation the graph performs (AOTAutograd's mutated_graph_handled_indices_seen_by_autograd)
//     get their version counters bumped first, by torch's own function (torch._C._increment_version), as the
//     wrapper does;
//   * the graph runs with grad mode off, as an inference graph runs under AOTAutograd;
// and returns the graph's outputs as the list the wrapper would have returned (no output aliases an input or an
// intermediate, no mutation is left to apply: the metadata proved it). The first call, and any call with keywords,
// goes through AOTAutograd's callable itself, so its first-call checks (custom ops' aliasing) still run once.
struct DirectCallObject {
  PyObject_HEAD
  PyObject* graph;    // the CompiledGraph: called with one list, returns the outputs
  PyObject* aot;      // AOTAutograd's callable for the same graph
  PyObject* bump;     // torch._C._increment_version, or nullptr when the graph mutates no input
  PyObject* mutated;  // a tuple of the argument positions whose version counters are bumped, or nullptr
  int first;          // the next call is the first
};

PyObject* directCallInvoke(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* d = reinterpret_cast<DirectCallObject*>(self);
  if (d->graph == nullptr || d->aot == nullptr) {
    PyErr_SetString(PyExc_TypeError, "graphex: this DirectCall was never initialized");
    return nullptr;
  }
  if (d->first || (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0)) {
    d->first = 0;
    return PyObject_Call(d->aot, args, kwargs);
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (d->bump != nullptr) {
    const Py_ssize_t m = PyTuple_GET_SIZE(d->mutated);
    PyObject* tensors = PyTuple_New(m);
    if (tensors == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < m; ++i) {
      Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(d->mutated, i));
      if (at < 0 || at >= n) {
        Py_DECREF(tensors);
        if (!PyErr_Occurred())
          PyErr_Format(PyExc_TypeError, "graphex: the compiled graph takes more than %zd arguments", n);
        return nullptr;
      }
      PyTuple_SET_ITEM(tensors, i, Py_NewRef(PyTuple_GET_ITEM(args, at)));
    }
    PyObject* bumped = PyObject_CallOneArg(d->bump, tensors);
    Py_DECREF(tensors);
    if (bumped == nullptr) return nullptr;
    Py_DECREF(bumped);
  }
  PyObject* list = PyList_New(n);
  if (list == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) PyList_SET_ITEM(list, i, Py_NewRef(PyTuple_GET_ITEM(args, i)));
  PyObject* out;
  {
    c10::AutoGradMode no_grad(false);  // restored on the way out, error or not
    out = PyObject_CallOneArg(d->graph, list);
  }
  Py_DECREF(list);
  if (out == nullptr || PyList_CheckExact(out)) return out;
  PyObject* as_list;  // as the wrapper normalizes what the compiled graph returned
  if (PyTuple_Check(out)) {
    as_list = PySequence_List(out);
  } else {
    as_list = PyList_New(1);
    if (as_list != nullptr) PyList_SET_ITEM(as_list, 0, Py_NewRef(out));
  }
  Py_DECREF(out);
  return as_list;
}

int directCallInit(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"graph", "aot", "mutated", "bump", nullptr};
  PyObject *graph, *aot, *mutated, *bump;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O", const_cast<char**>(names), &graph, &aot, &PyTuple_Type,
                                   &mutated, &bump))
    return -1;
  if (!PyCallable_Check(graph) || !PyCallable_Check(aot) || !PyCallable_Check(bump)) {
    PyErr_SetString(PyExc_TypeError, "graphex: DirectCall(graph, aot, mutated, bump) takes three callables");
    return -1;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mutated); ++i)
    if (!PyLong_Check(PyTuple_GET_ITEM(mutated, i))) {
      PyErr_SetString(PyExc_TypeError, "graphex: DirectCall's mutated positions must be ints");
      return -1;
    }
  auto* d = reinterpret_cast<DirectCallObject*>(self);
  Py_XSETREF(d->graph, Py_NewRef(graph));
  Py_XSETREF(d->aot, Py_NewRef(aot));
  bool mutates = PyTuple_GET_SIZE(mutated) != 0;
  Py_XSETREF(d->mutated, mutates ? Py_NewRef(mutated) : nullptr);
  Py_XSETREF(d->bump, mutates ? Py_NewRef(bump) : nullptr);
  d->first = 1;
  return 0;
}

int directCallTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* d = reinterpret_cast<DirectCallObject*>(self);
  Py_VISIT(d->graph);
  Py_VISIT(d->aot);
  Py_VISIT(d->bump);
  Py_VISIT(d->mutated);
  return 0;
}

int directCallClear(PyObject* self) {
  auto* d = reinterpret_cast<DirectCallObject*>(self);
  Py_CLEAR(d->graph);
  Py_CLEAR(d->aot);
  Py_CLEAR(d->bump);
  Py_CLEAR(d->mutated);
  return 0;
}

PyObject* directCallGetGraph(PyObject* self, void*) {
  PyObject* graph = reinterpret_cast<DirectCallObject*>(self)->graph;
  return Py_NewRef(graph != nullptr ? graph : Py_None);
}

PyObject* directCallGetAot(PyObject* self, void*) {
  PyObject* aot = reinterpret_cast<DirectCallObject*>(self)->aot;
  return Py_NewRef(aot != nullptr ? aot : Py_None);
}

PyGetSetDef directCallGetSet[] = {
    {"graph", directCallGetGraph, nullptr, "The compiled graph a call runs.", nullptr},
    {"aot", directCallGetAot, nullptr, "AOTAutograd's callable: the first call, and calls with keywords.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject makeDirectCallType() {
  PyTypeObject t = callSlotType(
      "graphex._C.DirectCall", sizeof(DirectCallObject),
      "DirectCall(graph, aot, mutated, bump): Note [A plain inference graph skips AOTAutograd's wrapper] "
      "(csrc/python/direct_call.cpp).",
      callSlotDealloc<directCallClear>, directCallTraverse, directCallClear, directCallInvoke, directCallGetSet);
  t.tp_flags &= ~Py_TPFLAGS_BASETYPE;
  t.tp_init = directCallInit;
  return t;
}

PyTypeObject directCallType = makeDirectCallType();


}  // namespace

void registerDirectCall(py::module_& m) { addCallSlotType(m, "DirectCall", directCallType); }

}  // namespace graphex
