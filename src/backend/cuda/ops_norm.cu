// Norms and the PLE gate: one half-warp per group. The sums run in the CPU's lane order
// (half_warp_dot), and the rest is the CPU's expressions with IEEE division and square root, so
// these ops are bitwise the CPU backend's. A norm's gains for group g start at w + g * w_step
// (w_step 0: every group has w's).
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kHalvesPerBlock = kThreads / 16;
// Groups from this wide take a cluster each (rms_norm_wide_kernel), up to what shared memory holds.
constexpr int64_t kWideGroup = 1024;
constexpr int64_t kWideGroupMax = 8 * 1024;
constexpr int kBatch = 8;  // loads a thread issues together
constexpr int64_t kWideCluster = 8;  // CTAs a wide group (a portable cluster)

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
    // kBatch elements' loads ahead of their stores (y may be x, so the compiler would not move a
    // load above a store; each lane writes only what it has read)
    for (int64_t i0 = threadIdx.x & 15; i0 < group; i0 += 16 * kBatch) {
      float xv[kBatch], wv[kBatch], gv[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t i = i0 + 16 * k;
        const bool inside = i < group;
        xv[k] = inside ? xg[i] : 0.0f;
        wv[k] = wg && inside ? wg[i] : 1.0f;
        gv[k] = gg && inside ? gg[i] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t i = i0 + 16 * k;
        if (i >= group) break;
        float v = __fmul_rn(xv[k], s);
        if (wg) v = __fmul_rn(v, wv[k]);
        if (gg) v = gate.kind == backend::OutputGate::Silu ? swiglu_value(gv[k], v) : __fmul_rn(v, sigmoid_value(gv[k]));
        yg[i] = v;
      }
    }
  });
}

// What is added to x before a wide norm (x then holds the sum): nothing, delta (add_rms_norm), or
// the sum y + shared * sigmoid(gate), which y also takes (add_mul_sigmoid_residual: the same
// expressions as add_mul_sigmoid_kernel's). gate: per row (one column) or per element. Where
// combine_weights is set, y first takes the MoE's combine as moe_combine_kernel computes it.
struct MoeCombineIn {
  const float* weights = nullptr;  // [rows, top_k]; null: none
  int64_t top_k = 0;
  const float* out = nullptr;  // [rows * top_k, cols]
  int64_t out_stride = 0;
};
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
  MoeCombineIn combine;
};

// rms_norm of a wide group (a hidden state), a cluster of CTAs per group (one, or kWideCluster
// where a MoE combine makes the slice's loads many), each with a slice of it: the slice's loads (x
// and the residual input) go out in one round, its sums are written back (with a residual input:
// the residual add before the norm, add_rms_norm and add_mul_sigmoid_residual_rms_norm, so the sum
// is never read back from memory) and copied into the first CTA's shared copy of the group
// (distributed shared memory). There warp 0 runs the CPU's lane chains (half_warp_dot) over shared
// memory, not L2, and hands the scale to every CTA, which scales its slice. The same expressions
// in the same order as the ops: the same bits.
template <Residual kResidual>
__global__ void __launch_bounds__(kThreads)
    rms_norm_wide_kernel(float* x, int64_t x_stride, const ResidualIn in, int64_t n_groups,
                         int64_t group, const float* __restrict__ w, int64_t w_step, float eps,
                         float* y, int64_t y_stride) {
  await_previous_kernel();
  extern __shared__ float xs[];  // the CTA's slice at its place in the group (all of it in rank 0)
  __shared__ float scale;
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int64_t rank = cluster.block_rank(), ctas = cluster.num_blocks();
  const int64_t u = blockIdx.x / ctas, r = u / n_groups, g = u % n_groups;
  const int64_t per = (group + ctas - 1) / ctas, begin = rank * per, end = min(group, begin + per);
  float* const group0 = cluster.map_shared_rank(xs, 0);
  // Another CTA's shared memory may be written only once it has started: every CTA arrives here
  // and waits before its first such write, the loads in between.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  float* xg = x + r * x_stride + g * group;
  constexpr bool kDelta = kResidual == Residual::Delta, kGated = kResidual == Residual::GatedShared;
  const float* dg = kDelta ? in.delta + r * in.delta_stride + g * group : nullptr;
  float* block_y = kGated ? in.y + r * in.y_stride + g * group : nullptr;
  const float* sg = kGated ? in.shared + r * in.shared_stride + g * group : nullptr;
  const float* gg = kGated ? in.gate + r * in.gate_stride + (in.gate_per_row ? 0 : g * group) : nullptr;
  // A thread's loads are issued together, kBatch at a time.
  for (int64_t i0 = begin + threadIdx.x; i0 < end; i0 += kBatch * kThreads) {
    float v[kBatch], d[kBatch], sh[kBatch], gt[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t i = i0 + k * kThreads;
      const bool inside = i < end;
      v[k] = inside ? xg[i] : 0.0f;
      if (kDelta) d[k] = inside ? dg[i] : 0.0f;
      if (kGated) {
        d[k] = inside ? block_y[i] : 0.0f;
        if (in.combine.weights && inside) {
          const float* wr = in.combine.weights + r * in.combine.top_k;
          const float* o = in.combine.out + r * in.combine.top_k * in.combine.out_stride + g * group + i;
#pragma unroll 8  // the loads run ahead of the chain
          for (int64_t j = 0; j < in.combine.top_k; ++j)
            d[k] = __fmaf_rn(wr[j], o[j * in.combine.out_stride], d[k]);
        }
        sh[k] = inside ? sg[i] : 0.0f;
        gt[k] = inside ? gg[in.gate_per_row ? 0 : i] : 0.0f;
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t i = i0 + k * kThreads;
      if (i >= end) break;
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
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  if (rank != 0)
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) group0[i] = xs[i];
  cluster.sync();
  if (rank == 0 && threadIdx.x < 32) {  // both halves of warp 0 compute the same sum
    const float ss = half_warp_dot(xs, xs, group);
    if (threadIdx.x < ctas) {
      *cluster.map_shared_rank(&scale, unsigned(threadIdx.x)) =
          __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(ss, float(group)), eps)));
    }
  }
  cluster.sync();  // (no CTA touches another's shared memory past this)
  const float s = scale;
  float* yg = y + r * y_stride + g * group;
  const float* wg = w ? w + g * w_step : nullptr;
  for (int64_t i0 = begin + threadIdx.x; i0 < end; i0 += kBatch * kThreads) {
    float wv[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      wv[k] = wg && i0 + k * kThreads < end ? wg[i0 + k * kThreads] : 1.0f;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t i = i0 + k * kThreads;
      if (i >= end) break;
      const float v = __fmul_rn(xs[i], s);
      yg[i] = wg ? __fmul_rn(v, wv[k]) : v;
    }
  }
}

