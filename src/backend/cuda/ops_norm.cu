// Norms and the PLE gate: one half-warp per group. The sums run in the CPU's lane order
// (half_warp_dot), and the rest is the CPU's expressions with IEEE division and square root, so
// these ops are bitwise the CPU backend's. A norm's gains for group g start at w + g * w_step
// (w_step 0: every group has w's).
#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kHalvesPerBlock = kThreads / 16;
// Groups from this wide take a block each (rms_norm_wide_kernel), up to what shared memory holds.
constexpr int64_t kWideGroup = 1024;
constexpr int64_t kWideGroupMax = 8 * 1024;
constexpr int kBatch = 8;  // loads a thread of rms_norm_wide_kernel issues together

// Runs fn(r, g, valid) for every group g of every row r, one half-warp each. Both halves of a warp
// always run fn together (the dot's shuffles need all 32 lanes); `valid` is false for the idle half
// of the last warp.
template <typename Fn>
__device__ __forceinline__ void for_half_warp_groups(int64_t rows, int64_t n_groups, Fn fn) {
  const int64_t units = rows * n_groups;
  const int64_t half = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 16;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x / 16;
  // Warp-uniform loop: the two halves of a warp are half and half ^ 1 and step together.
  for (int64_t u = half; u - (half & 1) < units; u += stride) {
    const bool valid = u < units;
    fn(valid ? u / n_groups : 0, valid ? u % n_groups : 0, valid);
  }
}

// With an output gate (rms_norm_gated), y then takes the gate: silu(gate) * y or y * sigmoid(gate).
__global__ void rms_norm_kernel(const float* x, int64_t x_stride, int64_t rows, int64_t n_groups,
                                int64_t group, const float* __restrict__ w, int64_t w_step,
                                float eps, float* y, int64_t y_stride, NormGate gate) {
  await_previous_kernel();
  for_half_warp_groups(rows, n_groups, [&](int64_t r, int64_t g, bool valid) {
    const float* xg = x + r * x_stride + g * group;
    const float ss = half_warp_dot(xg, xg, valid ? group : 0);
    if (!valid) return;
    const float mean = __fdiv_rn(ss, float(group));
    const float s = __fdiv_rn(1.0f, sqrtf(__fadd_rn(mean, eps)));
    float* yg = y + r * y_stride + g * group;
    const float* wg = w ? w + g * w_step : nullptr;
    const float* gg = gate.p ? gate.p + r * gate.stride + g * group : nullptr;
    for (int64_t i = threadIdx.x & 15; i < group; i += 16) {
      float v = __fmul_rn(xg[i], s);
      if (wg) v = __fmul_rn(v, wg[i]);
      if (gg) v = gate.kind == backend::OutputGate::Silu ? swiglu_value(gg[i], v) : __fmul_rn(v, sigmoid_value(gg[i]));
      yg[i] = v;
    }
  });
}

// What is added to x before a wide norm (x then holds the sum): nothing, delta (add_rms_norm), or
// the sum y + shared * sigmoid(gate), which y also takes (add_mul_sigmoid_residual: the same
// expressions as add_mul_sigmoid_kernel's). gate: per row (one column) or per element.
enum class Residual { None, Delta, GatedShared };
struct ResidualIn {
  const float* delta = nullptr;
  int64_t delta_stride = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  const float* shared = nullptr;
  int64_t shared_stride = 0;
  const float* gate = nullptr;
  int64_t gate_stride = 0;
  bool gate_per_row = false;
};

