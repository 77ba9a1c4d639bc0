// The router and the routed experts.
//
// route: one warp per row; softmax with the CPU's column-order sum (one chain), top-k as k rounds
// of a warp argmax in the total order "probability descending (nan last), then id ascending",
// each round taking the best strictly after the previous winner.
//
// Experts whose types all have an integer mat-vec (matvec_q*.cu) run on it
// (launch_moe_expert_outputs_q): lists of up to kMoeByPairMaxPairs pairs (decode) pair by pair,
// longer ones (prefill) grouped by expert (moe_group_kernel) in chunks of kMoeChunkPairs pairs of
// one expert, each chunk one several-activation mat-vec. Either way each pair's gate, up and down
// are bitwise the CPU's dot products, so y is the CPU backend's. The others decode to fp32:
// the listed pairs are grouped by expert on the device (moe_group_kernel: per expert its
// pairs), so each routed expert's gate, up and down rows are decoded once per
// pass of 8 pairs for all pairs routed to it. Each pair's dot products are warp_row_dots, i.e.
// bitwise Device::matvec of that pair's activation, whatever else the window routes: a T-row
// window equals T one-row windows bit for bit. The hidden layer is swiglu(gate, up), zero past
// n_ff (a down row zero-padded to whole blocks meets h = 0 there), quantized for down's layout
// like any activation; moe_combine adds the pair outputs in rank order with fma, as the CPU does.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/decode.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_matvec_rows.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGroupThreads = 1024;
__device__ __forceinline__ int32_t pair_of(const int32_t* listed, int64_t i) {
  return listed ? listed[i] : int32_t(i);
}

// One thread block: counts per expert (atomics into slot_of), slots in ascending expert order (a
// block-wide prefix sum of "has pairs", of the counts and of their chunks of kMoeChunkPairs,
// kGroupThreads experts at a time), then each pair into its expert's items. The order of the
// items within an expert is the atomics' and may differ run to run; nothing depends on it, since
// each pair's results are its own whatever pairs share its chunk.
__global__ void __launch_bounds__(kGroupThreads)
    moe_group_kernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ listed,
                     int64_t n_listed, int64_t n_experts, MoeBuffers buf) {
  await_previous_kernel();
  using Scan = cub::BlockScan<int3, kGroupThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int3 carry;
  const auto expert_of = [&](int64_t i) { return ids[pair_of(listed, i)]; };
  for (int64_t e = threadIdx.x; e < n_experts; e += kGroupThreads) buf.slot_of[e] = 0;
  if (threadIdx.x == 0) carry = make_int3(0, 0, 0);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n_listed; i += kGroupThreads) {
    const int32_t e = expert_of(i);
    if (e >= 0 && e < n_experts) atomicAdd(&buf.slot_of[e], 1);
  }
  __syncthreads();
  for (int64_t base = 0; base < n_experts; base += kGroupThreads) {
    const int64_t e = base + threadIdx.x;
    const int32_t c = e < n_experts ? buf.slot_of[e] : 0;
    // x: slots before this expert, y: items before it, z: chunks before it.
    int3 before, total;
    Scan(scan).ExclusiveScan(
        make_int3(c > 0, c, (c + kMoeChunkPairs - 1) / kMoeChunkPairs), before, make_int3(0, 0, 0),
        [](int3 a, int3 b) { return make_int3(a.x + b.x, a.y + b.y, a.z + b.z); }, total);
    const int3 at = carry;
    if (e < n_experts) {
      const int32_t slot = at.x + before.x;
      buf.slot_of[e] = c > 0 ? slot : -1;
      if (c > 0) {
        buf.active[slot] = int32_t(e);
        buf.first[slot] = at.y + before.y;
        buf.count[slot] = c;
        buf.chunk_first[slot] = at.z + before.z;
        buf.cursor[slot] = at.y + before.y;
      }
    }
    __syncthreads();  // every thread has read carry and the scan storage is free again
    if (threadIdx.x == 0) carry = make_int3(at.x + total.x, at.y + total.y, at.z + total.z);
    __syncthreads();
  }
  if (threadIdx.x == 0) *buf.n_active = carry.x, *buf.n_chunks = carry.z;
  for (int64_t i = threadIdx.x; i < n_listed; i += kGroupThreads) {
    const int32_t e = expert_of(i);
    if (e >= 0 && e < n_experts) buf.items[atomicAdd(&buf.cursor[buf.slot_of[e]], 1)] = int32_t(i);
  }
}

