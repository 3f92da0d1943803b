// The gxsim graph (graph.h), and its registration as torch.accelerator.Graph's implementation for
// PrivateUse1 where torch has the device-generic graph API (torch >= 2.12).
#include "graph.h"

#include "allocator.h"

#include <c10/util/Exception.h>

#include <fstream>
#include <sstream>

#if GRAPHEX_SIM_TORCH_GRAPH_API
#include <ATen/core/GraphImplInterface.h>
#endif

namespace graphex::sim {

SimGraph::SimGraph(bool /*keep_graph*/) {}

SimGraph::~SimGraph() {
  try {
    reset();
  } catch (...) {
  }
}

void SimGraph::capture_begin(c10::MempoolId_t pool) {
  TORCH_CHECK(!has_graph_ && !capture_,
              "This gxsim graph already owns a captured graph. To capture a new graph, call reset() or "
              "create a new instance.");
  const auto stream = current_stream();
  TORCH_CHECK(stream.id() != kDefaultStreamId,
              "gxsim graphs must be captured on a non-default stream. (However, after capture, it's ok to "
              "replay them on the default stream.)");
  TORCH_CHECK(!current_capture(), "gxsim: the current stream is already capturing");
  auto state = std::make_shared<CaptureState>();
  state->id = next_capture_id();
  state->origin = stream.id();
  // A pool of its own, {0, id}, unless given one (another graph's pool, or graph_pool_handle()).
  pool_ = (pool.first == 0 && pool.second == 0) ? c10::MempoolId_t{0, state->id} : pool;
  state->pool = pool_;
  retain_pool(pool_);
  pool_retained_ = true;
  std::weak_ptr<CaptureState> weak = state;
  begin_allocate_to_pool(pool_, [weak] {
    auto s = weak.lock();
    return s && current_capture() == s;
  });
  register_capture(state);
  capture_ = state;
}

void SimGraph::capture_end() {
  TORCH_CHECK(capture_, "gxsim: capture_end() without capture_begin()");
  TORCH_CHECK(current_stream().id() == capture_->origin, "Capture must end on the same stream it began on.");
  auto state = std::move(capture_);
  capture_.reset();
  end_allocate_to_pool(pool_);
  unregister_capture(state);
  std::string error;
  if (state->invalidated) {
    error = "gxsim error: operation failed due to a previous error during capture "
            "(cudaErrorStreamCaptureInvalidated); the capture was invalidated by: " + state->error;
  } else if (!state->unjoined.empty()) {
    std::ostringstream streams;
    for (auto s : state->unjoined) streams << " " << s;
    error = "gxsim error: capture ended with unjoined work on stream(s)" + streams.str() +
            ": each stream forked from the capturing stream must be joined back into it (record an event "
            "on it and wait on that event on the capturing stream) before capture_end "
            "(cudaErrorStreamCaptureUnjoined)";
  }
  if (!error.empty()) {
    release_pool(pool_);
    pool_retained_ = false;
    TORCH_CHECK(false, error);
  }
  launches_ = std::move(state->launches);
  has_graph_ = true;
  counters().captures++;
}

void SimGraph::replay() {
  TORCH_CHECK(has_graph_, "Called SimGraph::replay without a preceding successful capture.");
  TORCH_CHECK(!current_capture(), "gxsim: replaying a graph on a capturing stream is not supported");
  for (const auto& launch : launches_) run_launch(launch);
  counters().replayed_launches += static_cast<int64_t>(launches_.size());
  counters().graph_replays++;
}

void SimGraph::reset() {
  if (capture_) {
    end_allocate_to_pool(pool_);
    unregister_capture(capture_);
    capture_.reset();
  }
  launches_.clear();
  has_graph_ = false;
  if (pool_retained_) {
    release_pool(pool_);
    pool_retained_ = false;
  }
}

c10::MempoolId_t SimGraph::pool() const {
  TORCH_CHECK(pool_retained_, "Called SimGraph::pool without a preceding successful capture.");
  return pool_;
}

std::string SimGraph::dump() const {
  std::ostringstream out;
  for (size_t i = 0; i < launches_.size(); ++i) {
    const auto& launch = launches_[i];
    out << i << ": [stream " << launch.stream << "] " << launch.op.schema().operator_name() << "(";
    for (size_t j = 0; j < launch.args.size(); ++j) {
      const auto& a = launch.args[j];
      if (j) out << ", ";
      if (a.isTensor() && a.toTensor().defined()) {
        out << "[" << a.toTensor().data_ptr() << " " << a.toTensor().sizes() << "]";
      } else {
        out << a;
      }
    }
    out << ")";
    for (const auto& target : launch.targets) {
      if (target) out << " -> " << target->data_ptr();
    }
    out << "\n";
  }
  return out.str();
}

#if GRAPHEX_SIM_TORCH_GRAPH_API
namespace {

struct SimGraphImpl final : at::GraphImplInterface {
  explicit SimGraphImpl(const at::GraphImplArgs& args) : graph(args.keep_graph) {}
  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode /*mode*/) override { graph.capture_begin(pool); }
  void capture_end() override { graph.capture_end(); }
  void instantiate() override { graph.instantiate(); }
  void replay() override { graph.replay(); }
  void reset() override { graph.reset(); }
  at::MempoolId_t pool() const override { return graph.pool(); }
  void enable_debug_mode() override {}
  void debug_dump(const std::string& path) override {
    std::ofstream(path) << graph.dump();
  }
  SimGraph graph;
};

}  // namespace
}  // namespace graphex::sim

namespace at {
// The registry key is c10::DeviceTypeName(PrivateUse1, /*lower_case=*/false): the renamed
// backend's name upper-cased, "GXSIM" once graphex.testing.sim.enable() renamed PrivateUse1.
REGISTER_GRAPH_IMPL(GXSIM, graphex::sim::SimGraphImpl)
}  // namespace at
namespace graphex::sim {
#endif

}  // namespace graphex::sim
