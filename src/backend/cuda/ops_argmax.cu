// The greedy choice of each row on the device (Backend::argmax; CPU reference: cpu/ops_argmax.cpp).
// One block per row: each thread scans its strided columns, then the block reduces the (value,
// column) pairs, so the index is exactly the CPU's (comparisons are exact; ties go to the lower
// column). The probability's sum is a float tree, within rounding of the CPU's double sum.
#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// Whether candidate (v, i) beats (best, at): a real column beats none, then the larger value,
// then the lower column.
__device__ __forceinline__ bool beats(float v, int32_t i, float best, int32_t at) {
  if (i < 0) return false;
  if (at < 0) return true;
  return v > best || (v == best && i < at);
}

__global__ void argmax_kernel(const float* __restrict__ x, int64_t stride, int64_t rows,
                              int64_t cols, int32_t* index, float* prob, int64_t prob_stride) {
  await_previous_kernel();
  __shared__ float warp_value[kWarps];
  __shared__ int32_t warp_index[kWarps];
  __shared__ float warp_sum[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = x + r * stride;
    float best = 0.0f;
    int32_t at = -1;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads)
      if (!isnan(row[c]) && beats(row[c], int32_t(c), best, at)) best = row[c], at = int32_t(c);
    for (int offset = 16; offset > 0; offset /= 2) {
      const float v = __shfl_xor_sync(kFullMask, best, offset);
      const int32_t i = __shfl_xor_sync(kFullMask, at, offset);
      if (beats(v, i, best, at)) best = v, at = i;
    }
    if (lane == 0) warp_value[warp] = best, warp_index[warp] = at;
    __syncthreads();
    best = warp_value[0], at = warp_index[0];
    for (int w = 1; w < kWarps; ++w)
      if (beats(warp_value[w], warp_index[w], best, at)) best = warp_value[w], at = warp_index[w];
    float sum = 0.0f;
    if (prob && at >= 0 && isfinite(best))
      for (int64_t c = threadIdx.x; c < cols; c += kThreads)
        if (!isnan(row[c])) sum = __fadd_rn(sum, expf(__fsub_rn(row[c], best)));
    for (int offset = 16; offset > 0; offset /= 2)
      sum = __fadd_rn(sum, __shfl_xor_sync(kFullMask, sum, offset));
    if (lane == 0) warp_sum[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int w = 0; w < kWarps; ++w) total = __fadd_rn(total, warp_sum[w]);
      index[r] = at;
      if (prob) prob[r * prob_stride] = at >= 0 && isfinite(best) ? __fdiv_rn(1.0f, total) : 1.0f;
    }
    __syncthreads();  // the shared slots are the next row's
  }
}

}  // namespace

void launch_argmax(const DeviceContext& ctx, const Tensor& x, int32_t* index, Tensor prob) {
  if (x.rows == 0) return;
  launch_kernel(argmax_kernel, grid_for(x.rows, 1, ctx.limits.max_blocks), kThreads, 0, ctx.stream,
                x.data, x.stride, x.rows, x.cols, index, prob.rows > 0 ? prob.data : nullptr,
                prob.stride);
  STRATA_CUDA_CHECK_LAUNCH("argmax_kernel");
}

}  // namespace strata::cuda::detail
