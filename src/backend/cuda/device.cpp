// Device query, device memory and the Device object: host code of the CUDA backend.
#include <cuda_runtime.h>

#include <cstring>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/ops.h"
#include "quant/formats/iq_common.h"

namespace strata::cuda {

using detail::check;

namespace {

// cudaGetDeviceCount fails (rather than reporting 0) when there is no driver or no device.
cudaError_t count_devices(int& n) {
  n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    n = 0;
    cudaGetLastError();  // the error is not sticky; clear it so later calls start clean
  }
  return err;
}

// Restores the calling thread's current device when it goes out of scope, so that querying or
// constructing a Device does not change which device the caller's own CUDA calls use.
class CurrentDevice {
 public:
  explicit CurrentDevice(int index) {
    check(cudaGetDevice(&saved_), "cudaGetDevice");
    check(cudaSetDevice(index), "cudaSetDevice");
  }
  ~CurrentDevice() { cudaSetDevice(saved_); }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int saved_ = 0;
};

}  // namespace

int device_count() {
  int n;
  count_devices(n);
  return n;
}

std::string unavailable_reason() {
  int n;
  const cudaError_t err = count_devices(n);
  if (err != cudaSuccess) return cat("no CUDA device: ", cudaGetErrorString(err));
  if (n == 0) return "no CUDA device: the driver reports none";
  return {};
}

DeviceInfo query_device(int index) {
  int n;
  const cudaError_t err = count_devices(n);
  if (err != cudaSuccess) fail("no CUDA device: ", cudaGetErrorString(err));
  if (index < 0 || index >= n) fail("no CUDA device: index ", index, " asked for, ", n, " present");
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.l2_bytes = size_t(prop.l2CacheSize);
  const CurrentDevice current(index);
  check(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo");
  return info;
}

// DeviceBuffer ------------------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&data_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA error in cudaMalloc of ", bytes, " bytes: ", cudaGetErrorString(err));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// Device ------------------------------------------------------------------------------------------

struct Device::Impl {
  DeviceInfo info;
  // The main stream and a side stream (fork_side); `stream` and context.stream are the one ops
  // are queued on now, `on` its index.
  cudaStream_t streams[2] = {nullptr, nullptr};
  cudaEvent_t forked = nullptr, joined = nullptr;
  int on = 0;
  bool forked_unjoined = false;  // fork_side ran and join_side has not
  cudaStream_t stream = nullptr;
  DeviceBuffer tables_memory;
  detail::DecodeTables tables{};
  detail::LaunchLimits limits{};
  // matvec_q's quantized activations, one scratch per stream (the two may run at once)
  DeviceBuffer act_scratch[2];
  detail::QuantizedAct act_in_scratch[2];
  detail::DeviceContext context;  // the above, for the backend's launchers

  ~Impl() {
    cudaSetDevice(info.index);
    for (cudaStream_t s : streams)
      if (s) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
    for (cudaEvent_t e : {forked, joined})
      if (e) cudaEventDestroy(e);
  }

  void queue_on(int s) {
    on = s;
    stream = context.stream = streams[s];
  }

  detail::MatvecQContext matvec_q_context() {
    return {info.index,  info.sm_count,      stream, tables, limits,
            act_scratch[on], act_in_scratch[on]};
  }

  // Every op makes this device current first: a thread may drive several devices.
  void use() const { check(cudaSetDevice(info.index), "cudaSetDevice"); }
};

Device::Device(int index) : impl_(std::make_unique<Impl>()) {
  impl_->info = query_device(index);
  impl_->use();
  for (cudaStream_t& s : impl_->streams)
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  for (cudaEvent_t* e : {&impl_->forked, &impl_->joined})
    check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
  impl_->stream = impl_->streams[0];

  // The i-quant codebooks, copied from the quant module's tables into one device allocation.
  const size_t n2xxs = sizeof(quant::iq::kIQ2XXSGrid), n2xs = sizeof(quant::iq::kIQ2XSGrid);
  const size_t n3xxs = sizeof(quant::iq::kIQ3XXSGrid), n4nl = sizeof(quant::iq::kIQ4NLValues);
  std::vector<uint8_t> host(n2xxs + n2xs + n3xxs + n4nl);
  std::memcpy(host.data(), quant::iq::kIQ2XXSGrid, n2xxs);
  std::memcpy(host.data() + n2xxs, quant::iq::kIQ2XSGrid, n2xs);
  std::memcpy(host.data() + n2xxs + n2xs, quant::iq::kIQ3XXSGrid, n3xxs);
  std::memcpy(host.data() + n2xxs + n2xs + n3xxs, quant::iq::kIQ4NLValues, n4nl);
  impl_->tables_memory = DeviceBuffer(host.size());
  upload(impl_->tables_memory.data(), host.data(), host.size());
  const auto* base = impl_->tables_memory.as<uint8_t>();
  impl_->tables.iq2xxs_grid = reinterpret_cast<const uint64_t*>(base);
  impl_->tables.iq2xs_grid = reinterpret_cast<const uint64_t*>(base + n2xxs);
  impl_->tables.iq3xxs_grid = reinterpret_cast<const uint32_t*>(base + n2xxs + n2xs);
  impl_->tables.iq4nl_values = reinterpret_cast<const int8_t*>(base + n2xxs + n2xs + n3xxs);

  // Kernels stride over their work, so a problem larger than the largest grid still runs; below
  // that, one unit of work per thread or warp lets the block scheduler balance the load.
  int max_grid = 0;
  check(cudaDeviceGetAttribute(&max_grid, cudaDevAttrMaxGridDimX, index), "cudaDeviceGetAttribute");
  impl_->limits.max_blocks = max_grid;
  impl_->context = {index, impl_->stream, impl_->tables, impl_->limits, impl_->info.sm_count};
}

Device::~Device() = default;

const DeviceInfo& Device::info() const { return impl_->info; }

const detail::DeviceContext& Device::context() const { return impl_->context; }

void Device::fork_side() {
  impl_->use();
  if (impl_->forked_unjoined) fail("CUDA fork_side: the side branch before is not joined");
  check(cudaEventRecord(impl_->forked, impl_->streams[0]), "fork_side");
  check(cudaStreamWaitEvent(impl_->streams[1], impl_->forked, 0), "fork_side");
  impl_->forked_unjoined = true;
  impl_->queue_on(1);
}

void Device::resume_main() { impl_->queue_on(0); }

bool Device::on_side() const { return impl_->on == 1; }

bool Device::side_unjoined() const { return impl_->forked_unjoined; }

void Device::join_side() {
  if (!impl_->forked_unjoined) return;
  impl_->use();
  impl_->queue_on(0);
  check(cudaEventRecord(impl_->joined, impl_->streams[1]), "join_side");
  check(cudaStreamWaitEvent(impl_->streams[0], impl_->joined, 0), "join_side");
  impl_->forked_unjoined = false;
}

void Device::upload(void* dst, const void* src, size_t bytes) {
  impl_->use();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, impl_->stream), "upload");
  check(cudaStreamSynchronize(impl_->stream), "upload");
}

