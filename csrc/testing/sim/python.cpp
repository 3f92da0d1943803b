// What Python sees of gxsim (graphex/testing/sim.py wraps it): operators in the graphex_sim
// namespace and the torch.classes.graphex_sim.Graph class. Loaded with torch.ops.load_library, so
// no Python headers: the same library works with any Python.
#include "allocator.h"
#include "graph.h"
#include "runtime.h"

#include <torch/custom_class.h>
#include <torch/library.h>

namespace graphex::sim {
namespace {

struct GraphHolder : torch::CustomClassHolder {
  explicit GraphHolder(bool keep_graph) : graph(keep_graph) {}
  SimGraph graph;
};

std::vector<int64_t> pool_list(c10::MempoolId_t pool) {
  return {static_cast<int64_t>(pool.first), static_cast<int64_t>(pool.second)};
}

c10::MempoolId_t pool_id(int64_t a, int64_t b) {
  return {static_cast<c10::CaptureId_t>(a), static_cast<c10::CaptureId_t>(b)};
}

std::vector<int64_t> stats() {
  auto& c = counters();
  auto m = memory_stats();
  return {c.graph_replays, c.captures, c.kernel_launches, c.captured_launches, c.replayed_launches,
          m.allocated_bytes, m.reserved_bytes};
}

void reset_stats() {
  auto& c = counters();
  c.graph_replays = 0;
  c.captures = 0;
  c.kernel_launches = 0;
  c.captured_launches = 0;
  c.replayed_launches = 0;
}

std::vector<int64_t> tensor_pool(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kDeviceType, "pool_of: expected a gxsim tensor, got ", t.device());
  return pool_list(graphex::sim::pool_of(t.storage().data()));
}

}  // namespace

TORCH_LIBRARY(graphex_sim, m) {
  m.class_<GraphHolder>("Graph")
      .def(torch::init<bool>())
      .def("capture_begin",
           [](const c10::intrusive_ptr<GraphHolder>& self, int64_t a, int64_t b) {
             self->graph.capture_begin(pool_id(a, b));
           })
      .def("capture_end", [](const c10::intrusive_ptr<GraphHolder>& self) { self->graph.capture_end(); })
      .def("instantiate", [](const c10::intrusive_ptr<GraphHolder>& self) { self->graph.instantiate(); })
      .def("replay", [](const c10::intrusive_ptr<GraphHolder>& self) { self->graph.replay(); })
      .def("reset", [](const c10::intrusive_ptr<GraphHolder>& self) { self->graph.reset(); })
      .def("pool", [](const c10::intrusive_ptr<GraphHolder>& self) { return pool_list(self->graph.pool()); })
      .def("num_launches",
           [](const c10::intrusive_ptr<GraphHolder>& self) { return static_cast<int64_t>(self->graph.num_launches()); })
      .def("dump", [](const c10::intrusive_ptr<GraphHolder>& self) { return self->graph.dump(); });
  m.def("stats() -> int[]", &stats);
  m.def("reset_stats() -> ()", &reset_stats);
  m.def("graph_pool_handle() -> int[]", [] { return pool_list(new_pool_handle()); });
  m.def("pool_of(Tensor t) -> int[]", &tensor_pool);
  m.def("empty_cache() -> ()", &empty_cache);
  m.def("is_current_stream_capturing() -> bool", [] { return current_capture() != nullptr; });
}

}  // namespace graphex::sim
