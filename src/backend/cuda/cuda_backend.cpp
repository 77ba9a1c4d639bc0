// CudaBackend: device memory (tensors, ids, weights), the staging ring for host spans, and the
// factory. The ops are in cuda_backend_ops.cpp and cuda_backend_moe.cpp.
#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "gguf/gguf.h"
#include "quant/types.h"

namespace strata::backend {

namespace {

constexpr size_t kStagingHalf = size_t(1) << 20;  // grows on demand
constexpr size_t kStagingAlign = 16;

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// FNV-1a over the first and last 256 bytes: with the address, name, type and shape it tells a
// tensor from a different one mapped later at the same address (another model file).
uint64_t sample_hash(const uint8_t* p, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const uint8_t* q, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ q[i]) * 1099511628211ull;
  };
  const size_t head = std::min<size_t>(bytes, 256);
  mix(p, head);
  mix(p + bytes - std::min(bytes - head, size_t(256)), std::min(bytes - head, size_t(256)));
  return h;
}

void check_ids(const char* op, const char* name, const Ids& ids) {
  require(ids.rows >= 0 && ids.cols >= 0 && (ids.data || ids.size() == 0), op, name, " [",
          ids.rows, " x ", ids.cols, "] has a bad shape or no storage");
}

}  // namespace

// Staging ------------------------------------------------------------------------------------------

Staging::Staging(const cuda::detail::DeviceContext& ctx) : ctx_(ctx) {
  for (cudaEvent_t& e : left_)
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  allocate(kStagingHalf);
}

Staging::~Staging() {
  cudaStreamSynchronize(ctx_.stream);
  release();
  for (cudaEvent_t e : left_) cudaEventDestroy(e);
}

void Staging::allocate(size_t half_bytes) {
  STRATA_CUDA_CHECK(cudaMallocHost(&host_, 2 * half_bytes));
  STRATA_CUDA_CHECK(cudaMalloc(&device_, 2 * half_bytes));
  half_bytes_ = half_bytes;
  half_ = 0;
  used_ = 0;
}

void Staging::release() {
  if (host_) cudaFreeHost(host_);
  if (device_) cudaFree(device_);
  host_ = device_ = nullptr;
}

const void* Staging::put(const void* host, size_t bytes) {
  const size_t need = round_up(std::max<size_t>(bytes, 1), kStagingAlign);
  if (need > half_bytes_) {  // rare: a span larger than half the ring; grow it
    STRATA_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    release();
    allocate(round_up(need, kStagingHalf));
  } else if (used_ + need > half_bytes_) {
    STRATA_CUDA_CHECK(cudaEventRecord(left_[half_], ctx_.stream));
    half_ ^= 1;
    STRATA_CUDA_CHECK(cudaEventSynchronize(left_[half_]));
    used_ = 0;
  }
  const size_t at = size_t(half_) * half_bytes_ + used_;
  used_ += need;
  if (bytes > 0) {
    std::memcpy(host_ + at, host, bytes);
    STRATA_CUDA_CHECK(
        cudaMemcpyAsync(device_ + at, host_ + at, bytes, cudaMemcpyHostToDevice, ctx_.stream));
  }
  return device_ + at;
}

// Scratch ------------------------------------------------------------------------------------------

Scratch::Scratch(cudaStream_t stream, size_t bytes) : stream_(stream) {
  STRATA_CUDA_CHECK(cudaMallocAsync(&ptr_, std::max<size_t>(bytes, 256), stream));
}

Scratch::~Scratch() { cudaFreeAsync(ptr_, stream_); }

// Impl ---------------------------------------------------------------------------------------------

CudaBackend::Impl::Impl(int device_index)
    : device(device_index), ctx(device.context()), staging(ctx), graphs(ctx) {
  // Keep freed pool memory for reuse instead of returning it at every synchronization.
  cudaMemPool_t pool;
  STRATA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_index));
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  STRATA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

CudaBackend::Impl::~Impl() {
  cudaSetDevice(ctx.index);
  pending_combine.reset();  // (a window given up mid-way: its scratch freed while the stream is)
  for (void* p : allocations) cudaFreeAsync(p, ctx.stream);
  for (auto& [key, table] : expert_tables) cudaFreeAsync(table.device, ctx.stream);
  cudaStreamSynchronize(ctx.stream);
}

