// The CUDA backend as the engine sees it: plain C++, no CUDA header or type, so engine code and
// the tests build the same whether or not the backend is compiled in (STRATA_HAVE_CUDA).
//
// Pointers passed to Device ops are device pointers (DeviceBuffer::data()). Ops are queued in
// order on the Device's stream; upload/download wait for their copy, everything else is
// asynchronous until synchronize(). Failures throw strata::Error naming the CUDA call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "quant/kernels.h"
#include "quant/types.h"

namespace strata::cuda {

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

// Bytes between consecutive activations in quantize_act's output: act_bytes rounded up to 16.
size_t quantized_act_stride(quant::ActFormat f, int64_t cols);

// Tuning knobs of matvec_q, for benchmarks and tests: results never depend on them.
struct MatvecQOptions {
  int rows_per_warp = 0;  // 4 or 8 (one activation); 0: the default, 4
  int grid_copies = 0;    // IQ2_XS codebook copies in shared memory: 1, 8 or 32; 0: the default, 1
};

// One GPU: its stream and the decoder tables (i-quant codebooks) resident on it.
class Device {
 public:
  // Throws strata::Error("no CUDA device: ...") when there is no such device.
  explicit Device(int index = 0);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const;

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
  // [1, kMaxMatvecTokens]; cols a multiple of the block; w and row_stride 2-byte aligned, x 16.
  // The scratch grows on first use of a larger shape (after draining the stream): warm up before
  // capturing a graph.
  void matvec_q(quant::Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols,
                const float* x, float* y, int tokens = 1, const MatvecQOptions& options = {});

  // x[t * cols, +cols) for t < tokens into activation layout f at out + t * quantized_act_stride,
  // bytes equal to quant::quantize_act_ref (F32: copied). cols a multiple of f's block, x
  // 16-byte aligned, out 16-byte aligned.
  void quantize_act(quant::ActFormat f, const float* x, void* out, int64_t cols, int tokens = 1);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cuda
