// CudaBackend's state, shared by its source files: cuda_backend.cpp (memory, weights, staging),
// cuda_backend_ops.cpp (op checks and launches) and cuda_backend_moe.cpp (matmul, router, MoE).
// Internal: names CUDA types.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/cpu/ops_common.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/window_graphs.h"

namespace strata::cuda::detail {
// True unless the environment variable `name` is "0": the A/B switches STRATA_CUDA_PDL,
// STRATA_CUDA_SIDE_BRANCHES and STRATA_CUDA_DELTA_NET_KERNEL (dependent_launch.cpp).
bool env_switch_on(const char* name);
}  // namespace strata::cuda::detail

namespace strata::backend {

using cpu::check_no_overlap;
using cpu::check_same_shape;
using cpu::check_tensor;
using cpu::overlaps;
using cpu::require;
using cpu::shape;

// Host spans copied to the device without waiting for it: a pinned host ring and a device ring of
// the same size, used in two halves. A copy is staged in the current half; when it is full the
// other half is taken after waiting for the event recorded when that half was last left (its
// copies have then finished reading the pinned memory). The device half is rewritten only by
// copies queued after every kernel that read it (one stream), so no kernel sees new data early.
class Staging {
 public:
  explicit Staging(const cuda::detail::DeviceContext& ctx);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // A device copy of `bytes` bytes at host, 16-byte aligned, valid for work queued after this
  // call (until the ring comes round to it again, two half-switches later).
  const void* put(const void* host, size_t bytes);
  template <typename T>
  const T* put(std::span<const T> host) {
    return static_cast<const T*>(put(host.data(), host.size_bytes()));
  }

 private:
  void allocate(size_t half_bytes);
  void release();

  const cuda::detail::DeviceContext& ctx_;
  size_t half_bytes_ = 0;
  uint8_t* host_ = nullptr;
  uint8_t* device_ = nullptr;
  cudaEvent_t left_[2] = {nullptr, nullptr};
  int half_ = 0;
  size_t used_ = 0;
};

// Device memory from the stream-ordered pool for the duration of one op: freed (stream-ordered,
// so kernels queued before still see it) when it goes out of scope.
class Scratch {
 public:
  Scratch(cudaStream_t stream, size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

// The device copy of an ExpertWeights span (CudaBackend::moe_*): entries for every expert, the
// weight types present and the widest hidden layer. Rebuilt when the span's content changes.
struct ExpertTable {
  std::vector<cuda::detail::ExpertEntry> host;
  void* device = nullptr;  // the device copy of host (stream-ordered pool)
  std::vector<quant::Type> gate_up_types, down_types;
  bool act_used[3] = {};  // gate/up activation layouts (ActQuant) the table needs
  int64_t max_ff = 0;     // widest gate/up rows
  int64_t max_cols = 0;   // widest down row
  int64_t checked_cols = -1;  // the activation width every entry was checked against
};

// What identifies an uploaded file tensor: its host address and size, name, type, shape and a
// hash of its first and last bytes.
struct UploadKey {
  const void* data;
  size_t bytes;
  int type;
  std::string name;
  std::vector<int64_t> shape;
  uint64_t sample;
  auto operator<=>(const UploadKey&) const = default;
};

struct CudaBackend::Impl {
  explicit Impl(int device_index);
  ~Impl();

  // Throws "<op>: <name> is not device memory from weight()" unless [w.data, + rows * stride)
  // lies in one uploaded tensor.
  void check_device_weight(const char* op, const char* name, const Weight& w) const;
  // The device table for `experts` (cached per span).
  ExpertTable& expert_table(std::span<const ExpertWeights> experts);
  // Zeroed device memory for [rows x cols] elements of `size` bytes: from the window arena inside
  // a window, else the stream-ordered pool; free() gives either back.
  // Zeroed device memory; inside a window the window's own unless `lasting`.
  void* allocate(const char* op, int64_t rows, int64_t cols, size_t size, bool lasting = false);
  void free(const char* op, void* p, const char* kind, int64_t rows, int64_t cols);
  // The inverse rope frequencies of (theta, rope_dim), computed on the host once and kept on
  // the device (a persistent input, so a recorded window reads the same memory on replay).
  const float* rope_inv_freq(float theta, int64_t rope_dim);

  // Consecutive matmuls of one activation (q, k and v; gate and up of the shared expert) quantize
  // it once. `matmul_x` is the x of the last op when that op was a matmul (`matmul_ops`: the op
  // count after it; any other op moves the count on), `quantized_x` the x (and activation format)
  // whose quantized copy the device's mat-vec scratch holds while that chain lasts. Host writes
  // into device memory (uploads, allocations) and window boundaries end the chain.
  struct MatmulX {
    const float* data = nullptr;
    int64_t rows = 0, cols = 0, stride = 0;
    int format = -1;  // quant::ActFormat of quantized_x
    bool operator==(const MatmulX&) const = default;
  };
  void end_matmul_chain() { matmul_x = quantized_x = {}; }

  // A MoE's combine (y += the rank-order sum of weights[r, j] * out[r * top_k + j]) held back by
  // one op: add_mul_sigmoid_residual_rms_norm of the same y folds it into its own kernel, one
  // launch fewer a layer. Every other op, allocation, release, transfer, stream switch and window
  // or host-step boundary launches it first (flush_combine), so nothing reads y, or reuses what
  // the combine reads, before it has run.
  struct PendingCombine {
    const float* weights = nullptr;  // [y.rows, top_k]
    int64_t top_k = 0;
    Tensor out, y;
    std::unique_ptr<Scratch> out_memory;  // out's memory where the op allocated it
  };
  // Launches the combine now where the op profiler times op by op, else holds it back.
  void combine(const float* weights, int64_t top_k, const Tensor& out, Tensor y,
               std::unique_ptr<Scratch> out_memory = nullptr);
  void flush_combine();
  // The held combine of y, taken over by the caller; any other is launched first.
  std::optional<PendingCombine> take_combine(const Tensor& y);
  // Device memory or the stream is about to change under what the backend holds: a held combine
  // launched, the matmul chain ended (allocation, release, transfers, the side branch's end).
  void settle() {
    flush_combine();
    end_matmul_chain();
  }
  // Every op's start: a held combine launched, then the op counted.
  void begin_op(const char* name) {
    flush_combine();
    graphs.count_op(name);
  }
  std::optional<PendingCombine> pending_combine;
  // Joins the device's side branch (Backend::begin_side_branch) if one is forked and unjoined.
  void join_side();
  MatmulX matmul_x, quantized_x;
  uint64_t matmul_ops = 0;

  cuda::Device device;
  const cuda::detail::DeviceContext& ctx;
  Staging staging;
  std::unordered_set<void*> allocations;                     // tensors and ids
  std::map<UploadKey, cuda::DeviceBuffer> uploads;
  std::map<const uint8_t*, size_t> upload_ranges;            // device base -> bytes
  size_t upload_bytes = 0;
  std::unordered_map<const ExpertWeights*, ExpertTable> expert_tables;
  std::map<std::pair<float, int64_t>, cuda::DeviceBuffer> rope_tables;
  WindowGraphs graphs;
};

}  // namespace strata::backend
