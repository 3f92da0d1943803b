// A compiled graph's call (graphex/runtime/compiled_graph.py): RunnerCall, the C type CompiledGraph derives from.
#include "python/call_slots.h"

namespace py = pybind11;

namespace graphex {
namespace {

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

PyTypeObject runnerCallType = callSlotType(
    "graphex._C.RunnerCall", sizeof(RunnerCallObject),
    "Note [A compiled graph's call enters its runner at once] (csrc/python/runner_call.cpp): the base of "
    "CompiledGraph.",
    callSlotDealloc<runnerCallClear>, runnerCallTraverse, runnerCallClear, runnerCallInvoke, runnerCallGetSet);


}  // namespace

void registerRunnerCall(py::module_& m) { addCallSlotType(m, "RunnerCall", runnerCallType); }

}  // namespace graphex
