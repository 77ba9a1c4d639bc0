#include "backend/cuda/window_graphs.h"

#include <algorithm>
#include <cstring>

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
  drop_graphs();
  if (arena_) cudaFree(arena_);
}

void WindowGraphs::drop_graphs() {
  for (auto& [key, g] : graphs_) {
    cudaGraphExecDestroy(g.exec);
    cudaEventDestroy(g.done);
    for (Input& in : g.inputs) cudaFreeHost(in.pinned);
  }
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
  if (high_water_ > capacity_) grow_arena();
  top_ = 0;
  allocated_ = 0;
  fresh_limit_ = 0;
  blocks_.clear();
  key_ = key;
  next_input_ = 0;
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
    return;
  }
  Seen& seen = seen_[key];
  if (seen.eager_windows++ < kEagerWindowsBeforeCapture) return;
  capturing_ = Graph{};
  graph_ = &capturing_;
  STRATA_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeRelaxed));
  mode_ = Mode::Capture;
  if (seen.allocated <= kMaxFreshWindowBytes && seen.allocated <= capacity_) {
    capturing_.fresh_bytes = fresh_limit_ = round_up(std::max<size_t>(seen.allocated, 1));
    STRATA_CUDA_CHECK(cudaMemsetAsync(arena_, 0, fresh_limit_, ctx_.stream));
  }
}

void WindowGraphs::end(bool completed) {
  const Mode mode = mode_;
  mode_ = Mode::Outside;
  if (mode == Mode::Capture) {
    cudaGraph_t graph = nullptr;
    const cudaError_t err = cudaStreamEndCapture(ctx_.stream, &graph);
    if (!completed || err != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      for (Input& in : capturing_.inputs) cudaFreeHost(in.pinned);
      capturing_ = Graph{};
      if (completed) STRATA_CUDA_CHECK(err);
      return;
    }
    Graph g = std::move(capturing_);
    capturing_ = Graph{};
    g.kernels = kernel_nodes(graph);
    const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    STRATA_CUDA_CHECK(inst);
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&g.done, cudaEventDisableTiming));
    ++counters_.graph_captures;
    graph_ = &graphs_.emplace(key_, std::move(g)).first->second;
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
  if (!completed) return;
  if (next_input_ != graph_->inputs.size())
    fail("internal error: a replayed window uploaded ", next_input_, " inputs; its graph has ",
         graph_->inputs.size());
  STRATA_CUDA_CHECK(cudaGraphLaunch(graph_->exec, ctx_.stream));
  STRATA_CUDA_CHECK(cudaEventRecord(graph_->done, ctx_.stream));
  ++counters_.graph_replays;
  counters_.graph_kernels += graph_->kernels;
}

void* WindowGraphs::alloc(size_t bytes) {
  if (mode_ == Mode::Outside) return nullptr;
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
  if (mode_ == Mode::Outside || mode_ == Mode::Eager) return false;
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
  return true;
}

void WindowGraphs::check_no_readback(const char* op) const {
  if (mode_ == Mode::Capture || mode_ == Mode::Replay)
    fail("internal error: ", op, " inside a recorded window (its key promised no read-back)");
}

}  // namespace strata::backend
