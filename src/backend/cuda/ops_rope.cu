// NeoX rotary embedding in place: one thread per (row, head, rotated pair index) (a decode row
// is a few hundred threads; each takes its own cos and sin rather than walking the heads). inv_freq comes from the host (the CPU's own fp32 computation); the angle is the fp32
// product, cos and sin are taken in double and rounded to float as the CPU does, and the rotation
// is two products and one add each, never fused.
#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 128;

__global__ void rope_neox_kernel(float* x, int64_t stride, int64_t rows, int64_t n_heads,
                                 int64_t head_dim, int64_t half,
                                 const int32_t* __restrict__ positions,
                                 const float* __restrict__ inv_freq) {
  await_previous_kernel();
  const int64_t n = rows * n_heads * half;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = u / (n_heads * half), h = u / half % n_heads, i = u % half;
    float* v = x + r * stride + h * head_dim;
    const float a = v[i], b = v[i + half];  // (issued before the trigonometry)
    const float angle = __fmul_rn(float(positions[r]), inv_freq[i]);
    const float c = float(cos(double(angle)));
    const float s = float(sin(double(angle)));
    v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

}  // namespace

void launch_rope_neox(const DeviceContext& ctx, Tensor x, const int32_t* positions,
                      const float* inv_freq, int64_t head_dim, int64_t rope_dim) {
  const int64_t half = rope_dim / 2;
  if (x.rows == 0 || x.cols == 0) return;
  const int64_t n_heads = x.cols / head_dim;
  launch_kernel(rope_neox_kernel,
                grid_for(x.rows * n_heads * half, kThreads, ctx.limits.max_blocks), kThreads, 0,
                ctx.stream, x.data, x.stride, x.rows, n_heads, head_dim, half, positions,
                inv_freq);
  STRATA_CUDA_CHECK_LAUNCH("rope_neox_kernel");
}

}  // namespace strata::cuda::detail
