// Each row's softmax sum at a temperature on the device (Backend::sampling_sums; CPU reference:
// cpu/ops_sampling_sums.cpp), what top-p sampling without top-k reads besides the row's
// candidates, and each row's plain temperature draw (Backend::draw). One block per row: the row's
// largest value, then one thread per chunk of kSumChunk columns adds its weights in column order,
// then one thread adds the chunks' sums in order (or picks the draw's chunk and column): the
// reference's order, with sampling_weight.h's operations, so the results are its bits.
#include <cmath>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/sampling_weight.h"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 1024;

// Row `row`'s largest non-NaN value (the return value, in every thread) and its chunk sums into
// chunk_sum[0 .. chunks): one thread per chunk adds its weights in column order.
__device__ float row_chunk_sums(const float* __restrict__ row, int64_t cols, float temperature, float* chunk_sum) {
  __shared__ float warp_max[kThreads / 32];
  __shared__ float row_max;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) m = fmaxf(m, row[c]);  // fmaxf skips NaN
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float all = -INFINITY;
    for (int w = 0; w < kThreads / 32; ++w) all = fmaxf(all, warp_max[w]);
    row_max = all;
  }
  __syncthreads();
  const float max = row_max;
  const int64_t chunks = (cols + backend::kSumChunk - 1) / backend::kSumChunk;
  for (int64_t chunk = threadIdx.x; chunk < chunks; chunk += kThreads) {
    const int64_t begin = chunk * backend::kSumChunk;
    const int64_t end = begin + backend::kSumChunk < cols ? begin + backend::kSumChunk : cols;
    float sum = 0.0f;
#pragma unroll 8
    for (int64_t c = begin; c < end; ++c) {
      const float v = row[c];
      if (!isnan(v)) sum = __fadd_rn(sum, backend::sampling_weight(v, max, temperature));
    }
    chunk_sum[chunk] = sum;
  }
  __syncthreads();
  return max;
}

__global__ void sampling_sums_kernel(const float* __restrict__ x, int64_t stride, int64_t rows, int64_t cols,
                                     float temperature, float* sums, int64_t sums_stride) {
  await_previous_kernel();
  extern __shared__ float chunk_sum[];
  const int64_t chunks = (cols + backend::kSumChunk - 1) / backend::kSumChunk;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    row_chunk_sums(x + r * stride, cols, temperature, chunk_sum);
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int64_t chunk = 0; chunk < chunks; ++chunk) total = __fadd_rn(total, chunk_sum[chunk]);
      sums[r * sums_stride] = total;
    }
    __syncthreads();  // chunk_sum is the next row's
  }
}

// Plain temperature draws: the chunk sums as above, one thread picks the chunk, the chunk's
// columns' weights go to shared memory (a thread each), one thread picks the column: the steps
// of sampling_weight.h's draw_row, so the host's token.
__global__ void draw_kernel(const float* __restrict__ x, int64_t stride, int64_t rows, int64_t cols,
                            float temperature, const float* __restrict__ uniforms, int64_t uniforms_stride,
                            int32_t* index) {
  static_assert(backend::kSumChunk <= kThreads, "a thread per column of a chunk");
  await_previous_kernel();
  extern __shared__ float chunk_sum[];
  __shared__ float weights[backend::kSumChunk];
  __shared__ backend::ChunkPick pick;
  const int64_t chunks = (cols + backend::kSumChunk - 1) / backend::kSumChunk;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = x + r * stride;
    const float max = row_chunk_sums(row, cols, temperature, chunk_sum);
    if (threadIdx.x == 0) pick = backend::pick_chunk(chunk_sum, chunks, uniforms[r * uniforms_stride]);
    __syncthreads();
    const backend::ChunkPick p = pick;
    const int64_t first = p.chunk * backend::kSumChunk;
    const int64_t n = cols - first < backend::kSumChunk ? cols - first : backend::kSumChunk;
    if (p.chunk >= 0 && threadIdx.x < n) {
      const float v = row[first + threadIdx.x];
      weights[threadIdx.x] = isnan(v) ? 0.0f : backend::sampling_weight(v, max, temperature);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t i = p.chunk >= 0 ? backend::pick_column(weights, n, p) : -1;
      index[r] = i < 0 ? -1 : int32_t(first + i);
    }
    __syncthreads();  // chunk_sum, pick and weights are the next row's
  }
}

}  // namespace

// The 48 KiB a block may use without opting in, less 2 KiB for the kernels' static arrays.
int64_t sampling_sums_max_cols() { return int64_t((46 * 1024) / sizeof(float)) * backend::kSumChunk; }

void launch_draw(const DeviceContext& ctx, const Tensor& x, float temperature, const Tensor& uniforms,
                 int32_t* index) {
  if (x.rows == 0) return;
  const size_t shared = size_t((x.cols + backend::kSumChunk - 1) / backend::kSumChunk) * sizeof(float);
  launch_kernel(draw_kernel, grid_for(x.rows, 1, ctx.limits.max_blocks), kThreads, shared, ctx.stream, x.data,
                x.stride, x.rows, x.cols, temperature, uniforms.data, uniforms.stride, index);
  STRATA_CUDA_CHECK_LAUNCH("draw_kernel");
}

void launch_sampling_sums(const DeviceContext& ctx, const Tensor& x, float temperature, Tensor sums) {
  if (x.rows == 0) return;
  const size_t shared = size_t((x.cols + backend::kSumChunk - 1) / backend::kSumChunk) * sizeof(float);
  launch_kernel(sampling_sums_kernel, grid_for(x.rows, 1, ctx.limits.max_blocks), kThreads, shared, ctx.stream,
                x.data, x.stride, x.rows, x.cols, temperature, sums.data, sums.stride);
  STRATA_CUDA_CHECK_LAUNCH("sampling_sums_kernel");
}

}  // namespace strata::cuda::detail