// Matrix blockIdx.z (0 gate, 1 up) of the expert in slot blockIdx.y, for its pairs, when the
// matrix has this kernel's type. Output: gate / up row of the listed pair.
template <typename D>
__global__ void __launch_bounds__(kThreads)
    moe_gate_up_kernel(const ExpertEntry* __restrict__ table, int32_t type,
                       const int32_t* __restrict__ listed, int64_t top_k, MoeBuffers buf,
                       DecodeTables tables) {
  await_previous_kernel();
  const int m = blockIdx.z;
  for (int slot = blockIdx.y; slot < *buf.n_active; slot += gridDim.y) {
    const ExpertEntry& en = table[buf.active[slot]];
    if (en.type[m] != type) continue;
    const auto* w = static_cast<const uint8_t*>(en.w[m]);
    const float* act = buf.x_act[en.act[m]];
    const int64_t act_stride = buf.x_act_stride[en.act[m]];
    float* out = m == 0 ? buf.gate : buf.up;
    const int32_t* items = buf.items + buf.first[slot];
    const int n_items = buf.count[slot];
    for (int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; o < en.rows[m];
         o += int64_t(gridDim.x) * kWarps) {
      for (int first = 0; first < n_items; first += kActsPerPass) {
        warp_row_dots<D>(
            w + size_t(o) * en.row_stride[m], en.cols[m] / 8,
            min(kActsPerPass, n_items - first), tables,
            [&](int j) { return act + (pair_of(listed, items[first + j]) / top_k) * act_stride; },
            [&](int j, float v) { out[items[first + j] * buf.ff_stride + o] = v; });
      }
    }
  }
}

// The down matrix of the expert in slot blockIdx.y for its pairs: out row = the listed pair.
template <typename D>
__global__ void __launch_bounds__(kThreads)
    moe_down_kernel(const ExpertEntry* __restrict__ table, int32_t type,
                    const int32_t* __restrict__ listed, MoeBuffers buf, float* __restrict__ out,
                    int64_t out_stride, DecodeTables tables) {
  await_previous_kernel();
  for (int slot = blockIdx.y; slot < *buf.n_active; slot += gridDim.y) {
    const ExpertEntry& en = table[buf.active[slot]];
    if (en.type[2] != type) continue;
    const auto* w = static_cast<const uint8_t*>(en.w[2]);
    const int32_t* items = buf.items + buf.first[slot];
    const int n_items = buf.count[slot];
    for (int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; o < en.rows[2];
         o += int64_t(gridDim.x) * kWarps) {
      for (int first = 0; first < n_items; first += kActsPerPass) {
        warp_row_dots<D>(
            w + size_t(o) * en.row_stride[2], en.cols[2] / 8,
            min(kActsPerPass, n_items - first), tables,
            [&](int j) { return buf.hidden + items[first + j] * buf.ff_stride; },
            [&](int j, float v) { out[int64_t(pair_of(listed, items[first + j])) * out_stride + o] = v; });
      }
    }
  }
}

// Few rows (decode): no grouping. Matrix blockIdx.z of the expert of pair blockIdx.y, one warp
// per output row, each pair on its own (a pair's dots are warp_row_dots of one activation, so
// bitwise what the grouped kernels give).
template <typename D>
__global__ void __launch_bounds__(kThreads)
    moe_pair_gate_up_kernel(const ExpertEntry* __restrict__ table, int32_t type,
                            int64_t n_experts, const int32_t* __restrict__ ids, int64_t n_pairs,
                            int64_t top_k, MoeBuffers buf, DecodeTables tables) {
  await_previous_kernel();
  const int m = blockIdx.z;
  for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
    if (ids[p] < 0 || ids[p] >= n_experts) continue;
    const ExpertEntry& en = table[ids[p]];
    if (en.type[m] != type || !en.w[m]) continue;
    const auto* w = static_cast<const uint8_t*>(en.w[m]);
    const float* act = buf.x_act[en.act[m]] + (p / top_k) * buf.x_act_stride[en.act[m]];
    float* out = (m == 0 ? buf.gate : buf.up) + p * buf.ff_stride;
    for (int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; o < en.rows[m];
         o += int64_t(gridDim.x) * kWarps)
      warp_row_dots<D>(w + size_t(o) * en.row_stride[m], en.cols[m] / 8, 1, tables,
                       [&](int) { return act; }, [&](int, float v) { out[o] = v; });
  }
}

