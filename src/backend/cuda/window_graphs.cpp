#include "backend/cuda/window_graphs.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "backend/cuda/check.h"
#include "util/error.h"

namespace strata::backend {

namespace {

constexpr size_t kAlign = 256;
// A key is captured on its second op-by-op window: the first sized the arena and filled the
// caches. Keys seen once only (a prefill of an odd length) never pay for a capture.
constexpr int kEagerWindowsBeforeCapture = 1;
// The most a recorded window may allocate and still never rewind (window_graphs.h): decode and
// short verification windows, not long prefills.
constexpr size_t kMaxFreshWindowBytes = size_t(128) << 20;

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t kernel_nodes(cudaGraph_t graph) {
  size_t n = 0;
  STRATA_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  STRATA_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  uint64_t kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    STRATA_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel;
  }
  return kernels;
}

}  // namespace

WindowGraphs::WindowGraphs(const cuda::detail::DeviceContext& ctx) : ctx_(ctx), profile_(ctx.stream) {}

WindowGraphs::~WindowGraphs() {
  cudaStreamSynchronize(ctx_.stream);
  for (const StepTiming& t : timed_steps_)
    for (cudaEvent_t e : {t.start, t.answered, t.end})
      if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  drop_graphs();
  destroy(capturing_);
  if (arena_) cudaFree(arena_);
  for (auto& [chunk, bytes] : step_chunks_) cudaFree(chunk);
}

void WindowGraphs::destroy(Graph& g) {
  for (cudaGraphExec_t exec : g.segments) cudaGraphExecDestroy(exec);
  if (g.done) cudaEventDestroy(g.done);
  for (Input& in : g.inputs) cudaFreeHost(in.pinned);
  g = Graph{};
}

void WindowGraphs::drop_graphs() {
  for (auto& [key, g] : graphs_) destroy(g);
  graphs_.clear();
  seen_.clear();
}

void WindowGraphs::grow_arena() {
  STRATA_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  drop_graphs();  // they hold addresses in the old arena
  if (arena_) STRATA_CUDA_CHECK(cudaFree(arena_));
  arena_ = nullptr;
  const size_t want = round_up(high_water_ + high_water_ / 4);
  const cudaError_t err = cudaMalloc(&arena_, want);
  if (err != cudaSuccess) {
    cudaGetLastError();
    arena_ = nullptr;
    capacity_ = 0;
    fail("window memory: cannot allocate ", want, " bytes of device memory for a window's "
         "activations: ", cudaGetErrorString(err));
  }
  capacity_ = want;
}

void WindowGraphs::begin(uint64_t key) {
  if (mode_ != Mode::Outside) fail("begin_window: the previous window was not ended");
  harvest_step_timings();
  if (high_water_ > capacity_) grow_arena();
  top_ = 0;
  allocated_ = 0;
  fresh_limit_ = 0;
  blocks_.clear();
  key_ = key;
  next_input_ = 0;
  next_segment_ = 0;
  launched_ = false;
  in_step_ = false;
  graph_ = nullptr;
  mode_ = Mode::Eager;
  if (profile_.enabled()) {
    key_ = 0;
    profile_.begin();
    return;
  }
  if (key == 0) return;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    graph_ = &it->second;
    fresh_limit_ = graph_->fresh_bytes;
    mode_ = Mode::Replay;
    if (replay_ready()) launch_replay();
    return;
  }
  Seen& seen = seen_[key];
  ++counters_.warming_windows;
  if (seen.eager_windows++ < kEagerWindowsBeforeCapture) return;
  capturing_ = Graph{};
  graph_ = &capturing_;
  STRATA_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeRelaxed));
  mode_ = Mode::Capture;
  // (A window that allocates nothing has nothing to zero, and maybe no arena yet.)
  if (seen.allocated > 0 && seen.allocated <= kMaxFreshWindowBytes && seen.allocated <= capacity_) {
    capturing_.fresh_bytes = fresh_limit_ = round_up(seen.allocated);
    STRATA_CUDA_CHECK(cudaMemsetAsync(arena_, 0, fresh_limit_, ctx_.stream));
  }
}