void Device::download(void* dst, const void* src, size_t bytes) {
  impl_->use();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl_->stream), "download");
  check(cudaStreamSynchronize(impl_->stream), "download");
}

void Device::copy(void* dst, const void* src, size_t bytes) {
  impl_->use();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream), "copy");
}

void Device::synchronize() {
  impl_->use();
  check(cudaStreamSynchronize(impl_->stream), "synchronize");
}

void Device::dequantize(quant::Type t, const void* blocks, float* out, int64_t n) {
  impl_->use();
  detail::launch_dequantize(t, blocks, out, n, impl_->tables, impl_->limits, impl_->stream);
}

void Device::matvec(quant::Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols,
                    const float* x, float* y) {
  impl_->use();
  detail::launch_matvec(t, w, row_stride, rows, cols, x, y, impl_->tables, impl_->limits,
                        impl_->stream);
}

void Device::matvec_q(quant::Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols,
                      const float* x, float* y, int tokens, const MatvecQOptions& options) {
  impl_->use();
  const detail::MatvecQContext ctx = impl_->matvec_q_context();
  const MatvecQMatrix matrix{w, row_stride, rows, y};
  detail::run_matvec_q(t, {&matrix, 1}, cols, x, tokens, options, ctx);
}

void Device::matvec_q(quant::Type t, std::span<const MatvecQMatrix> matrices, int64_t cols,
                      const float* x, int tokens, const MatvecQOptions& options) {
  impl_->use();
  detail::run_matvec_q(t, matrices, cols, x, tokens, options, impl_->matvec_q_context());
}

void Device::quantize_act(quant::ActFormat f, const float* x, void* out, int64_t cols,
                          int tokens) {
  impl_->use();
  detail::launch_quantize_act(f, x, cols, tokens, out, quantized_act_stride(f, cols),
                              impl_->limits, impl_->stream);
}

}  // namespace strata::cuda

namespace strata::cuda {

void Device::act_round_trip(quant::ActFormat f, const float* x, float* out, int64_t rows,
                            int64_t cols) {
  impl_->use();
  if (rows < 0 || cols < 0 || cols % quant::act_block_elems(f) != 0)
    fail("CUDA quantize_act: [", rows, " x ", cols, "] is not whole blocks of ",
         quant::act_block_elems(f));
  detail::launch_quantize_act(impl_->context, f,
                              backend::Tensor{const_cast<float*>(x), rows, cols, cols}, out);
}

}  // namespace strata::cuda
