// Windows recorded as CUDA graphs and replayed (Backend::begin_window). A key's first window runs
// op by op: it sizes the window arena and fills the caches ops build on first use (expert tables).
// Its second window is captured into a graph, launched at end(); later windows replay it: the
// model still walks its ops, which skip their launches, while in-window allocations return the
// addresses they had in the capture (a bump arena reset at every window) and uploads refill the
// pinned buffers the graph's copy nodes read. A replay without host steps launches as soon as its
// last input is refilled, so the rest of the walk runs beside the graph. Internal: names CUDA
// types.
//
// Host steps (Backend::begin_host_step): a window may leave stretches to the host (the expert
// cache's handshake: the routing read back, misses resolved, the experts' ops chosen). Such a
// window is recorded as segments, one graph per stretch between host steps; a host step runs op by
// op after the segment before it is launched, and its allocations come from a separate step arena
// (reset at every step), so the segments' allocations are the same in every window of the key.
//
// Zeroing: op by op, every in-window allocation is a memset, and the arena rewinds over released
// temporaries. A recorded window whose allocations add up to at most kMaxFreshWindowBytes never
// rewinds instead: each allocation is fresh memory, all of it zeroed by one memset when the graph
// starts (a decode token's ~1000 allocations were as many memset nodes, each a step of the
// graph's chain).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/op_profile.h"

namespace strata::backend {

class WindowGraphs {
 public:
  enum class Mode { Outside, Eager, Capture, Replay };

  explicit WindowGraphs(const cuda::detail::DeviceContext& ctx);
  ~WindowGraphs();
  WindowGraphs(const WindowGraphs&) = delete;
  WindowGraphs& operator=(const WindowGraphs&) = delete;

  void begin(uint64_t key);
  void end(bool completed);
  // A host step inside a window (see above); outside a window nothing happens.
  void begin_host_step();
  void end_host_step();
  Mode mode() const { return mode_; }
  bool profiling() const { return profile_.enabled(); }
  // Replaying: ops skip their launches (the graph holds them).
  bool replaying() const { return mode_ == Mode::Replay && !in_step_; }

  // Zeroed in-window memory, or null outside a window or past the arena in an op-by-op window
  // (the caller allocates it the usual way; the arena grows at the next begin()).
  void* alloc(size_t bytes);
  // Whether p is in-window memory (then nothing more is to be done to release it).
  bool release(const void* p);
  // An in-window upload into device memory at dst: true when done here (captured or refilled),
  // false when the caller stages it as usual (outside a window or op by op).
  bool upload(void* dst, const void* host, size_t bytes);
  // A read of device memory by the host. Inside a recorded window outside a host step it would
  // read nothing: throws naming `op`. Inside a host step the device now waits for the host's answer.
  void readback(const char* op);

  // Harvests the host steps' timings whose events have fired.
  BackendCounters counters();
  uint64_t ops() const { return counters_.ops; }
  void count_op(const char* name) {
    ++counters_.ops;
    profile_.op(name);
    if (in_step_ && step_read_ && !step_answered_) answer_step();
  }

 private:
  struct Input {
    uint8_t* pinned = nullptr;
    size_t bytes = 0;
  };
  struct Graph {
    std::vector<cudaGraphExec_t> segments;  // one, or one per stretch between host steps
    std::vector<Input> inputs;
    uint64_t kernels = 0;
    size_t fresh_bytes = 0;      // the window's allocations, when it never rewinds; else 0
    cudaEvent_t done = nullptr;  // the last launch finished reading the inputs
  };
  struct Block {
    size_t offset, bytes;
    bool freed;
  };

  void drop_graphs();
  void grow_arena();
  // Capture: ends the segment being captured and launches it. Replay: launches the next segment.
  void finish_segment();
  // Replay: no host steps, and every input refilled: the graph can launch before the walk ends.
  bool replay_ready() const;
  void launch_replay();
  void destroy(Graph& g);
  void* step_alloc(size_t bytes);
  // Host steps timed on the device (BackendCounters::handshake_seconds): `start` when the segment
  // before the step has run, `answered` at the first op the host queued after reading the device,
  // `end` after the step's ops.
  struct StepTiming {
    cudaEvent_t start = nullptr, answered = nullptr, end = nullptr;
    bool was_answered = false;
  };
  cudaEvent_t timing_event();
  void answer_step();
  void harvest_step_timings();

  const cuda::detail::DeviceContext& ctx_;
  Mode mode_ = Mode::Outside;
  uint64_t key_ = 0;
  Graph* graph_ = nullptr;      // the graph being captured or replayed
  Graph capturing_;
  size_t next_input_ = 0;
  size_t next_segment_ = 0;  // replay: segments launched so far in this window
  bool launched_ = false;    // replay: the last segment is launched
  bool in_step_ = false;
  bool step_read_ = false;      // the host read the device in this step
  bool step_answered_ = false;  // and has queued work since
  StepTiming step_;
  std::vector<StepTiming> timed_steps_;   // queued, oldest first, not yet harvested
  std::vector<cudaEvent_t> spare_events_;
  // Host steps' allocations: chunks of device memory, reset at every step, grown by a chunk when
  // one step needs more (a step's tensors stay where they are).
  std::vector<std::pair<uint8_t*, size_t>> step_chunks_;
  size_t step_chunk_ = 0, step_top_ = 0;
  std::unordered_map<uint64_t, Graph> graphs_;
  struct Seen {
    int eager_windows = 0;
    size_t allocated = 0;  // the most one window of the key allocated, releases not subtracted
  };
  std::unordered_map<uint64_t, Seen> seen_;
  uint8_t* arena_ = nullptr;
  size_t capacity_ = 0, top_ = 0, high_water_ = 0;
  size_t allocated_ = 0;   // this window's allocations, releases not subtracted
  size_t fresh_limit_ = 0;  // nonzero: this window never rewinds and ends below it
  std::vector<Block> blocks_;
  BackendCounters counters_;
  OpProfile profile_;
};

}  // namespace strata::backend