void CudaBackend::Impl::check_device_weight(const char* op, const char* name,
                                            const Weight& w) const {
  // The bytes the weight's rows cover: a one-row view of a longer row (qwen4exp's per-stream
  // norm gains) ends with its own columns, not a whole stride.
  const auto* p = static_cast<const uint8_t*>(w.data);
  const size_t bytes = w.rows <= 0 || w.cols <= 0
                           ? 1
                           : size_t(w.rows - 1) * w.row_stride + quant::row_bytes(w.type, w.cols);
  auto it = upload_ranges.upper_bound(p);
  const bool inside = it != upload_ranges.begin() && p >= std::prev(it)->first &&
                      p + bytes <= std::prev(it)->first + std::prev(it)->second;
  require(p && inside, op, name, " is not device memory from this backend's weight() (",
          bytes, " bytes at ", static_cast<const void*>(p), ")");
}

// CudaBackend --------------------------------------------------------------------------------------

CudaBackend::CudaBackend(int device_index) : impl_(std::make_unique<Impl>(device_index)) {}

CudaBackend::~CudaBackend() = default;

const cuda::DeviceInfo& CudaBackend::device_info() const { return impl_->device.info(); }

size_t CudaBackend::device_bytes_used() const { return impl_->upload_bytes; }

void CudaBackend::synchronize() {
  impl_->flush_combine();
  impl_->join_side();
  impl_->device.synchronize();
}

void CudaBackend::begin_window(uint64_t key) {
  impl_->flush_combine();
  impl_->join_side();
  impl_->end_matmul_chain();
  impl_->graphs.begin(key);
}

void CudaBackend::end_window(bool completed) {
  impl_->flush_combine();
  impl_->join_side();
  impl_->end_matmul_chain();
  impl_->graphs.end(completed);
}
void CudaBackend::begin_host_step() {
  impl_->flush_combine();
  impl_->join_side();
  impl_->end_matmul_chain();
  impl_->graphs.begin_host_step();
}

void CudaBackend::end_host_step() {
  impl_->flush_combine();
  impl_->join_side();
  impl_->end_matmul_chain();
  impl_->graphs.end_host_step();
}

namespace {

// STRATA_CUDA_SIDE_BRANCHES=0 keeps every op on the main stream (A/B in one binary).
bool side_branches_enabled() {
  static const bool enabled = cuda::detail::env_switch_on("STRATA_CUDA_SIDE_BRANCHES");
  return enabled;
}

}  // namespace

// (The matmul chain ends at every switch: each stream quantizes into its own scratch, so an x
// quantized on one is not in the other's.)
void CudaBackend::begin_side_branch() {
  if (impl_->graphs.replaying() || impl_->graphs.profiling() || !side_branches_enabled()) return;
  impl_->flush_combine();
  impl_->join_side();
  impl_->end_matmul_chain();
  impl_->device.fork_side();
}

void CudaBackend::end_side_branch() {
  if (!impl_->device.on_side()) return;
  impl_->settle();
  impl_->device.resume_main();
}

void CudaBackend::join_side_branch() { impl_->join_side(); }

void CudaBackend::Impl::join_side() {
  if (!device.side_unjoined()) return;
  end_matmul_chain();
  device.join_side();
}

BackendCounters CudaBackend::counters() const { return impl_->graphs.counters(); }

Tensor CudaBackend::alloc(int64_t rows, int64_t cols) {
  require(rows >= 0 && cols >= 0, "alloc", "bad shape [", rows, " x ", cols, "]");
  return {static_cast<float*>(impl_->allocate("alloc", rows, cols, sizeof(float))), rows, cols,
          cols};
}

Tensor CudaBackend::alloc_lasting(int64_t rows, int64_t cols) {
  require(rows >= 0 && cols >= 0, "alloc_lasting", "bad shape [", rows, " x ", cols, "]");
  // A capture would record the allocation as a graph node, a replay would skip it.
  const WindowGraphs::Mode mode = impl_->graphs.mode();
  if (mode == WindowGraphs::Mode::Capture || mode == WindowGraphs::Mode::Replay)
    fail("internal error: alloc_lasting [", rows, " x ", cols, "] in a recorded window (only its "
         "key's first window may allocate what outlives it)");
  return {static_cast<float*>(impl_->allocate("alloc_lasting", rows, cols, sizeof(float), true)),
          rows, cols, cols};
}

void* CudaBackend::Impl::allocate(const char* op, int64_t rows, int64_t cols, size_t size,
                                  bool lasting) {
  const size_t bytes = size_t(rows) * size_t(cols) * size;
  settle();
  if (!lasting)
    if (void* p = graphs.alloc(bytes)) return p;  // inside a window: its arena, zeroed
  STRATA_CUDA_CHECK(cudaSetDevice(ctx.index));
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, std::max<size_t>(bytes, 256), ctx.stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail(op, ": out of device memory for [", rows, " x ", cols, "] (", bytes,
         " bytes): ", cudaGetErrorString(err));
  }
  STRATA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx.stream));
  allocations.insert(p);
  return p;
}

