// Attention over a layer's KV cache and the QSA block scores. One block per (row, head), its
// warps each taking a contiguous slice of the row's positions (the slices depend only on the row's
// position count, never on the window, so a T-row window equals T one-row windows bit for
// bit). In its slice a warp scores two positions per step, one per half-warp in the CPU's lane
// order (half_warp_dot's layout, query in registers), and runs the CPU's online softmax over them
// in position order (exp(m - s) rescales, fma accumulation). The slices' (max, sum, accumulator)
// are then merged in slice order and the row divided by the sum once. Scores equal the CPU's bit
// for bit; the outputs differ from the CPU's one serial pass only by expf's rounding and the merge.
#include <algorithm>
#include <span>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// The sequences of one launch (a window of several sequences, or the whole window as one): grid
// row blockIdx.y takes sequence blockIdx.y's rows [first, first + rows) with its caches.
struct CacheTable {
  static constexpr int kMax = 32;
  int64_t first[kMax];
  int64_t rows[kMax];
  int64_t cache_rows[kMax];  // the rows both caches have
  float* k[kMax];
  float* v[kMax];
};

// Runs launch(table, n, most rows) for the sequences in tables of up to CacheTable::kMax.
template <class Launch>
void for_each_table(std::span<const backend::SequenceCache> sequences, Launch launch) {
  for (size_t at = 0; at < sequences.size(); at += CacheTable::kMax) {
    const size_t n = std::min(sequences.size() - at, size_t(CacheTable::kMax));
    CacheTable table{};
    int64_t most_rows = 0;
    for (size_t i = 0; i < n; ++i) {
      const backend::SequenceCache& s = sequences[at + i];
      table.first[i] = s.first;
      table.rows[i] = s.rows;
      table.cache_rows[i] = std::min(s.k_cache.rows, s.v_cache.rows);
      table.k[i] = s.k_cache.data;
      table.v[i] = s.v_cache.data;
      most_rows = std::max(most_rows, s.rows);
    }
    launch(table, unsigned(n), most_rows);
  }
}

__global__ void kv_write_kernel(const CacheTable table, int64_t kc_stride, int64_t vc_stride,
                                const float* __restrict__ k, int64_t k_stride, int64_t k_cols,
                                const float* __restrict__ v, int64_t v_stride, int64_t v_cols,
                                const int32_t* __restrict__ positions) {
  await_previous_kernel();
  const int64_t cache_rows = table.cache_rows[blockIdx.y];
  const int64_t first = table.first[blockIdx.y], rows = table.rows[blockIdx.y];
  k += first * k_stride, v += first * v_stride, positions += first;
  float* const kc = table.k[blockIdx.y];
  float* const vc = table.v[blockIdx.y];
  const int64_t width = k_cols + v_cols, n = rows * width;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = u / width, c = u % width, p = positions[r];
    if (p < 0 || p >= cache_rows) continue;  // a bad position writes nothing outside the cache
    if (c < k_cols)
      kc[p * kc_stride + c] = k[r * k_stride + c];
    else
      vc[p * vc_stride + (c - k_cols)] = v[r * v_stride + (c - k_cols)];
  }
}

struct RowRange {
  int64_t begin, count;
  bool dense;
};

__device__ __forceinline__ RowRange row_range(const AttendRows& a, int64_t r) {
  if (a.positions) return {0, int64_t(a.positions[r]) + 1, true};
  if (a.offsets) return {a.offsets[r], a.offsets[r + 1] - a.offsets[r], false};
  return {r * a.stride, a.counts[r], false};
}

// Warps per (row, head) in attention: enough that a decode row's few heads fill the GPU. A row
// of fewer than kMinSlice positions per warp takes fewer warps: a shorter slice is not worth its
// merge (and a row of at most kMinSlice positions is one serial pass, as on the CPU).
constexpr int kSplit = 16;
constexpr int64_t kMinSlice = 32;

// One step's loads in attention_kernel: this half-warp's key (lane order of the score) and the
// value rows of both positions (lane order of the accumulator).
template <int kHD>
struct StepLoads {
  float k[kHD / 16];
  float v[2][kHD / 32];
  bool valid;
};