// down for every pair of token row r (blockIdx.y, + gridDim.y, ...) and the rank-order combine in
// one: the warp of
// output column o takes the pairs in rank order, y[r][o] = fma(weight, down . hidden, y[r][o]) as
// moe_combine does, so nothing goes through an `out` buffer. Every down has type D.
template <typename D>
__global__ void __launch_bounds__(kThreads)
    moe_pair_down_combine_kernel(const ExpertEntry* __restrict__ table, int64_t n_experts,
                                 const int32_t* __restrict__ ids, const float* __restrict__ weights,
                                 int64_t top_k, MoeBuffers buf, float* __restrict__ y,
                                 int64_t y_stride, int64_t rows, int64_t cols,
                                 DecodeTables tables) {
  await_previous_kernel();
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; o < cols;
         o += int64_t(gridDim.x) * kWarps) {
      float acc = y[r * y_stride + o];
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t p = r * top_k + j;
        // An id outside the table (routing is device data) adds nothing.
        if (ids[p] < 0 || ids[p] >= n_experts || !table[ids[p]].w[2]) continue;
        const ExpertEntry& en = table[ids[p]];
        float v = 0.0f;
        warp_row_dots<D>(static_cast<const uint8_t*>(en.w[2]) + size_t(o) * en.row_stride[2],
                         en.cols[2] / 8, 1, tables,
                         [&](int) { return buf.hidden + p * buf.ff_stride; },
                         [&](int, float d) { v = d; });
        acc = __fmaf_rn(weights[p], __shfl_sync(kFullMask, v, 0), acc);
      }
      if ((threadIdx.x & 31) == 0) y[r * y_stride + o] = acc;
    }
  }
}

// Hidden row of one listed pair, kPerLane elements per lane per activation block.
template <int kPerLane>
__device__ void hidden_row(const float* gate, const float* up, float* h, int64_t n_ff,
                           int64_t cols, ActQuant mode) {
  constexpr int kBlock = 32 * kPerLane;
  const int lane = threadIdx.x & 31;
  for (int64_t b0 = int64_t(threadIdx.x / 32) * kBlock; b0 < cols; b0 += kWarps * kBlock) {
    float v[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t k = b0 + lane * kPerLane + i;
      v[i] = k < n_ff ? swiglu_value(gate[k], up[k]) : 0.0f;
    }
    if (mode != ActQuant::None) quantize_block_warp(v, mode);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t k = b0 + lane * kPerLane + i;
      if (k < cols) h[k] = v[i];
    }
  }
}

// plain: swiglu values as they are (the integer path quantizes them to bytes afterwards), else
// rounded through down's activation layout.
__global__ void __launch_bounds__(kThreads)
    moe_hidden_kernel(const ExpertEntry* __restrict__ table, int64_t n_experts,
                      const int32_t* __restrict__ ids, const int32_t* __restrict__ listed,
                      int64_t n_listed, MoeBuffers buf, bool plain, Tensor unrouted_out) {
  await_previous_kernel();
  for (int64_t i = blockIdx.x; i < n_listed; i += gridDim.x) {
    const int32_t e = ids[pair_of(listed, i)];
    if (e < 0 || e >= n_experts) {
      // (The grouped down never visits this pair: its output row is zero here.)
      if (unrouted_out.data)
        for (int64_t k = threadIdx.x; k < unrouted_out.cols; k += blockDim.x)
          unrouted_out.data[pair_of(listed, i) * unrouted_out.stride + k] = 0.0f;
      continue;
    }
    const ExpertEntry& en = table[e];
    const float* g = buf.gate + i * buf.ff_stride;
    const float* u = buf.up + i * buf.ff_stride;
    float* h = buf.hidden + i * buf.ff_stride;
    const ActQuant mode = plain ? ActQuant::None : ActQuant(en.act[2]);
    if (mode == ActQuant::Q8_K)
      hidden_row<8>(g, u, h, en.rows[0], en.cols[2], mode);
    else
      hidden_row<1>(g, u, h, en.rows[0], en.cols[2], mode);
  }
}