// rms_norm of a wide group (a hidden state): one block per group, which first copies the group to
// shared memory with all its threads, so the half-warp's chains of the CPU's lane order read shared
// memory, not L2, one dependent load at a time; then all threads scale. The same bits. With a
// residual input the copy first adds it to x and writes the sum back (the residual add before the
// norm: add_rms_norm, add_mul_sigmoid_residual_rms_norm), so the sum is never read back from memory.
template <Residual kResidual>
__global__ void __launch_bounds__(kThreads)
    rms_norm_wide_kernel(float* x, int64_t x_stride, const ResidualIn in, int64_t rows,
                         int64_t n_groups, int64_t group, const float* __restrict__ w,
                         int64_t w_step, float eps, float* y, int64_t y_stride) {
  await_previous_kernel();
  extern __shared__ float xs[];
  __shared__ float scale;
  for (int64_t u = blockIdx.x; u < rows * n_groups; u += gridDim.x) {
    const int64_t r = u / n_groups, g = u % n_groups;
    float* xg = x + r * x_stride + g * group;
    constexpr bool kDelta = kResidual == Residual::Delta, kGated = kResidual == Residual::GatedShared;
    const float* dg = kDelta ? in.delta + r * in.delta_stride + g * group : nullptr;
    float* block_y = kGated ? in.y + r * in.y_stride + g * group : nullptr;
    const float* sg = kGated ? in.shared + r * in.shared_stride + g * group : nullptr;
    const float* gg = kGated ? in.gate + r * in.gate_stride + (in.gate_per_row ? 0 : g * group) : nullptr;
    // A thread's loads are issued together, kBatch at a time (a lone block hides no latency).
    for (int64_t i0 = threadIdx.x; i0 < group; i0 += kBatch * kThreads) {
      float v[kBatch], d[kBatch], sh[kBatch], gt[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t i = i0 + k * kThreads;
        const bool inside = i < group;
        v[k] = inside ? xg[i] : 0.0f;
        if (kDelta) d[k] = inside ? dg[i] : 0.0f;
        if (kGated) {
          d[k] = inside ? block_y[i] : 0.0f;
          sh[k] = inside ? sg[i] : 0.0f;
          gt[k] = inside ? gg[in.gate_per_row ? 0 : i] : 0.0f;
        }
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t i = i0 + k * kThreads;
        if (i >= group) break;
        if (kGated) {
          d[k] = __fadd_rn(d[k], __fmul_rn(sh[k], sigmoid_value(gt[k])));
          block_y[i] = d[k];
        }
        if (kResidual != Residual::None) {
          v[k] = __fadd_rn(v[k], d[k]);
          xg[i] = v[k];
        }
        xs[i] = v[k];
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // both halves of warp 0 compute the same sum
      const float ss = half_warp_dot(xs, xs, group);
      if (threadIdx.x == 0)
        scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(ss, float(group)), eps)));
    }
    __syncthreads();
    const float s = scale;
    float* yg = y + r * y_stride + g * group;
    const float* wg = w ? w + g * w_step : nullptr;
    for (int64_t i0 = threadIdx.x; i0 < group; i0 += kBatch * kThreads) {
      float wv[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        wv[k] = wg && i0 + k * kThreads < group ? wg[i0 + k * kThreads] : 1.0f;
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t i = i0 + k * kThreads;
        if (i >= group) break;
        const float v = __fmul_rn(xs[i], s);
        yg[i] = wg ? __fmul_rn(v, wv[k]) : v;
      }
    }
    __syncthreads();  // xs and scale are read before the next group writes them
  }
}

// Columns below q_cols are then scaled by q_scale (qk_l2_norm; 0 for a plain l2_norm).
__global__ void l2_norm_kernel(const float* __restrict__ x, int64_t x_stride, int64_t rows,
                               int64_t n_groups, int64_t group, float eps, float* y,
                               int64_t y_stride, int64_t q_cols, float q_scale) {
  await_previous_kernel();
  for_half_warp_groups(rows, n_groups, [&](int64_t r, int64_t g, bool valid) {
    const float* xg = x + r * x_stride + g * group;
    const float ss = half_warp_dot(xg, xg, valid ? group : 0);
    if (!valid) return;
    const float s = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, eps)));
    float* yg = y + r * y_stride + g * group;
    for (int64_t i = threadIdx.x & 15; i < group; i += 16) {
      const float v = __fmul_rn(xg[i], s);
      yg[i] = g * group + i < q_cols ? __fmul_rn(v, q_scale) : v;
    }
  });
}

// y[r, g] = sign(d) sqrt(max(|d|, 1e-6)), d = scale * (a . b) over group g.
__global__ void signed_sqrt_dot_kernel(const float* __restrict__ a, int64_t a_stride,
                                       const float* __restrict__ b, int64_t b_stride, int64_t rows,
                                       int64_t n_groups, int64_t group, float scale,
                                       float* __restrict__ y, int64_t y_stride) {
  await_previous_kernel();
  for_half_warp_groups(rows, n_groups, [&](int64_t r, int64_t g, bool valid) {
    const float dot = half_warp_dot(a + r * a_stride + g * group, b + r * b_stride + g * group,
                                    valid ? group : 0);
    if (!valid || (threadIdx.x & 15) != 0) return;
    const float d = __fmul_rn(dot, scale);
    const float ad = fabsf(d);
    const float m = sqrtf(ad < 1e-6f ? 1e-6f : ad);  // std::max(|d|, 1e-6f): nan stays nan
    y[r * y_stride + g] = d > 0.0f ? m : d < 0.0f ? -m : 0.0f;
  });
}

