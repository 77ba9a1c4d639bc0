// The recurrent ops of the DeltaNet layers and the PLE conv, with the arithmetic of the loops of
// ops_ssm.cpp / ops_vec_body.h. The conv's outputs depend on the inputs only, so a CTA takes 32
// channels and its threads the window's tokens (each output one thread, the CPU's tap order),
// then shifts those channels' state once all of them are computed. The delta rule is one thread
// per (head, value dim j) holding column j of the head's state, walking the window in time order.
// Bitwise the CPU's except through expf (silu, the decay), which rounds differently from glibc by
// an ulp at times.
#include <algorithm>
#include <cmath>
#include <span>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 128;

constexpr int kConvChannels = 32;  // a CTA's channels: threadIdx.x
constexpr int kConvTokenLanes = 8;  // threadIdx.y walks the tokens in steps of blockDim.y

// A sequence's rows [first, first + rows) of the window and its state.
struct StateSequence {
  int64_t first, rows;
  float* state;
};
using StateTable = SequenceTable<StateSequence>;

template <class Launch>
void for_each_table(std::span<const backend::SequenceState> sequences, Launch launch) {
  for_each_sequence_table<StateSequence>(
      sequences,
      [](const backend::SequenceState& s) { return StateSequence{s.first, s.rows, s.state.data}; },
      launch);
}

// Block (32, 1 or 8): channels 32 blockIdx.x + threadIdx.x, tokens threadIdx.y, + blockDim.y, ...
// of sequence blockIdx.y.
__global__ void conv1d_silu_kernel(const float* __restrict__ x, int64_t x_stride, int64_t C,
                                   const StateTable table, int64_t s_stride,
                                   const float* __restrict__ w, int64_t K, int64_t D,
                                   float* __restrict__ y, int64_t y_stride) {
  await_previous_kernel();
  const StateSequence seq = table.at[blockIdx.y];
  const int64_t T = seq.rows;
  x += seq.first * x_stride;
  y += seq.first * y_stride;
  float* const state = seq.state;
  const int64_t S = (K - 1) * D;
  const int64_t c = int64_t(blockIdx.x) * kConvChannels + threadIdx.x;
  // in(t) for t in [-S, T): the state rows, then x.
  auto in = [&](int64_t t) { return t < 0 ? state[(S + t) * s_stride + c] : x[t * x_stride + c]; };
  if (c < C) {
    const float* wc = w + c * K;
    for (int64_t t = threadIdx.y; t < T; t += blockDim.y) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) acc = __fadd_rn(acc, __fmul_rn(wc[j], in(t - (K - 1 - j) * D)));
      y[t * y_stride + c] = silu_value(acc);
    }
  }
  __syncthreads();  // every output has read the old state
  // State row s takes in(T - S + s), which is x or state row T + s >= s: not yet overwritten
  // when the rows are shifted oldest first.
  if (c < C && threadIdx.y == 0)
    for (int64_t s = 0; s < S; ++s) state[s * s_stride + c] = in(T - S + s);
}

// Thread (h, j): column j of head h's state S[i][j], i < dk, at state rows h*dk + i. Value head h
// reads q/k head (h / qk_div) % qk_mod.
__global__ void gated_delta_rule_kernel(const float* __restrict__ q, int64_t q_stride,
                                        const float* __restrict__ k, int64_t k_stride,
                                        const float* __restrict__ v, int64_t v_stride,
                                        const float* __restrict__ g, int64_t g_stride,
                                        const float* __restrict__ beta, int64_t b_stride,
                                        const StateTable table, int64_t n_heads,
                                        int64_t qk_div, int64_t qk_mod, int64_t dk, int64_t dv,
                                        float* __restrict__ y, int64_t y_stride) {
  await_previous_kernel();
  const StateSequence seq = table.at[blockIdx.y];
  const int64_t T = seq.rows, first = seq.first;
  q += first * q_stride, k += first * k_stride, v += first * v_stride;
  g += first * g_stride, beta += first * b_stride, y += first * y_stride;
  float* const state = seq.state;
  const int64_t n = n_heads * dv;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = u / dv, j = u % dv;
    const int64_t hk = h / qk_div % qk_mod;
    float* S = state + h * dk * dv + j;  // S[i][j] at S[i * dv]
    for (int64_t t = 0; t < T; ++t) {
      const float decay = expf(g[t * g_stride + h]);
      const float bt = beta[t * b_stride + h];
      const float* kt = k + t * k_stride + hk * dk;
      const float* qt = q + t * q_stride + hk * dk;
      float kv = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        const float sij = __fmul_rn(S[i * dv], decay);
        S[i * dv] = sij;
        kv = __fmaf_rn(sij, kt[i], kv);
      }
      const float delta = __fmul_rn(__fsub_rn(v[t * v_stride + h * dv + j], kv), bt);
      float out = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        const float sij = __fmaf_rn(kt[i], delta, S[i * dv]);
        S[i * dv] = sij;
        out = __fmaf_rn(sij, qt[i], out);
      }
      y[t * y_stride + h * dv + j] = out;
    }
  }
}