__global__ void moe_combine_kernel(const float* __restrict__ weights, int64_t top_k,
                                   const float* __restrict__ out, int64_t out_stride, int64_t rows,
                                   int64_t cols, float* __restrict__ y, int64_t y_stride) {
  await_previous_kernel();
  const int64_t n = rows * cols;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = u / cols, c = u % cols;
    float acc = y[r * y_stride + c];
#pragma unroll 8  // the loads run ahead of the chain
    for (int64_t j = 0; j < top_k; ++j)
      acc = __fmaf_rn(weights[r * top_k + j], out[(r * top_k + j) * out_stride + c], acc);
    y[r * y_stride + c] = acc;
  }
}

// A probability as a key whose unsigned order is the ranking's: numbers (never negative here)
// above nan, larger above smaller. 0: none.
__device__ __forceinline__ uint32_t rank_key(float p) {
  return p == p ? __float_as_uint(p) + 1u : 0u;
}

// The best of the elements (strided: `lane`, lane + 32, ...) ranking after (after_key, after),
// found by the whole warp: each lane scans every 32nd of them, then two warp reductions (largest
// key, then the lowest id holding it). Returns the key (0 when none is left); id is set for it.
__device__ __forceinline__ uint32_t warp_best_of_lane(const float* p, int n, int lane,
                                                      uint32_t after_key, int after, int& id) {
  uint32_t key = 0;
  int mine = INT_MAX;
  for (int i = lane + 32 * int(threadIdx.x); i < n; i += 32 * 32) {
    const uint32_t k = rank_key(p[i]);
    const bool after_it = after < 0 || k < after_key || (k == after_key && i > after);
    // (ids grow with i: the first of equal keys stays; a nan, key 0, only when nothing else is)
    if (after_it && (mine == INT_MAX || k > key)) key = k, mine = i;
  }
  const uint32_t best_key = __reduce_max_sync(kFullMask, key);
  id = int(__reduce_min_sync(kFullMask, key == best_key ? uint32_t(mine) : ~0u));
  return best_key;
}

// One warp per row. Dynamic shared memory: the row's n probabilities (16-byte aligned), then the
// top_k chosen ids and their probabilities. The row's loads are unrolled so they are in flight
// together (one warp hides no latency behind another). The softmax sum is one chain in column
// order, as on the CPU, which every lane runs over broadcast 16-byte loads (so no lane waits for
// another's). Each lane keeps its best candidate; a round's winner is two warp reductions
// (largest key, then lowest id among the lanes holding it), and the warp together finds the
// winning lane's next candidate (a lane scanning its own column alone was the kernel's longest
// part).
__global__ void __launch_bounds__(32)
    route_kernel(const float* __restrict__ logits, int64_t stride, int n, int top_k,
                 bool renormalize, int32_t* __restrict__ experts, float* __restrict__ weights) {
  await_previous_kernel();
  extern __shared__ float4 p4[];
  float* p = reinterpret_cast<float*>(p4);
  const int n_padded = (n + 3) / 4 * 4;
  int* chosen = reinterpret_cast<int*>(p + n_padded);
  float* chosen_p = p + n_padded + top_k;
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.x;
  const float* l = logits + r * stride;
#pragma unroll 16
  for (int i = lane; i < n; i += 32) p[i] = l[i];
  float mx = -INFINITY;
#pragma unroll 16
  for (int i = lane; i < n; i += 32) mx = fmaxf(mx, p[i]);
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
#pragma unroll 16
  for (int i = lane; i < n; i += 32) p[i] = expf(__fsub_rn(p[i], mx));
  __syncwarp();
  float sum = 0.0f;
#pragma unroll 8
  for (int q = 0; q < n / 4; ++q) {
    const float4 v = p4[q];
    sum = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(sum, v.x), v.y), v.z), v.w);
  }
  for (int i = n / 4 * 4; i < n; ++i) sum = __fadd_rn(sum, p[i]);
  __syncwarp();  // every lane has read the exponentials before they are divided
#pragma unroll 16
  for (int i = lane; i < n; i += 32) p[i] = __fdiv_rn(p[i], sum);
  __syncwarp();
  uint32_t mine_key = 0;
  int mine = INT_MAX;
