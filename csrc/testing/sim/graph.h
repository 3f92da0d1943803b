// A gxsim graph: capture the launches of the capturing stream, replay them on the same memory.
#pragma once

#include "runtime.h"

#include <memory>
#include <string>
#include <vector>

namespace graphex::sim {

// Follows at::cuda::CUDAGraph: capture_begin on the current (non-default) stream, with the graph's
// own private pool or a shared one; capture_end; replay; reset. Note [Captured work does not run
// during capture] (launch.h) says what is recorded; Note [gxsim memory pools] (allocator.h) says
// who owns the memory.
class SimGraph {
 public:
  explicit SimGraph(bool keep_graph = false);
  ~SimGraph();
  SimGraph(const SimGraph&) = delete;
  SimGraph& operator=(const SimGraph&) = delete;

  void capture_begin(c10::MempoolId_t pool = {0, 0});
  void capture_end();
  void instantiate() {}
  void replay();
  void reset();
  c10::MempoolId_t pool() const;
  size_t num_launches() const { return launches_.size(); }
  std::string dump() const;

 private:
  std::shared_ptr<CaptureState> capture_;  // while capturing
  std::vector<Launch> launches_;
  c10::MempoolId_t pool_{0, 0};
  bool has_graph_ = false;
  bool pool_retained_ = false;
};

}  // namespace graphex::sim
