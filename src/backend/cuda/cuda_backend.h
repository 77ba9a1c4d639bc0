// The CUDA backend as the engine sees it: plain C++, no CUDA header or type, so engine code and
// the tests build the same whether or not the backend is compiled in (STRATA_HAVE_CUDA).
//
// Two layers: `CudaBackend` (at the end) implements backend::Backend on one GPU, so every model
// runs on it; below it, `Device` is the raw device (stream, decoder tables, dequantize, mat-vec)
// that the backend and the format tests use.
//
// Pointers passed to Device ops are device pointers (DeviceBuffer::data()). Ops are queued in
// order on the Device's stream; upload/download wait for their copy, everything else is
// asynchronous until synchronize(). Failures throw strata::Error naming the CUDA call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "quant/kernels.h"
#include "quant/types.h"

namespace strata::cuda {

namespace detail {
struct DeviceContext;  // launch.h: stream, decoder tables, limits (internal, names CUDA types)
}

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
  size_t total_bytes = 0;
  size_t free_bytes = 0;  // at query time
  size_t l2_bytes = 0;
};

// Usable devices; 0 when there is none or no driver. Never throws.
int device_count();
// Why device_count() is 0, as "no CUDA device: <driver's message>"; empty when there is one.
std::string unavailable_reason();
// Throws strata::Error("no CUDA device: ...") when `index` does not exist.
DeviceInfo query_device(int index = 0);

// Device memory (cudaMalloc), freed on destruction; move-only. Allocated on the calling thread's
// current device, which a Device makes its own on construction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Whether the backend has a decoder for weight format t (every weight format strata knows).
bool supports(quant::Type t);

// Activations one matvec_q call takes at most (a window of up to 8 tokens).
constexpr int kMaxMatvecTokens = 8;

// Whether matvec_q has an integer kernel for t, equal bit for bit to the CPU backend (Q8_0, Q4_K,
// IQ2_XS, FP8_E4M3); other formats fall back to matvec's fp32 kernel.
bool has_matvec_q(quant::Type t);

// Whether matvec_q takes more than kMaxMatvecTokens activations of format t in one call, on
// tensor-core tiles with the mat-vec's bits (Q8_0).
bool has_matmul_tiles(quant::Type t);

// Empty when a kernel launch of grid [gx, gy, gz] blocks of [bx, by, bz] threads is within the
// hardware's limits (grid x up to 2^31 - 1, y and z up to 65535, 1..1024 threads a block, block z
// up to 64), else why not. Every launch of the backend is checked by it and refused with that
// reason, naming the kernel, instead of being launched out of range.
std::string launch_out_of_range(uint64_t gx, uint64_t gy, uint64_t gz, uint64_t bx, uint64_t by,
                                uint64_t bz);

// Bytes between consecutive activations in quantize_act's output: act_bytes rounded up to 16.
size_t quantized_act_stride(quant::ActFormat f, int64_t cols);

// Tuning knobs of matvec_q, for benchmarks and tests: results never depend on them.
struct MatvecQOptions {
  int rows_per_warp = 0;  // 4 or 8 (one activation); 0: the default, 4
  int grid_copies = 0;    // IQ2_XS codebook copies in shared memory: 1, 8 or 32; 0: the default, 1
  // The caller vouches that x holds what it held when the device last quantized it: if that last
  // quantization was of this x (address, columns, activations, format), its copy is reused.
  bool x_unchanged = false;
};

// One of several matrices of a matvec_q over one activation: rows of row_stride bytes, into y.
struct MatvecQMatrix {
  const void* w;
  size_t row_stride;
  int64_t rows;
  float* y;
};
constexpr int kMaxMatvecQMatrices = 4;

// One GPU: its stream and the decoder tables (i-quant codebooks) resident on it.
class Device {
 public:
  // Throws strata::Error("no CUDA device: ...") when there is no such device.
  explicit Device(int index = 0);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const;
  // For the backend's own launchers (launch.h); engine code has no use for it.
  const detail::DeviceContext& context() const;