// The same for a head size known at compile time: the thread's state column lives in registers
// for the whole window, read once and written once (the loads issue together instead of one
// dependent load per multiply-add). The same operations in the same order: the same bits.
template <int kDK>
__global__ void __launch_bounds__(kThreads)
    gated_delta_rule_column_kernel(const float* __restrict__ q, int64_t q_stride,
                                   const float* __restrict__ k, int64_t k_stride,
                                   const float* __restrict__ v, int64_t v_stride,
                                   const float* __restrict__ g, int64_t g_stride,
                                   const float* __restrict__ beta, int64_t b_stride,
                                   const StateTable table, int64_t n_heads,
                                   int64_t qk_div, int64_t qk_mod, int64_t dv,
                                   float* __restrict__ y, int64_t y_stride) {
  await_previous_kernel();
  const StateSequence seq = table.at[blockIdx.y];
  const int64_t T = seq.rows, first = seq.first;
  q += first * q_stride, k += first * k_stride, v += first * v_stride;
  g += first * g_stride, beta += first * b_stride, y += first * y_stride;
  float* const state = seq.state;
  const int64_t n = n_heads * dv;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = u / dv, j = u % dv;
    const int64_t hk = h / qk_div % qk_mod;
    float* S = state + h * kDK * dv + j;
    float col[kDK];
#pragma unroll
    for (int i = 0; i < kDK; ++i) col[i] = S[i * dv];
    for (int64_t t = 0; t < T; ++t) {
      const float decay = expf(g[t * g_stride + h]);
      const float bt = beta[t * b_stride + h];
      const float* kt = k + t * k_stride + hk * kDK;
      const float* qt = q + t * q_stride + hk * kDK;
      float kv = 0.0f;
#pragma unroll
      for (int i = 0; i < kDK; ++i) {
        col[i] = __fmul_rn(col[i], decay);
        kv = __fmaf_rn(col[i], kt[i], kv);
      }
      const float delta = __fmul_rn(__fsub_rn(v[t * v_stride + h * dv + j], kv), bt);
      float out = 0.0f;
#pragma unroll
      for (int i = 0; i < kDK; ++i) {
        col[i] = __fmaf_rn(kt[i], delta, col[i]);
        out = __fmaf_rn(col[i], qt[i], out);
      }
      y[t * y_stride + h * dv + j] = out;
    }
#pragma unroll
    for (int i = 0; i < kDK; ++i) S[i * dv] = col[i];
  }
}

__global__ void ssm_decay_kernel(const float* __restrict__ a, int64_t a_stride, int64_t rows,
                                 int64_t heads, const float* __restrict__ dt_bias,
                                 const float* __restrict__ ssm_a, float* __restrict__ g,
                                 int64_t g_stride) {
  await_previous_kernel();
  const int64_t n = rows * heads;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = u / heads, h = u % heads;
    g[t * g_stride + h] = decay_value(a[t * a_stride + h], dt_bias[h], ssm_a[h]);
  }
}

// The delta rule's gates of one window in one pass: beta = sigmoid(b) (mul_sigmoid of ones: the
// same bits) and g as ssm_decay_kernel.
__global__ void ssm_gates_kernel(const float* __restrict__ b, int64_t b_stride,
                                 const float* __restrict__ a, int64_t a_stride, int64_t rows,
                                 int64_t heads, const float* __restrict__ dt_bias,
                                 const float* __restrict__ ssm_a, float* __restrict__ beta,
                                 int64_t beta_stride, float* __restrict__ g, int64_t g_stride) {
  await_previous_kernel();
  const int64_t n = rows * heads;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = u / heads, h = u % heads;
    beta[t * beta_stride + h] = sigmoid_value(b[t * b_stride + h]);
    g[t * g_stride + h] = decay_value(a[t * a_stride + h], dt_bias[h], ssm_a[h]);
  }
}

}  // namespace

