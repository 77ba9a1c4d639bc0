// Backend::delta_net_recurrence as one kernel for short windows: one CTA per (value head,
// sequence), a thread per value column, row after row of its sequence: the conv of its key head's
// q and k channels and of its own value channels, both l2 norms, the gates, the delta rule (thread
// j keeps column j of the head's state in registers, as gated_delta_rule_column_kernel does) and
// the gated norm. Each step is the expression of the op it replaces (ops_ssm.cu, ops_norm.cu), in
// the same order on the same values, so the bits are those of the ops one by one: the CPU's,
// except through expf. The intermediates live in shared memory instead of global memory.
// The value heads that read one key head are one cluster: each computes the key head's q and k
// itself, and the cluster's first CTA advances their conv state once every CTA of the cluster has
// read the old one.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int64_t kMaxCluster = 8;  // portable cluster size

// Value head blockIdx.x: the cluster of key head hk, rank hl in it. Shared memory: the conv's
// outputs [q (kDK) | k (kDK) | v (kDK)], the delta rule's output (kDK), beta, exp(g), the two l2
// scales and the norm's scale.
template <int kDK>
__global__ void __launch_bounds__(kDK)
    delta_net_recurrence_kernel(const DeltaNetLaunch p, const SequenceTable<DeltaNetSequence> table) {
  constexpr int kDV = kDK;
  __shared__ float x[3 * kDK], o[kDV], scalars[5];
  float& beta = scalars[0];
  float& decay = scalars[1];
  float* const l2_scale = scalars + 2;
  float& norm_scale = scalars[4];
  const int64_t key_heads = p.key_dim / kDK, heads = p.n_heads / key_heads;
  const int64_t hk = blockIdx.x / heads, hl = blockIdx.x % heads;
  const int64_t h = p.interleaved ? hk * heads + hl : hk + hl * key_heads;
  const DeltaNetSequence seq = table.at[blockIdx.y];
  // Shared x[u] is conv channel channel_of(u).
  const auto channel_of = [&](int u) -> int64_t {
    if (u < kDK) return hk * kDK + u;
    if (u < 2 * kDK) return p.key_dim + hk * kDK + (u - kDK);
    return 2 * p.key_dim + h * kDV + (u - 2 * kDK);
  };
  const int j = int(threadIdx.x);
  const int64_t S = p.taps - 1;
  const float* const qkv = p.qkv + seq.first * p.qkv_stride;
  // in(t, c) for t in [-S, rows): the conv state's rows, then the window's.
  const auto in = [&](int64_t t, int64_t c) {
    return t < 0 ? seq.conv_state[(S + t) * p.conv_stride + c] : qkv[t * p.qkv_stride + c];
  };

  // The state column is loaded while the kernel before still runs: its last writer (this layer's
  // kernel a window ago, or a rollback) is at least two kernels back, complete before this one's
  // CTAs are placed (await_previous_kernel).
  float* const column = seq.ssm_state + h * kDK * kDV + j;  // S[i][j] at column[i * kDV]
  float col[kDK];
#pragma unroll
  for (int i = 0; i < kDK; ++i) col[i] = column[i * kDV];
  await_previous_kernel();
  const int64_t gate_col = (h / p.gate_group) * p.gate_group_stride + h % p.gate_group;

  for (int64_t t = 0; t < seq.rows; ++t) {
    const int64_t row = seq.first + t;
    // conv1d_silu_kernel's taps, oldest first
#pragma unroll 1
    for (int u = j; u < 3 * kDK; u += kDK) {
      const int64_t c = channel_of(u);
      const float* wc = p.conv + c * p.taps;
      float acc = 0.0f;
      for (int64_t tap = 0; tap < p.taps; ++tap)
        acc = __fadd_rn(acc, __fmul_rn(wc[tap], in(t - (p.taps - 1 - tap), c)));
      x[u] = silu_value(acc);
    }
    // ssm_gates_kernel; the delta rule takes exp of the decay
    if (j == 0) {
      beta = sigmoid_value(p.b[row * p.b_stride + gate_col]);
      decay = expf(decay_value(p.a[row * p.a_stride + gate_col], p.dt_bias[h], p.ssm_a[h]));
    }
    __syncthreads();
    // l2_norm_kernel: warp 0's halves take q and k
    if (j < 32) {
      const float* v = x + (j < 16 ? 0 : kDK);
      const float ss = half_warp_dot(v, v, kDK);
      if ((j & 15) == 0) l2_scale[j / 16] = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, p.l2_eps)));
    }
    __syncthreads();