void CudaBackend::Impl::free(const char* op, void* p, const char* kind, int64_t rows, int64_t cols) {
  settle();
  if (graphs.release(p)) return;
  if (allocations.erase(p) != 1)  // (the message only now: a window releases ~1000 temporaries)
    fail(op, ": ", kind, " [", rows, " x ", cols, "] was not allocated by this backend (or is a view)");
  STRATA_CUDA_CHECK(cudaFreeAsync(p, ctx.stream));
}

void CudaBackend::release(Tensor t) { impl_->free("release", t.data, "tensor", t.rows, t.cols); }

void CudaBackend::upload(const float* host, Tensor dst) {
  check_tensor("upload", "dst", dst);
  if (dst.rows == 0 || dst.cols == 0) return;
  impl_->settle();
  const size_t width = size_t(dst.cols) * sizeof(float), bytes = width * size_t(dst.rows);
  if (dst.stride == dst.cols && impl_->graphs.upload(dst.data, host, bytes)) return;
  const void* src = impl_->staging.put(host, bytes);  // the host buffer may go once we return
  STRATA_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, size_t(dst.stride) * sizeof(float), src, width,
                                      width, size_t(dst.rows), cudaMemcpyDeviceToDevice,
                                      impl_->ctx.stream));
}

void CudaBackend::download(const Tensor& src, float* host) {
  check_tensor("download", "src", src);
  impl_->flush_combine();
  impl_->join_side();
  impl_->graphs.readback("download");
  if (src.rows == 0 || src.cols == 0) return;
  const size_t width = size_t(src.cols) * sizeof(float);
  STRATA_CUDA_CHECK(cudaMemcpy2DAsync(host, width, src.data, size_t(src.stride) * sizeof(float),
                                      width, size_t(src.rows), cudaMemcpyDeviceToHost,
                                      impl_->ctx.stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(impl_->ctx.stream));
}

void CudaBackend::fill(Tensor t, float value) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor("fill", "t", t);
  cuda::detail::launch_fill(impl_->ctx, t, value);
}

void CudaBackend::copy(const Tensor& src, Tensor dst) {
  constexpr const char* op = "copy";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "src", src);
  check_tensor(op, "dst", dst);
  check_same_shape(op, "src", src, "dst", dst);
  if (src.data == dst.data && src.stride == dst.stride) return;
  if (!overlaps(src, dst)) return cuda::detail::launch_copy(impl_->ctx, src, dst);
  // Views of one tensor whose address ranges interleave (columns of one row block, as the
  // hyper-connection streams are) or truly overlap: through a temporary, as memmove would.
  const Scratch tmp(impl_->ctx.stream, size_t(src.rows * src.cols) * sizeof(float));
  const Tensor t{tmp.as<float>(), src.rows, src.cols, src.cols};
  cuda::detail::launch_copy(impl_->ctx, src, t);
  cuda::detail::launch_copy(impl_->ctx, t, dst);
}

Ids CudaBackend::alloc_ids(int64_t rows, int64_t cols) {
  require(rows >= 0 && cols >= 0, "alloc_ids", "bad shape [", rows, " x ", cols, "]");
  return {static_cast<int32_t*>(impl_->allocate("alloc_ids", rows, cols, sizeof(int32_t))), rows,
          cols};
}

void CudaBackend::release_ids(Ids t) {
  impl_->free("release_ids", t.data, "ids", t.rows, t.cols);
}

void CudaBackend::upload_ids(const int32_t* host, Ids dst) {
  check_ids("upload_ids", "dst", dst);
  if (dst.size() == 0) return;
  impl_->settle();
  const size_t bytes = size_t(dst.size()) * sizeof(int32_t);
  if (impl_->graphs.upload(dst.data, host, bytes)) return;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst.data, impl_->staging.put(host, bytes), bytes,
                                    cudaMemcpyDeviceToDevice, impl_->ctx.stream));
}

void CudaBackend::download_ids(const Ids& src, int32_t* host) {
  check_ids("download_ids", "src", src);
  impl_->flush_combine();
  impl_->join_side();
  impl_->graphs.readback("download_ids");
  if (src.size() == 0) return;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(host, src.data, size_t(src.size()) * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, impl_->ctx.stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(impl_->ctx.stream));
}