// rms_norm_wide_kernel over rows x n_groups groups of `group` columns, a cluster each: of
// kWideCluster CTAs with a MoE combine, else of one, whose loads are few enough for one CTA (ncu,
// H100, add_rms_norm of 2048 columns: 5.56 us a call as one CTA, 5.76 as eight).
template <Residual kResidual>
void launch_wide(const DeviceContext& ctx, float* x, int64_t x_stride, const ResidualIn& in,
                 int64_t rows, int64_t n_groups, int64_t group, const float* w, int64_t w_step,
                 float eps, float* y, int64_t y_stride) {
  const int64_t cluster = in.combine.weights ? kWideCluster : 1, ctas = rows * n_groups * cluster;
  launch_kernel_clusters(rms_norm_wide_kernel<kResidual>,
                         unsigned(std::min<int64_t>(ctas, std::numeric_limits<unsigned>::max())),
                         kThreads, size_t(group) * sizeof(float), ctx.stream, unsigned(cluster),
                         x, x_stride, in, n_groups, group, w, w_step, eps, y, y_stride);
  STRATA_CUDA_CHECK_LAUNCH("rms_norm_wide_kernel");
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
    // x is only read (y may be x: each element is read into shared memory before it is written)
    return launch_wide<Residual::None>(ctx, x.data, x.stride, ResidualIn{}, x.rows, n_groups,
                                       group, w, w_step, eps, y.data, y.stride);
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
  launch_wide<Residual::Delta>(ctx, x.data, x.stride, in, x.rows, 1, x.cols, w, 0, eps, y.data,
                               y.stride);
}

void launch_add_mul_sigmoid_rms_norm(const DeviceContext& ctx, Tensor residual, Tensor y,
                                     const Tensor& x, const Tensor& gate, const float* w, float eps,
                                     Tensor normed, const float* combine_weights, int64_t top_k,
                                     const Tensor& experts_out) {
  if (residual.rows == 0) return;
  ResidualIn in;
  if (combine_weights)
    in.combine = {combine_weights, top_k, experts_out.data, experts_out.stride};
  in.y = y.data, in.y_stride = y.stride, in.shared = x.data, in.shared_stride = x.stride;
  in.gate = gate.data, in.gate_stride = gate.stride, in.gate_per_row = gate.cols == 1 && x.cols != 1;
  launch_wide<Residual::GatedShared>(ctx, residual.data, residual.stride, in, residual.rows, 1,
                                     residual.cols, w, 0, eps, normed.data, normed.stride);
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
