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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cuda