#pragma unroll
    for (int u = j; u < 2 * kDK; u += kDK) {
      const float v = __fmul_rn(x[u], l2_scale[u / kDK]);
      x[u] = u < kDK ? __fmul_rn(v, p.q_scale) : v;
    }
    __syncthreads();
    // gated_delta_rule_column_kernel's step
    {
      const float* qt = x;
      const float* kt = x + kDK;
      const float d = decay, bt = beta;
      float kv = 0.0f;
#pragma unroll
      for (int i = 0; i < kDK; ++i) {
        col[i] = __fmul_rn(col[i], d);
        kv = __fmaf_rn(col[i], kt[i], kv);
      }
      const float delta = __fmul_rn(__fsub_rn(x[2 * kDK + j], kv), bt);
      float out = 0.0f;
#pragma unroll
      for (int i = 0; i < kDK; ++i) {
        col[i] = __fmaf_rn(kt[i], delta, col[i]);
        out = __fmaf_rn(col[i], qt[i], out);
      }
      o[j] = out;
    }
    __syncthreads();
    // rms_norm_kernel with the output gate: warp 0's first half
    if (j < 32) {
      const float ss = half_warp_dot(o, o, j < 16 ? kDV : 0);
      if (j == 0) norm_scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(ss, float(kDV)), p.norm_eps)));
    }
    __syncthreads();
    {
      float v = __fmul_rn(__fmul_rn(o[j], norm_scale), p.norm[j]);
      const float gz = p.z[row * p.z_stride + h * kDV + j];
      v = p.gate == backend::OutputGate::Silu ? swiglu_value(gz, v) : __fmul_rn(v, sigmoid_value(gz));
      p.y[row * p.y_stride + h * kDV + j] = v;
    }
    // The next row's conv writes x and the gates: every thread is past this row's reads of them
    // (the barrier before the norm), and the norm's scale is read above before the next row's
    // norm writes it, two barriers later.
  }

#pragma unroll
  for (int i = 0; i < kDK; ++i) column[i * kDV] = col[i];
  // The conv state's row s takes in(rows - S + s): a window row, or state row rows + s >= s, not
  // yet overwritten when the rows shift oldest first. The value channels are this CTA's alone;
  // q and k are the cluster's, shifted by its first CTA once all have read them.
  cooperative_groups::this_cluster().sync();
#pragma unroll
  for (int u = j; u < 3 * kDK; u += kDK) {
    if (u < 2 * kDK && hl != 0) continue;
    const int64_t c = channel_of(u);
    for (int64_t s = 0; s < S; ++s) seq.conv_state[s * p.conv_stride + c] = in(seq.rows - S + s, c);
  }
}

}  // namespace

bool delta_net_recurrence_fits(int64_t state, int64_t key_dim, int64_t n_heads, int64_t max_rows) {
  if ((state != 64 && state != 128) || key_dim % state != 0 || max_rows > kDeltaNetMaxRows) return false;
  const int64_t key_heads = key_dim / state;
  return key_heads > 0 && n_heads % key_heads == 0 && n_heads / key_heads <= kMaxCluster;
}

void launch_delta_net_recurrence(const DeviceContext& ctx, const DeltaNetLaunch& p,
                                 std::span<const DeltaNetSequence> sequences) {
  const int64_t heads = p.n_heads / (p.key_dim / p.state);
  void (*kernel)(DeltaNetLaunch, SequenceTable<DeltaNetSequence>) =
      p.state == 128 ? delta_net_recurrence_kernel<128> : delta_net_recurrence_kernel<64>;
  for_each_sequence_table<DeltaNetSequence>(
      sequences, [](const DeltaNetSequence& s) { return s; },
      [&](const SequenceTable<DeltaNetSequence>& table, unsigned n) {
        launch_kernel_clusters(kernel, dim3{unsigned(p.n_heads), n}, unsigned(p.state), 0,
                               ctx.stream, unsigned(heads), p, table);
        STRATA_CUDA_CHECK_LAUNCH("delta_net_recurrence_kernel");
      });
}

}  // namespace strata::cuda::detail