void WindowGraphs::end(bool completed) {
  const Mode mode = mode_;
  const bool in_step = in_step_;
  mode_ = Mode::Outside;
  in_step_ = false;
  for (cudaEvent_t e : {step_.start, step_.answered, step_.end})  // a step the window failed in
    if (e) spare_events_.push_back(e);
  step_ = StepTiming{};
  if (mode == Mode::Capture) {
    cudaGraph_t graph = nullptr;
    // A window that failed inside a host step has no capture running.
    const cudaError_t err = in_step ? cudaSuccess : cudaStreamEndCapture(ctx_.stream, &graph);
    if (!completed || in_step || err != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      destroy(capturing_);
      if (completed) STRATA_CUDA_CHECK(err);
      return;
    }
    capturing_.kernels += kernel_nodes(graph);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (inst != cudaSuccess) destroy(capturing_);
    STRATA_CUDA_CHECK(inst);
    capturing_.segments.push_back(exec);
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&capturing_.done, cudaEventDisableTiming));
    ++counters_.graph_captures;
    graph_ = &graphs_.emplace(key_, std::exchange(capturing_, Graph{})).first->second;
  } else if (mode != Mode::Replay) {
    profile_.end(counters_.op_times, counters_.profiled_windows_discarded);
    if (key_ != 0 && completed) {
      Seen& seen = seen_[key_];
      seen.allocated = std::max(seen.allocated, allocated_);
      // The capture will want the whole of it as fresh memory.
      if (allocated_ <= kMaxFreshWindowBytes) high_water_ = std::max(high_water_, allocated_);
    }
    return;
  }
  if (!completed || launched_) return;
  // The segments before the last were launched at their host steps.
  launch_replay();
}

// A replayed window's last segment, launched once its inputs are refilled: at the last upload
// (or at begin() without inputs) when the window has no host steps, so that the model's walk over
// the rest of its ops, which launch nothing, overlaps the graph instead of delaying it (about
// 200 us a decode token of the 80B shape on the H100's host); else at end().
bool WindowGraphs::replay_ready() const {
  return graph_->segments.size() == 1 && next_input_ == graph_->inputs.size();
}

void WindowGraphs::launch_replay() {
  if (next_input_ != graph_->inputs.size() || next_segment_ + 1 != graph_->segments.size())
    fail("internal error: a replayed window uploaded ", next_input_, " inputs in ", next_segment_ + 1,
         " segments; its graph has ", graph_->inputs.size(), " in ", graph_->segments.size());
  STRATA_CUDA_CHECK(cudaGraphLaunch(graph_->segments.back(), ctx_.stream));
  STRATA_CUDA_CHECK(cudaEventRecord(graph_->done, ctx_.stream));
  launched_ = true;
  ++counters_.graph_replays;
  counters_.graph_kernels += graph_->kernels;
}

void WindowGraphs::begin_host_step() {
  if (mode_ == Mode::Outside) return;
  if (in_step_) fail("internal error: a host step inside a host step");
  finish_segment();
  in_step_ = true;
  step_read_ = step_answered_ = false;
  step_ = StepTiming{};
  step_.start = timing_event();
  STRATA_CUDA_CHECK(cudaEventRecord(step_.start, ctx_.stream));
  step_chunk_ = 0;
  step_top_ = 0;
}

void WindowGraphs::end_host_step() {
  if (mode_ == Mode::Outside) return;
  if (!in_step_) fail("internal error: the end of a host step that did not begin");
  in_step_ = false;
  step_.end = timing_event();
  STRATA_CUDA_CHECK(cudaEventRecord(step_.end, ctx_.stream));
  timed_steps_.push_back(std::exchange(step_, StepTiming{}));
  if (mode_ == Mode::Capture)
    STRATA_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeRelaxed));
}

void WindowGraphs::finish_segment() {
  if (mode_ == Mode::Capture) {
    cudaGraph_t graph = nullptr;
    STRATA_CUDA_CHECK(cudaStreamEndCapture(ctx_.stream, &graph));
    capturing_.kernels += kernel_nodes(graph);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    STRATA_CUDA_CHECK(inst);
    capturing_.segments.push_back(exec);
    STRATA_CUDA_CHECK(cudaGraphLaunch(exec, ctx_.stream));
    ++next_segment_;
  } else if (mode_ == Mode::Replay) {
    if (next_segment_ + 1 >= graph_->segments.size())
      fail("internal error: a replayed window has more host steps than its graph has segments (",
           graph_->segments.size(), ")");
    STRATA_CUDA_CHECK(cudaGraphLaunch(graph_->segments[next_segment_++], ctx_.stream));
  }
}

void* WindowGraphs::step_alloc(size_t bytes) {
  const size_t need = round_up(std::max<size_t>(bytes, 1));
  while (step_chunk_ < step_chunks_.size() && step_top_ + need > step_chunks_[step_chunk_].second) {
    ++step_chunk_;
    step_top_ = 0;
  }
  if (step_chunk_ == step_chunks_.size()) {
    const size_t chunk_bytes = std::max(need, size_t(64) << 20);
    uint8_t* chunk = nullptr;
    const cudaError_t err = cudaMalloc(&chunk, chunk_bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail("window memory: cannot allocate ", chunk_bytes, " bytes of device memory for a host step: ",
           cudaGetErrorString(err));
    }
    step_chunks_.emplace_back(chunk, chunk_bytes);
    step_top_ = 0;
  }
  uint8_t* p = step_chunks_[step_chunk_].first + step_top_;
  step_top_ += need;
  STRATA_CUDA_CHECK(cudaMemsetAsync(p, 0, need, ctx_.stream));
  return p;
}