template <int kHD>
__global__ void __launch_bounds__(kSplit * 32)
    attention_kernel(const float* __restrict__ q, int64_t q_stride, const CacheTable table,
                     int64_t kc_stride, int64_t vc_stride, AttendRows rows_of, int64_t n_head,
                     int64_t group, int64_t head_dim, float scale, float* __restrict__ y,
                     int64_t y_stride) {
  await_previous_kernel();
  // Row r of the sequence is the window's row first + r (what rows_of and q, y index).
  const int64_t first = table.first[blockIdx.y], rows = table.rows[blockIdx.y];
  const float* __restrict__ const kc = table.k[blockIdx.y];
  const float* __restrict__ const vc = table.v[blockIdx.y];
  constexpr int kChain = kHD / 16;  // dims per lane in the score's lane order
  constexpr int kAcc = kHD / 32;    // dims per lane of the accumulator
  __shared__ float slice_m[kSplit], slice_l[kSplit], slice_acc[kSplit][kHD];
  const int lane = threadIdx.x & 31, l16 = lane & 15, half = lane >> 4, warp = threadIdx.x / 32;
  const int64_t units = rows * n_head;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const int64_t r = first + u / n_head, h = u % n_head, kv_off = (h / group) * head_dim;
    const float* qh = q + r * q_stride + h * head_dim;
    float qreg[kChain];
#pragma unroll
    for (int k = 0; k < kChain; ++k) qreg[k] = l16 + 16 * k < head_dim ? qh[l16 + 16 * k] : 0.0f;
    float acc[kAcc];
#pragma unroll
    for (int k = 0; k < kAcc; ++k) acc[k] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const RowRange range = row_range(rows_of, r);
    const int64_t wanted = (range.count + kMinSlice - 1) / kMinSlice,
                  slices = wanted < kSplit ? wanted : kSplit;
    const int64_t first = warp < slices ? range.count * warp / slices : 0,
                  last = warp < slices ? range.count * (warp + 1) / slices : 0;
    // Every load of a step (its two keys, one per half-warp, and both value rows) is issued
    // together, the next step's while this one computes: a step used to wait for its keys, then
    // for its values, one memory round trip each (decode attention, head size 256: 35 -> 13 us).
    // (A variant that issued each step's loads at that step's start measured far slower.)
    const auto load = [&](int64_t i, StepLoads<kHD>& s) {
      const int64_t mine = i + half;
      s.valid = mine < last;
      const int64_t p = !s.valid ? 0 : range.dense ? mine : rows_of.selected[range.begin + mine];
      const int64_t ps[2] = {__shfl_sync(kFullMask, p, 0), __shfl_sync(kFullMask, p, 16)};
      const float* kp = kc + p * kc_stride + kv_off;
#pragma unroll
      for (int k = 0; k < kChain; ++k)
        s.k[k] = s.valid && l16 + 16 * k < head_dim ? kp[l16 + 16 * k] : 0.0f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float* vp = vc + ps[j] * vc_stride + kv_off;
#pragma unroll
        for (int k = 0; k < kAcc; ++k)
          s.v[j][k] = i + j < last && lane + 32 * k < head_dim ? vp[lane + 32 * k] : 0.0f;
      }
    };
    StepLoads<kHD> cur, next;
    if (first < last) load(first, cur);
    for (int64_t i = first; i < last; i += 2) {
      if (i + 2 < last) load(i + 2, next);
      // Half `half` scores the window's position i + half.
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < kChain; ++k)
        if (cur.valid && l16 + 16 * k < head_dim) dot = __fmaf_rn(qreg[k], cur.k[k], dot);
      dot = __fadd_rn(dot, __shfl_xor_sync(kFullMask, dot, 8));
      dot = __fadd_rn(dot, __shfl_xor_sync(kFullMask, dot, 4));
      dot = __fadd_rn(dot, __shfl_xor_sync(kFullMask, dot, 2));
      dot = __fadd_rn(dot, __shfl_xor_sync(kFullMask, dot, 1));
      const float scores[2] = {__fmul_rn(__shfl_sync(kFullMask, dot, 0), scale),
                               __fmul_rn(__shfl_sync(kFullMask, dot, 16), scale)};
      for (int j = 0; j < 2 && i + j < last; ++j) {
        const float s = scores[j];
        if (s > m) {
          const float c = expf(m - s);
#pragma unroll
          for (int k = 0; k < kAcc; ++k)
            if (lane + 32 * k < head_dim)
              acc[k] = __fadd_rn(cur.v[j][k], __fmul_rn(acc[k], c));  // fma(1, v, acc*c)
          l = __fadd_rn(__fmul_rn(l, c), 1.0f);
          m = s;
        } else {
          const float e = expf(s - m);
#pragma unroll
          for (int k = 0; k < kAcc; ++k)
            if (lane + 32 * k < head_dim) acc[k] = __fmaf_rn(e, cur.v[j][k], acc[k]);
          l = __fadd_rn(l, e);
        }
      }
      cur = next;
    }
    if (lane == 0) {
      slice_m[warp] = m;
      slice_l[warp] = l;
    }
#pragma unroll
    for (int k = 0; k < kAcc; ++k) slice_acc[warp][lane + 32 * k] = acc[k];
    __syncthreads();
    // Every thread merges the slices' sums in slice order (the same bits in each); thread d
    // merges dimension d. Empty slices (l == 0) take no part.
    float top = -INFINITY;
    for (int w = 0; w < kSplit; ++w)
      if (slice_l[w] > 0.0f) top = fmaxf(top, slice_m[w]);
    float sum = 0.0f;
    for (int w = 0; w < kSplit; ++w)
      if (slice_l[w] > 0.0f) sum = __fmaf_rn(slice_l[w], expf(slice_m[w] - top), sum);
    const float inv = __fdiv_rn(1.0f, sum);
    float* yh = y + r * y_stride + h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
      float merged = 0.0f;
      for (int w = 0; w < kSplit; ++w)
        if (slice_l[w] > 0.0f) merged = __fmaf_rn(slice_acc[w][d], expf(slice_m[w] - top), merged);
      yh[d] = __fmul_rn(merged, inv);
    }
    __syncthreads();  // the slices are read before the next unit writes them
  }
}