  // Ops go to the device's main stream, or between fork_side() and resume_main() to a side stream
  // that first waits for everything queued on main so far; join_side() makes main wait for
  // everything queued on the side (nothing when no fork is unjoined). Between the fork and the
  // join the two run concurrently (each has its own matvec_q scratch); upload, download, copy and
  // synchronize use the stream ops go to now.
  void fork_side();
  void resume_main();
  void join_side();
  bool on_side() const;        // between fork_side() and resume_main() or join_side()
  bool side_unjoined() const;  // between fork_side() and join_side()

  void upload(void* dst, const void* src, size_t bytes);
  void download(void* dst, const void* src, size_t bytes);
  void copy(void* dst, const void* src, size_t bytes);  // device to device
  void synchronize();

  // out[0, n) = the n elements in `blocks`, bitwise equal to quant::kernels(t).dequantize.
  // n is a multiple of the format's block and of 8; out is 16-byte aligned.
  void dequantize(quant::Type t, const void* blocks, float* out, int64_t n);

  // y[r] = W[r,:] . x for r in [0, rows), fp32 activation, one warp per row with a fixed
  // reduction order (bitwise the same run to run). W's rows are row_stride bytes apart; cols is
  // a multiple of the format's block and of 8; x is 16-byte aligned. Relative to the exact sum
  // the error is at most (cols/32 + 5) * 2^-24 * sum_i |w_i x_i|.
  void matvec(quant::Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols,
              const float* x, float* y);

  // The mat-vec of the CPU backend (quant::matvec) on the device: the `tokens` activations
  // x[t * cols, +cols) are quantized once into a device scratch in the layout the CPU pairs with
  // the format (quant::kernels(t).act), then y[t * rows + r] = dot_ref(W[r,:], act_t, cols):
  // bitwise equal to the CPU for the formats of has_matvec_q (integer block sums, the CPU's float
  // order), deterministic, independent of the grid and of `tokens` (each activation's results
  // equal a one-activation call). Other formats: matvec per activation. tokens in
  // [1, kMaxMatvecTokens], or any positive count for the formats of has_matmul_tiles; cols a
  // multiple of the block; w and row_stride 2-byte aligned, x 16.
  // The scratch grows on first use of a larger shape (after draining the stream): warm up before
  // capturing a graph.
  void matvec_q(quant::Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols,
                const float* x, float* y, int tokens = 1, const MatvecQOptions& options = {});
  // The same for 1 to kMaxMatvecTokens activations against up to kMaxMatvecQMatrices matrices of
  // format t and `cols` columns (each y [tokens, rows] contiguous): x quantized once and, for the
  // formats of has_matvec_q, one launch for all of them; each y bitwise the one-matrix call's.
  void matvec_q(quant::Type t, std::span<const MatvecQMatrix> matrices, int64_t cols,
                const float* x, int tokens = 1, const MatvecQOptions& options = {});

  // x[t * cols, +cols) for t < tokens into activation layout f at out + t * quantized_act_stride,
  // bytes equal to quant::quantize_act_ref (F32: copied). cols a multiple of f's block, x
  // 16-byte aligned, out 16-byte aligned.
  void quantize_act(quant::ActFormat f, const float* x, void* out, int64_t cols, int tokens = 1);
  // out = the values the quantized activation encodes (quant::quantize_act in layout f of each
  // contiguous row of x, then dequantized): what the backend's matmul multiplies the weights with.
  // cols is a multiple of the layout's block; bitwise the CPU's quantize_act + dequantization.
  void act_round_trip(quant::ActFormat f, const float* x, float* out, int64_t rows, int64_t cols);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The backend on device `device_index` (throws strata::Error("no CUDA device: ...") without one).
std::unique_ptr<backend::Backend> make_cuda_backend(int device_index = 0);

}  // namespace strata::cuda