namespace {

// A stack of expert matrices whose rows are only 2-byte aligned (IQ2_XS rows of three 74-byte
// blocks, the flagship's down projections) is laid out on the device with its rows a multiple of
// 16 bytes apart (zero padding after each): the mat-vecs then copy those rows to shared memory
// with cp.async in 16-byte units where they had to use 2-byte loads, and waited for each (the
// flagship's expert down projection: 27 us a layer on an H100, its DRAM 6% busy). Other tensors
// keep the file's layout.
size_t device_row_stride(size_t dims, size_t file_stride) {
  return dims == 3 && file_stride % 4 != 0 ? (file_stride + 15) / 16 * 16 : file_stride;
}

// `rows` rows of `src` (src_stride bytes apart) to dst at dst_stride (> src_stride), the padding
// zeroed, through a host buffer of whole rows, about 64 MiB at a time.
void upload_restrided(cuda::Device& device, uint8_t* dst, size_t dst_stride, const uint8_t* src,
                      size_t src_stride, int64_t rows) {
  const int64_t batch = std::max<int64_t>(1, int64_t((64u << 20) / dst_stride));
  std::vector<uint8_t> host(size_t(std::min(batch, rows)) * dst_stride, 0);
  for (int64_t r0 = 0; r0 < rows; r0 += batch) {
    const int64_t n = std::min(batch, rows - r0);
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(host.data() + size_t(r) * dst_stride, src + size_t(r0 + r) * src_stride,
                  src_stride);
    device.upload(dst + size_t(r0) * dst_stride, host.data(), size_t(n) * dst_stride);
  }
}

}  // namespace

Weight CudaBackend::weight(const gguf::TensorInfo& tensor, int64_t slice) {
  const size_t dims = tensor.shape.size();
  if (dims < 1 || dims > 3)
    fail("weight ", tensor.name, ": shape ", tensor.shape_string(),
         " is not a vector, a matrix or a stack of matrices");
  if (!tensor.data) fail("weight ", tensor.name, ": the tensor has no data (not mapped)");
  const int64_t n_slices = dims == 3 ? tensor.shape[2] : 1;
  if (slice < 0 || slice >= n_slices)
    fail("weight ", tensor.name, ": slice ", slice, " is outside ", tensor.shape_string(), " (",
         n_slices, " slice", n_slices == 1 ? "" : "s", ")");
  Weight w;
  w.type = tensor.type;
  w.cols = tensor.shape[0];
  w.rows = dims >= 2 ? tensor.shape[1] : 1;
  const size_t file_stride = tensor.row_stride();
  w.row_stride = device_row_stride(dims, file_stride);
  const size_t slice_bytes = size_t(w.rows) * w.row_stride;
  const size_t bytes = slice_bytes * size_t(n_slices);
  const size_t file_bytes = size_t(w.rows) * file_stride * size_t(n_slices);
  const UploadKey key{tensor.data, file_bytes, int(tensor.type), tensor.name, tensor.shape,
                      sample_hash(tensor.data, file_bytes)};
  auto it = impl_->uploads.find(key);
  if (it == impl_->uploads.end()) {
    STRATA_CUDA_CHECK(cudaSetDevice(impl_->ctx.index));
    cuda::DeviceBuffer buffer;
    try {
      buffer = cuda::DeviceBuffer(bytes);
    } catch (const Error& e) {
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      fail("weight ", tensor.name, ": cannot place ", bytes, " bytes on ", device_info().name,
           " (", free, " bytes free, ", impl_->upload_bytes,
           " already taken by weights); run on the CPU or give the experts a memory budget (",
           e.what(), ")");
    }
    if (w.row_stride == file_stride)
      impl_->device.upload(buffer.data(), tensor.data, bytes);
    else
      upload_restrided(impl_->device, buffer.as<uint8_t>(), w.row_stride,
                       static_cast<const uint8_t*>(tensor.data), file_stride,
                       int64_t(w.rows) * n_slices);
    impl_->upload_ranges[buffer.as<uint8_t>()] = bytes;
    impl_->upload_bytes += bytes;
    it = impl_->uploads.emplace(key, std::move(buffer)).first;
  }
  w.data = it->second.as<uint8_t>() + size_t(slice) * slice_bytes;
  return w;
}

}  // namespace strata::backend

namespace strata::cuda {

std::unique_ptr<backend::Backend> make_cuda_backend(int device_index) {
  return std::make_unique<backend::CudaBackend>(device_index);
}

}  // namespace strata::cuda