void* WindowGraphs::alloc(size_t bytes) {
  if (mode_ == Mode::Outside) return nullptr;
  if (in_step_) return step_alloc(bytes);
  const size_t need = round_up(std::max<size_t>(bytes, 1));
  if (fresh_limit_ != 0) {
    if (top_ + need > fresh_limit_)
      fail("internal error: a recorded window allocated more than its first window (", top_ + need,
           " of ", fresh_limit_, " bytes)");
    top_ += need;
    return arena_ + top_ - need;
  }
  allocated_ += need;
  const size_t offset = top_;
  top_ += need;
  high_water_ = std::max(high_water_, top_);
  if (top_ > capacity_) {
    if (mode_ != Mode::Eager)
      fail("internal error: a recorded window outgrew its arena (", top_, " of ", capacity_,
           " bytes)");
    top_ = offset;  // the caller allocates it; the arena grows at the next window
    return nullptr;
  }
  blocks_.push_back({offset, need, false});
  if (mode_ != Mode::Replay) {
    profile_.op("alloc (zeroing)");
    STRATA_CUDA_CHECK(cudaMemsetAsync(arena_ + offset, 0, need, ctx_.stream));
  }
  return arena_ + offset;
}

bool WindowGraphs::release(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (const auto& [chunk, bytes] : step_chunks_)
    if (b >= chunk && b < chunk + bytes) return true;  // reset at the next step
  if (!arena_ || b < arena_ || b >= arena_ + capacity_) return false;
  if (fresh_limit_ != 0) return true;  // never rewound: the memory is the graph's until it ends
  const size_t offset = size_t(b - arena_);
  for (Block& block : blocks_)
    if (block.offset == offset) block.freed = true;
  // The window's temporaries are released layer by layer, newest on top: rewind over them.
  while (!blocks_.empty() && blocks_.back().freed) {
    top_ = blocks_.back().offset;
    blocks_.pop_back();
  }
  return true;
}

bool WindowGraphs::upload(void* dst, const void* host, size_t bytes) {
  if (mode_ == Mode::Outside || mode_ == Mode::Eager || in_step_) return false;
  if (mode_ == Mode::Capture) {
    Input in{nullptr, bytes};
    STRATA_CUDA_CHECK(cudaMallocHost(&in.pinned, std::max<size_t>(bytes, 1)));
    std::memcpy(in.pinned, host, bytes);
    graph_->inputs.push_back(in);
    ++next_input_;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, in.pinned, bytes, cudaMemcpyHostToDevice, ctx_.stream));
    return true;
  }
  if (next_input_ >= graph_->inputs.size() || graph_->inputs[next_input_].bytes != bytes)
    fail("internal error: a replayed window's upload ", next_input_, " of ", bytes,
         " bytes does not match its graph");
  if (next_input_ == 0) STRATA_CUDA_CHECK(cudaEventSynchronize(graph_->done));
  std::memcpy(graph_->inputs[next_input_++].pinned, host, bytes);
  if (replay_ready()) launch_replay();
  return true;
}

void WindowGraphs::readback(const char* op) {
  if ((mode_ == Mode::Capture || mode_ == Mode::Replay) && !in_step_)
    fail("internal error: ", op, " inside a recorded window outside a host step (its key promised no read-back)");
  step_read_ = step_read_ || in_step_;
}

cudaEvent_t WindowGraphs::timing_event() {
  if (!spare_events_.empty()) {
    cudaEvent_t e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  STRATA_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void WindowGraphs::answer_step() {
  step_answered_ = true;
  step_.answered = timing_event();
  step_.was_answered = true;
  STRATA_CUDA_CHECK(cudaEventRecord(step_.answered, ctx_.stream));
}

void WindowGraphs::harvest_step_timings() {
  size_t done = 0;
  for (; done < timed_steps_.size(); ++done) {
    StepTiming& t = timed_steps_[done];
    const cudaError_t state = cudaEventQuery(t.end);
    if (state == cudaErrorNotReady) break;
    STRATA_CUDA_CHECK(state);
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.end));
    counters_.host_step_seconds += double(ms) * 1e-3;
    ++counters_.host_steps;
    if (t.was_answered) {
      STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.answered));
      counters_.handshake_seconds += double(ms) * 1e-3;
      ++counters_.handshakes;
    }
    for (cudaEvent_t e : {t.start, t.answered, t.end})
      if (e) spare_events_.push_back(e);
  }
  timed_steps_.erase(timed_steps_.begin(), timed_steps_.begin() + ptrdiff_t(done));
}

BackendCounters WindowGraphs::counters() {
  harvest_step_timings();
  return counters_;
}

}  // namespace strata::backend