namespace strata::backend {

// backend::Backend on one GPU (docs/CUDA.md). Activations live in device memory taken from a
// stream-ordered pool; weights are uploaded by weight() once per file tensor. Ops are queued on
// the device's stream and never wait for the device, except where a result goes to the host
// (download, download_ids). Uploads go through a pinned staging ring (inside a recorded window:
// pinned buffers of the graph's own). Every op
// writes each output from one thread or warp in a fixed order: a T-row window equals T one-row
// windows bit for bit. Not thread-safe: one caller at a time, like the CPU backend.
class CudaBackend : public Backend {
 public:
  // Throws strata::Error("no CUDA device: ...") when there is no such device.
  explicit CudaBackend(int device_index = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  const cuda::DeviceInfo& device_info() const;
  // Bytes of weights uploaded by weight() (each file tensor once).
  size_t device_bytes_used() const;
  // Waits for every queued op (a CUDA error from one of them is thrown here).
  void synchronize();

  Tensor alloc(int64_t rows, int64_t cols) override;
  void release(Tensor t) override;
  void upload(const float* host, Tensor dst) override;
  void download(const Tensor& src, float* host) override;
  void fill(Tensor t, float value) override;
  void copy(const Tensor& src, Tensor dst) override;
  Tensor alloc_lasting(int64_t rows, int64_t cols) override;
  void set_rows(const Tensor& src, const Ids& rows, Tensor dst) override;
  Ids alloc_ids(int64_t rows, int64_t cols) override;
  void release_ids(Ids t) override;
  void upload_ids(const int32_t* host, Ids dst) override;
  void download_ids(const Ids& src, int32_t* host) override;
  // Uploads the whole file tensor on first use (a 3-D stack once, its slices pointing into it).
  Weight weight(const gguf::TensorInfo& tensor, int64_t slice = 0) override;
  // Expert cache slots in device memory, filled by copies from pinned buffers on a copy stream
  // (expert_slots.cpp).
  std::unique_ptr<ExpertSlots> alloc_expert_slots(size_t count, size_t slot_bytes) override;
  std::unique_ptr<ExpertSlots> alloc_host_tier(size_t count, size_t slot_bytes) override;
  std::optional<uint64_t> expert_memory_free() const override;

  void get_rows(const Weight& table, const Ids& ids, Tensor y) override;
  void matmul(const Weight& w, const Tensor& x, Tensor y) override;
  void matmuls(std::span<const Weight* const> ws, const Tensor& x,
               std::span<Tensor> ys) override;
  void rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor y) override;
  void l2_norm(const Tensor& x, int64_t group, float eps, Tensor y) override;
  void qk_l2_norm(const Tensor& x, int64_t group, float eps, int64_t q_cols, float q_scale,
                  Tensor y) override;
  void rms_norm_gated(Tensor x, const Weight& w, int64_t group, float eps, const Tensor& gate,
                      OutputGate kind) override;
  void signed_sqrt_dot(const Tensor& a, const Tensor& b, int64_t group, float scale,
                       Tensor y) override;
  void add(const Tensor& a, const Tensor& b, Tensor y) override;
  void add_rms_norm(Tensor x, const Tensor& delta, const Weight& w, float eps,
                    Tensor y) override;
  void scale(const Tensor& x, float s, Tensor y) override;
  void mul_sigmoid(const Tensor& x, const Tensor& gate, Tensor y) override;
  void add_mul_sigmoid(Tensor y, Tensor x, const Tensor& gate) override;
  void add_mul_sigmoid_residual(Tensor residual, Tensor y, Tensor x, const Tensor& gate) override;
  void add_mul_sigmoid_residual_rms_norm(Tensor residual, Tensor y, Tensor x, const Tensor& gate,
                                         const Weight& w, float eps, Tensor normed) override;
  void swiglu(const Tensor& gate, const Tensor& up, Tensor y) override;
  void scaled_silu(const Tensor& x, float s, Tensor y) override;
  void mean_mul_sigmoid_streams(const Tensor& x, Tensor gate, int64_t streams, Tensor y) override;
  void inject_streams(Tensor x, const Tensor& out, Tensor logits, float logit_scale) override;
  void split_groups(const Tensor& x, int64_t n_groups, std::span<const int64_t> widths,
                    std::span<Tensor> outs) override;
  void rope_neox(Tensor x, const Ids& positions, int64_t head_dim, int64_t rope_dim,
                 float theta) override;
  void kv_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v,
                const Ids& positions) override;
  void kv_write_sequences(std::span<const backend::SequenceCache> sequences, const Tensor& k,
                          const Tensor& v, const Ids& positions) override;
  void attention_sequences(const Tensor& q, std::span<const backend::SequenceCache> sequences,
                           const Ids& positions, int64_t n_head, int64_t n_head_kv,
                           int64_t head_dim, float scale, Tensor y) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const Ids& positions, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                 float scale, Tensor y) override;
  void attention_selected(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                          const Ids& selected, const Ids& counts, int64_t n_head,
                          int64_t n_head_kv, int64_t head_dim, float scale, Tensor y) override;
  void block_scores(const Tensor& q, const Tensor& keys, const Ids& positions, int64_t block,
                    int64_t n_head, int64_t head_dim, float scale, Tensor y) override;
  void block_mean(const Tensor& x, const Ids& firsts, int64_t block, Tensor y) override;
  void qsa_select(const Tensor& scores, const Ids& positions, int64_t block, int64_t top_blocks,
                  Ids selected, Ids counts) override;
  void conv1d_silu(const Tensor& x, Tensor state, const Weight& w, Tensor y) override;
  void conv1d_dilated_silu(const Tensor& x, Tensor state, const Weight& w, int64_t dilation,
                           Tensor y) override;
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, Tensor state, int64_t n_heads,
                        backend::HeadRepeat repeat, Tensor y) override;
  void conv1d_silu_sequences(const Tensor& x, std::span<const backend::SequenceState> sequences,
                             const Weight& w, Tensor y) override;
  void gated_delta_rule_sequences(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& g, const Tensor& beta,
                                  std::span<const backend::SequenceState> sequences,
                                  int64_t n_heads, backend::HeadRepeat repeat, Tensor y) override;
  void ssm_decay(const Tensor& a, const Weight& dt_bias, const Weight& ssm_a, Tensor g) override;
  void ssm_gates(const Tensor& b, const Tensor& a, const Weight& dt_bias, const Weight& ssm_a,
                 Tensor beta, Tensor g) override;
  // One kernel where the shape fits (detail::delta_net_recurrence_fits), else the ops one by one.
  void delta_net_recurrence(const backend::DeltaNetRecurrence& r, Tensor y) override;
  void route_softmax_topk(const Tensor& logits, bool renormalize, Ids experts,
                          Tensor weights) override;
  void moe_experts(const Tensor& x, const Ids& experts, const Tensor& weights,
                   std::span<const ExpertWeights> table, Tensor y) override;
  void moe_expert_outputs(const Tensor& x, const Ids& experts, std::span<const int64_t> pairs,
                          std::span<const ExpertWeights> table, Tensor out) override;
  void moe_combine(const Tensor& weights, const Tensor& out, Tensor y) override;
  void argmax(const Tensor& x, Ids index, Tensor prob) override;
  void top_k(const Tensor& x, Ids index, Tensor values) override;
  void sampling_sums(const Tensor& x, float temperature, Tensor sums) override;
  void draw(const Tensor& x, float temperature, const Tensor& uniforms, Ids index) override;

  // Windows of a key seen before are recorded as a CUDA graph and replayed (window_graphs.h).
  void begin_window(uint64_t key) override;
  void end_window(bool completed) override;
  void begin_host_step() override;
  void end_host_step() override;
  // A side branch runs on the device's side stream (Device::fork_side), recorded as a parallel
  // branch of the window's graph; op by op under STRATA_CUDA_PROFILE it is not opened.
  void begin_side_branch() override;
  void end_side_branch() override;
  void join_side_branch() override;
  BackendCounters counters() const override;

  struct Impl;  // cuda_backend_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::backend