void launch_conv1d_silu(const DeviceContext& ctx, const Tensor& x,
                        std::span<const backend::SequenceState> sequences, const float* w,
                        int64_t kernel, int64_t dilation, Tensor y) {
  if (x.cols == 0) return;
  const int64_t blocks = (x.cols + kConvChannels - 1) / kConvChannels;
  if (blocks > ctx.limits.max_blocks)
    fail("CUDA conv1d_silu: ", x.cols, " channels, more than the grid takes (",
         ctx.limits.max_blocks * kConvChannels, ")");
  int64_t most_rows = 0;
  for (const backend::SequenceState& s : sequences) most_rows = std::max(most_rows, s.rows);
  const dim3 block(kConvChannels, most_rows >= kConvTokenLanes ? kConvTokenLanes : 1);
  for_each_table(sequences, [&](const StateTable& table, unsigned n) {
    launch_kernel(conv1d_silu_kernel, dim3(unsigned(blocks), n), block, 0, ctx.stream, x.data,
                  x.stride, x.cols, table, sequences[0].state.stride, w, kernel, dilation, y.data,
                  y.stride);
    STRATA_CUDA_CHECK_LAUNCH("conv1d_silu_kernel");
  });
}

void launch_gated_delta_rule(const DeviceContext& ctx, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& g, const Tensor& beta,
                             std::span<const backend::SequenceState> sequences, int64_t n_heads,
                             int64_t qk_div, int64_t qk_mod, Tensor y) {
  const int64_t dk = sequences[0].state.rows / n_heads, dv = v.cols / n_heads;
  if (q.rows == 0 || dv == 0) return;
  const int grid = grid_for(n_heads * dv, kThreads, ctx.limits.max_blocks);
  for_each_table(sequences, [&](const StateTable& table, unsigned n) {
    const auto columns = [&](auto kernel) {
      launch_kernel(kernel, dim3(unsigned(grid), n), kThreads, 0, ctx.stream, q.data, q.stride,
                    k.data, k.stride, v.data, v.stride, g.data, g.stride, beta.data, beta.stride,
                    table, n_heads, qk_div, qk_mod, dv, y.data, y.stride);
      STRATA_CUDA_CHECK_LAUNCH("gated_delta_rule_column_kernel");
    };
    if (dk == 128) return columns(gated_delta_rule_column_kernel<128>);
    if (dk == 64) return columns(gated_delta_rule_column_kernel<64>);
    launch_kernel(gated_delta_rule_kernel, dim3(unsigned(grid), n), kThreads, 0, ctx.stream, q.data,
                  q.stride, k.data, k.stride, v.data, v.stride, g.data, g.stride, beta.data,
                  beta.stride, table, n_heads, qk_div, qk_mod, dk, dv, y.data, y.stride);
    STRATA_CUDA_CHECK_LAUNCH("gated_delta_rule_kernel");
  });
}

void launch_ssm_decay(const DeviceContext& ctx, const Tensor& a, const float* dt_bias,
                      const float* ssm_a, Tensor g) {
  if (a.rows == 0 || a.cols == 0) return;
  launch_kernel(ssm_decay_kernel, grid_for(a.rows * a.cols, 256, ctx.limits.max_blocks), 256, 0,
                ctx.stream, a.data, a.stride, a.rows, a.cols, dt_bias, ssm_a, g.data, g.stride);
  STRATA_CUDA_CHECK_LAUNCH("ssm_decay_kernel");
}

void launch_ssm_gates(const DeviceContext& ctx, const Tensor& b, const Tensor& a,
                      const float* dt_bias, const float* ssm_a, Tensor beta, Tensor g) {
  if (a.rows == 0 || a.cols == 0) return;
  launch_kernel(ssm_gates_kernel, grid_for(a.rows * a.cols, 256, ctx.limits.max_blocks), 256, 0,
                ctx.stream, b.data, b.stride, a.data, a.stride, a.rows, a.cols, dt_bias, ssm_a,
                beta.data, beta.stride, g.data, g.stride);
  STRATA_CUDA_CHECK_LAUNCH("ssm_gates_kernel");
}

}  // namespace strata::cuda::detail