int grid(const DeviceContext& ctx, int64_t units) {
  return grid_for(units, kHalvesPerBlock, ctx.limits.max_blocks);
}

}  // namespace

void launch_rms_norm(const DeviceContext& ctx, const Tensor& x, const float* w, int64_t w_step,
                     int64_t group, float eps, Tensor y, NormGate gate) {
  const int64_t n_groups = x.cols / group;
  if (x.rows == 0 || n_groups == 0) return;
  if (!gate.p && fuses_wide_rms_norm(group)) {
    launch_kernel(rms_norm_wide_kernel<Residual::None>,
                  grid_for(x.rows * n_groups, 1, ctx.limits.max_blocks), kThreads,
                  size_t(group) * sizeof(float), ctx.stream, x.data, x.stride, ResidualIn{}, x.rows,
                  n_groups, group, w, w_step, eps, y.data, y.stride);
    STRATA_CUDA_CHECK_LAUNCH("rms_norm_wide_kernel");
    return;
  }
  launch_kernel(rms_norm_kernel, grid(ctx, x.rows * n_groups), kThreads, 0, ctx.stream, x.data,
                x.stride, x.rows, n_groups, group, w, w_step, eps, y.data, y.stride, gate);
  STRATA_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

bool fuses_wide_rms_norm(int64_t group) { return group >= kWideGroup && group <= kWideGroupMax; }

void launch_add_rms_norm(const DeviceContext& ctx, Tensor x, const Tensor& delta, const float* w,
                         float eps, Tensor y) {
  if (x.rows == 0) return;
  ResidualIn in;
  in.delta = delta.data, in.delta_stride = delta.stride;
  launch_kernel(rms_norm_wide_kernel<Residual::Delta>, grid_for(x.rows, 1, ctx.limits.max_blocks),
                kThreads, size_t(x.cols) * sizeof(float), ctx.stream, x.data, x.stride, in, x.rows,
                int64_t(1), x.cols, w, int64_t(0), eps, y.data, y.stride);
  STRATA_CUDA_CHECK_LAUNCH("rms_norm_wide_kernel<add>");
}

void launch_add_mul_sigmoid_rms_norm(const DeviceContext& ctx, Tensor residual, Tensor y,
                                     const Tensor& x, const Tensor& gate, const float* w, float eps,
                                     Tensor normed) {
  if (residual.rows == 0) return;
  ResidualIn in;
  in.y = y.data, in.y_stride = y.stride, in.shared = x.data, in.shared_stride = x.stride;
  in.gate = gate.data, in.gate_stride = gate.stride, in.gate_per_row = gate.cols == 1 && x.cols != 1;
  launch_kernel(rms_norm_wide_kernel<Residual::GatedShared>,
                grid_for(residual.rows, 1, ctx.limits.max_blocks), kThreads,
                size_t(residual.cols) * sizeof(float), ctx.stream, residual.data, residual.stride,
                in, residual.rows, int64_t(1), residual.cols, w, int64_t(0), eps, normed.data,
                normed.stride);
  STRATA_CUDA_CHECK_LAUNCH("rms_norm_wide_kernel<add_mul_sigmoid>");
}

void launch_l2_norm(const DeviceContext& ctx, const Tensor& x, int64_t group, float eps, Tensor y,
                    int64_t q_cols, float q_scale) {
  const int64_t n_groups = x.cols / group;
  if (x.rows == 0 || n_groups == 0) return;
  launch_kernel(l2_norm_kernel, grid(ctx, x.rows * n_groups), kThreads, 0, ctx.stream, x.data,
                x.stride, x.rows, n_groups, group, eps, y.data, y.stride, q_cols, q_scale);
  STRATA_CUDA_CHECK_LAUNCH("l2_norm_kernel");
}

void launch_signed_sqrt_dot(const DeviceContext& ctx, const Tensor& a, const Tensor& b,
                            int64_t group, float scale, Tensor y) {
  if (y.rows == 0 || y.cols == 0) return;
  launch_kernel(signed_sqrt_dot_kernel, grid(ctx, y.rows * y.cols), kThreads, 0, ctx.stream, a.data,
                a.stride, b.data, b.stride, y.rows, y.cols, group, scale, y.data, y.stride);
  STRATA_CUDA_CHECK_LAUNCH("signed_sqrt_dot_kernel");
}

}  // namespace strata::cuda::detail