#pragma unroll 16
  for (int i = lane; i < n; i += 32) {
    const uint32_t k = rank_key(p[i]);
    if (mine == INT_MAX || k > mine_key) mine_key = k, mine = i;
  }
  for (int k = 0; k < top_k; ++k) {
    const uint32_t best_key = __reduce_max_sync(kFullMask, mine_key);
    const int best = int(__reduce_min_sync(kFullMask, mine_key == best_key ? uint32_t(mine) : ~0u));
    if (lane == 0) chosen[k] = best, chosen_p[k] = p[best];
    int next = INT_MAX;
    const uint32_t next_key = warp_best_of_lane(p, n, best % 32, best_key, best, next);
    if (best % 32 == lane) mine_key = next_key, mine = next;
  }
  __syncwarp();
  float total = 0.0f;
  for (int k = 0; k < top_k; ++k) total = __fadd_rn(total, chosen_p[k]);
  for (int k = lane; k < top_k; k += 32) {
    experts[r * top_k + k] = chosen[k];
    weights[r * top_k + k] = renormalize ? __fdiv_rn(chosen_p[k], total) : chosen_p[k];
  }
}

}  // namespace

namespace {

// x in each activation layout the experts' gate/up read (buf.x_act), except where x itself is used.
void quantize_x_layouts(const DeviceContext& ctx, const Tensor& x, const MoeBuffers& buf) {
  for (int a = 0; a < 3; ++a)
    if (buf.x_act[a] && buf.x_act[a] != x.data)
      launch_quantize_act(ctx, a == int(ActQuant::Q8_K)   ? quant::ActFormat::Q8_K
                               : a == int(ActQuant::Q8_0) ? quant::ActFormat::Q8_0
                                                          : quant::ActFormat::F32,
                          x, buf.x_act[a]);
}

}  // namespace

void launch_moe_expert_outputs(const DeviceContext& ctx, const ExpertEntry* table,
                               int64_t n_experts, const int32_t* expert_ids, int64_t top_k,
                               const int32_t* listed, int64_t n_listed, const Tensor& x,
                               const quant::Type* gate_up_types, int n_gate_up_types,
                               const quant::Type* down_types, int n_down_types, int64_t max_ff,
                               const MoeBuffers& buf, Tensor out) {
  if (n_listed == 0) return;
  launch_kernel(moe_group_kernel, 1, kGroupThreads, 0, ctx.stream, expert_ids, listed, n_listed,
                n_experts, buf);
  STRATA_CUDA_CHECK_LAUNCH("moe_group_kernel");
  quantize_x_layouts(ctx, x, buf);
  const int64_t slots = n_listed < n_experts ? n_listed : n_experts;
  const unsigned grid_y = unsigned(slots < 65535 ? slots : 65535);
  for (int i = 0; i < n_gate_up_types; ++i) {
    visit_decoder(gate_up_types[i], [&](auto decoder) {
      using D = decltype(decoder);
      const dim3 grid(unsigned(grid_for(max_ff, kWarps, ctx.limits.max_blocks)), grid_y, 2);
      launch_kernel(moe_gate_up_kernel<D>, grid, kThreads, 0, ctx.stream, table,
                    int32_t(gate_up_types[i]), listed, top_k, buf, ctx.tables);
      STRATA_CUDA_CHECK_LAUNCH("moe_gate_up_kernel");
    });
  }
  launch_kernel(moe_hidden_kernel, unsigned(grid_for(n_listed, 1, ctx.limits.max_blocks)), kThreads,
                0, ctx.stream, table, n_experts, expert_ids, listed, n_listed, buf, false, out);
  STRATA_CUDA_CHECK_LAUNCH("moe_hidden_kernel");
  for (int i = 0; i < n_down_types; ++i) {
    visit_decoder(down_types[i], [&](auto decoder) {
      using D = decltype(decoder);
      const dim3 grid(unsigned(grid_for(x.cols, kWarps, ctx.limits.max_blocks)), grid_y, 1);
      launch_kernel(moe_down_kernel<D>, grid, kThreads, 0, ctx.stream, table,
                    int32_t(down_types[i]), listed, buf, out.data, out.stride, ctx.tables);
      STRATA_CUDA_CHECK_LAUNCH("moe_down_kernel");
    });
  }
}

void launch_moe_combine(const DeviceContext& ctx, const float* weights, int64_t top_k,
                        const Tensor& out, Tensor y) {
  if (y.rows == 0 || y.cols == 0) return;
  launch_kernel(moe_combine_kernel, grid_for(y.rows * y.cols, 256, ctx.limits.max_blocks), 256, 0,
                ctx.stream, weights, top_k, out.data, out.stride, y.rows, y.cols, y.data, y.stride);
  STRATA_CUDA_CHECK_LAUNCH("moe_combine_kernel");
}