// One warp per (row, block): heads two at a time (one per half-warp), summed in head order.
__global__ void __launch_bounds__(kThreads)
    block_scores_kernel(const float* __restrict__ q, int64_t q_stride,
                        const float* __restrict__ keys, int64_t k_stride,
                        const int32_t* __restrict__ counts, const int32_t* __restrict__ positions,
                        int64_t block, int64_t rows, int64_t n_head, int64_t head_dim, float scale,
                        float* __restrict__ y, int64_t y_stride, int64_t y_cols) {
  await_previous_kernel();
  const int lane = threadIdx.x & 31, half = lane >> 4;
  const int64_t units = rows * y_cols;
  for (int64_t u = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; u < units;
       u += int64_t(gridDim.x) * kWarps) {
    const int64_t r = u / y_cols, b = u % y_cols;
    const int64_t count = counts ? int64_t(counts[r]) : (int64_t(positions[r]) + 1) / block;
    float sum = 0.0f;
    for (int64_t h0 = 0; b < count && h0 < n_head; h0 += 2) {
      const int64_t h = h0 + half;
      const float d = half_warp_dot(q + r * q_stride + (h < n_head ? h : 0) * head_dim,
                                    keys + b * k_stride, h < n_head ? head_dim : 0);
      const float d0 = __shfl_sync(kFullMask, d, 0), d1 = __shfl_sync(kFullMask, d, 16);
      sum = __fadd_rn(sum, 0.0f < d0 ? d0 : 0.0f);
      if (h0 + 1 < n_head) sum = __fadd_rn(sum, 0.0f < d1 ? d1 : 0.0f);
    }
    if (lane == 0) y[r * y_stride + b] = __fmul_rn(sum, scale);
  }
}

template <int kHD>
void launch_attention_hd(const DeviceContext& ctx, const Tensor& q,
                         std::span<const backend::SequenceCache> sequences, const AttendRows& rows,
                         int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale, Tensor y) {
  const Tensor& cache = sequences[0].k_cache;
  for_each_table(sequences, [&](const CacheTable& table, unsigned n, int64_t most_rows) {
    const int grid = grid_for(most_rows * n_head, 1, ctx.limits.max_blocks);
    launch_kernel(attention_kernel<kHD>, dim3(unsigned(grid), n), kSplit * 32, 0, ctx.stream,
                  q.data, q.stride, table, cache.stride, sequences[0].v_cache.stride, rows, n_head,
                  n_head / n_head_kv, head_dim, scale, y.data, y.stride);
    STRATA_CUDA_CHECK_LAUNCH("attention_kernel");
  });
}

}  // namespace

void launch_kv_write(const DeviceContext& ctx, std::span<const backend::SequenceCache> sequences,
                     const Tensor& k, const Tensor& v, const int32_t* positions) {
  const Tensor &kc = sequences[0].k_cache, &vc = sequences[0].v_cache;
  for_each_table(sequences, [&](const CacheTable& table, unsigned n, int64_t most_rows) {
    const int64_t elements = most_rows * (k.cols + v.cols);
    if (elements == 0) return;
    launch_kernel(kv_write_kernel, dim3(unsigned(grid_for(elements, 256, ctx.limits.max_blocks)), n),
                  256, 0, ctx.stream, table, kc.stride, vc.stride, k.data, k.stride, k.cols, v.data,
                  v.stride, v.cols, positions);
    STRATA_CUDA_CHECK_LAUNCH("kv_write_kernel");
  });
}

void launch_attention(const DeviceContext& ctx, const Tensor& q,
                      std::span<const backend::SequenceCache> sequences, const AttendRows& rows,
                      int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale, Tensor y) {
  if (q.rows == 0) return;
  if (head_dim <= 64)
    launch_attention_hd<64>(ctx, q, sequences, rows, n_head, n_head_kv, head_dim, scale, y);
  else if (head_dim <= 128)
    launch_attention_hd<128>(ctx, q, sequences, rows, n_head, n_head_kv, head_dim, scale, y);
  else if (head_dim <= 256)
    launch_attention_hd<256>(ctx, q, sequences, rows, n_head, n_head_kv, head_dim, scale, y);
  else
    launch_attention_hd<512>(ctx, q, sequences, rows, n_head, n_head_kv, head_dim, scale, y);
}

void launch_block_scores(const DeviceContext& ctx, const Tensor& q, const Tensor& keys,
                         const int32_t* counts, const int32_t* positions, int64_t block,
                         int64_t n_head, int64_t head_dim, float scale, Tensor y) {
  if (y.rows == 0 || y.cols == 0) return;
  launch_kernel(block_scores_kernel, grid_for(y.rows * y.cols, kWarps, ctx.limits.max_blocks),
                kThreads, 0, ctx.stream, q.data, q.stride, keys.data, keys.stride, counts,
                positions, block, y.rows, n_head, head_dim, scale, y.data, y.stride, y.cols);
  STRATA_CUDA_CHECK_LAUNCH("block_scores_kernel");
}

}  // namespace strata::cuda::detail