void launch_moe_experts_by_pair(const DeviceContext& ctx, const ExpertEntry* table,
                                int64_t n_experts, const int32_t* expert_ids, const float* weights, int64_t top_k,
                                const Tensor& x, const quant::Type* gate_up_types,
                                int n_gate_up_types, quant::Type down_type, int64_t max_ff,
                                const MoeBuffers& buf, Tensor y) {
  const int64_t n_pairs = x.rows * top_k;
  if (n_pairs == 0) return;
  quantize_x_layouts(ctx, x, buf);
  const unsigned grid_y = unsigned(n_pairs < 65535 ? n_pairs : 65535);
  for (int i = 0; i < n_gate_up_types; ++i) {
    visit_decoder(gate_up_types[i], [&](auto decoder) {
      using D = decltype(decoder);
      const dim3 grid(unsigned(grid_for(max_ff, kWarps, ctx.limits.max_blocks)), grid_y, 2);
      launch_kernel(moe_pair_gate_up_kernel<D>, grid, kThreads, 0, ctx.stream, table,
                    int32_t(gate_up_types[i]), n_experts, expert_ids, n_pairs, top_k, buf,
                    ctx.tables);
      STRATA_CUDA_CHECK_LAUNCH("moe_pair_gate_up_kernel");
    });
  }
  launch_kernel(moe_hidden_kernel, unsigned(grid_for(n_pairs, 1, ctx.limits.max_blocks)), kThreads,
                0, ctx.stream, table, n_experts, expert_ids, nullptr, n_pairs, buf, false, Tensor{});
  STRATA_CUDA_CHECK_LAUNCH("moe_hidden_kernel");
  visit_decoder(down_type, [&](auto decoder) {
    using D = decltype(decoder);
    const dim3 grid(unsigned(grid_for(y.cols, kWarps, ctx.limits.max_blocks)),
                    unsigned(x.rows < 65535 ? x.rows : 65535), 1);
    launch_kernel(moe_pair_down_combine_kernel<D>, grid, kThreads, 0, ctx.stream, table, n_experts,
                  expert_ids, weights, top_k, buf, y.data, y.stride, x.rows, y.cols, ctx.tables);
    STRATA_CUDA_CHECK_LAUNCH("moe_pair_down_combine_kernel");
  });
}

void launch_moe_expert_outputs_q(const DeviceContext& ctx, const ExpertEntry* table,
                                 int64_t n_experts, const int32_t* expert_ids, int64_t top_k,
                                 const int32_t* listed, int64_t n_listed, const Tensor& x,
                                 const quant::Type* gate_up_types, int n_gate_up_types,
                                 const quant::Type* down_types, int n_down_types, int64_t max_ff,
                                 int64_t max_cols, const MoeBuffers& buf, Tensor out) {
  if (n_listed == 0) return;
  MoeQLaunch l{};
  l.table = table;
  l.n_experts = n_experts;
  l.ids = expert_ids;
  l.listed = listed;
  l.n_pairs = n_listed;
  l.tables = ctx.tables;
  l.device = ctx.index;
  l.sm_count = ctx.sm_count;
  l.stream = ctx.stream;
  // Long lists (prefill) by expert, in chunks of kMoeChunkPairs pairs: each chunk decodes its
  // expert's rows once for all its pairs.
  const bool grouped = n_listed > kMoeByPairMaxPairs;
  if (grouped) {
    launch_kernel(moe_group_kernel, 1, kGroupThreads, 0, ctx.stream, expert_ids, listed, n_listed,
                  n_experts, buf);
    STRATA_CUDA_CHECK_LAUNCH("moe_group_kernel");
    l.groups = {buf.n_active, buf.active,      buf.first,   buf.count,
                buf.items,    buf.chunk_first, buf.n_chunks};
    const int64_t slots = std::min(n_listed, n_experts);
    l.max_chunks = slots + n_listed / kMoeChunkPairs;  // sum of ceil(count / chunk) over the slots
  }
  // x as bytes in each layout gate/up read (x itself for fp32), unless the kernels quantize it.
  const bool fused_x = x.cols <= kMaxFusedActCols && n_listed <= kMoeByPairMaxPairs;
  if (fused_x) l.x = x.data, l.x_stride = x.stride;
  for (int a = 0; a < 3; ++a) {
    if (!buf.x_act[a]) continue;
    if (a == int(ActQuant::None)) {
      l.act[a] = reinterpret_cast<const uint8_t*>(buf.x_act[a]);
      l.act_stride[a] = size_t(buf.x_act_stride[a]) * sizeof(float);
      continue;
    }
    if (fused_x) continue;
    const quant::ActFormat f =
        a == int(ActQuant::Q8_K) ? quant::ActFormat::Q8_K : quant::ActFormat::Q8_0;
    l.act_stride[a] = quantized_act_stride(f, x.cols);
    launch_quantize_act(f, x.data, x.cols, int(x.rows), buf.x_act[a], l.act_stride[a], ctx.limits,
                        ctx.stream, x.stride);
    l.act[a] = reinterpret_cast<const uint8_t*>(buf.x_act[a]);
  }
  l.matrices[0] = 0, l.matrices[1] = 1, l.n_matrices = 2;
  l.act_div = top_k, l.act_at_pair = true, l.y_at_pair = false;
  l.y[0] = buf.gate, l.y[1] = buf.up, l.y_stride = buf.ff_stride;
  l.max_rows = max_ff;
  l.max_cols = x.cols;
  // One launch per weight type present; the first also zeroes the rows of pairs it cannot route.
  const auto launch_each_type = [&](const quant::Type* types, int n_types) {
    for (int i = 0; i < n_types; ++i) {
      l.type = types[i];
      l.block_elems = int(quant::type_info(l.type).block_elems);
      l.write_zeros = i == 0;
      launch_moe_q(l);
    }
  };
  launch_each_type(gate_up_types, n_gate_up_types);
  launch_kernel(moe_hidden_kernel, unsigned(grid_for(n_listed, 1, ctx.limits.max_blocks)), kThreads,
                0, ctx.stream, table, n_experts, expert_ids, listed, n_listed, buf, true,
                grouped ? out : Tensor{});
  STRATA_CUDA_CHECK_LAUNCH("moe_hidden_kernel");
  // The hidden rows as bytes in each down layout (unless the kernels quantize them), the first
  // written over the gate rows (read by now), a second over the up rows.
  const bool fused_hidden = max_cols <= kMaxFusedActCols && n_listed <= kMoeByPairMaxPairs;
  l.x = fused_hidden ? buf.hidden : nullptr, l.x_stride = buf.ff_stride;
  l.act[0] = l.act[1] = l.act[2] = nullptr;
  float* free_rows[2] = {buf.gate, buf.up};
  int n_free = 0;
  for (int i = 0; i < n_down_types; ++i) {
    const quant::ActFormat f = quant::kernels(down_types[i]).act;
    const int a = int(act_quant(f));
    if (l.act[a]) continue;
    if (f == quant::ActFormat::F32) {
      l.act[a] = reinterpret_cast<const uint8_t*>(buf.hidden);
      l.act_stride[a] = size_t(buf.ff_stride) * sizeof(float);
      continue;
    }
    if (fused_hidden) continue;
    l.act_stride[a] = quantized_act_stride(f, max_cols);
    launch_quantize_act(f, buf.hidden, max_cols, int(n_listed), free_rows[n_free],
                        l.act_stride[a], ctx.limits, ctx.stream, buf.ff_stride);
    l.act[a] = reinterpret_cast<const uint8_t*>(free_rows[n_free++]);
  }
  l.matrices[0] = 2, l.n_matrices = 1;
  l.act_div = 1, l.act_at_pair = false, l.y_at_pair = true;
  l.y[0] = out.data, l.y[1] = nullptr, l.y_stride = out.stride;
  l.max_rows = x.cols;
  l.max_cols = max_cols;
  launch_each_type(down_types, n_down_types);
}

void launch_route_softmax_topk(const DeviceContext& ctx, const Tensor& logits, int64_t top_k,
                               bool renormalize, int32_t* experts, float* weights) {
  if (logits.rows == 0) return;
  const size_t shared = size_t((logits.cols + 3) / 4 * 4 + 2 * top_k) * sizeof(float);
  if (shared > 48 * 1024)
    fail("CUDA route_softmax_topk: ", logits.cols, " experts exceed the kernel's shared memory");
  launch_kernel(route_kernel, unsigned(logits.rows), 32, shared, ctx.stream, logits.data,
                logits.stride, int(logits.cols), int(top_k), renormalize, experts, weights);
  STRATA_CUDA_CHECK_LAUNCH("route_kernel");
}

}  // namespace strata::cuda::detail
