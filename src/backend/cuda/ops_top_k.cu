// Each row's k largest values on the device (Backend::top_k; CPU reference: cpu/ops_top_k.cpp),
// so sampling reads k candidates a row instead of n_vocab logits. One block per row: a radix
// select over order-preserving integer keys (8 bits a pass, per-warp histograms) finds the k-th
// largest key; one pass collects the larger keys and, in column order, as many of the equal ones
// as are missing; the candidates are then ranked by (key descending, column ascending). Every step
// compares exactly, so the result is the CPU's bitwise.
#include <cmath>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;
static_assert(backend::Backend::kMaxTopK <= kThreads, "one candidate per thread when ranking");

// Larger float, larger key; -0 and +0 one key (they are equal logits to the sampler).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__global__ void top_k_kernel(const float* __restrict__ x, int64_t stride, int64_t rows, int64_t cols, int k,
                             int32_t* index, float* values, int64_t values_stride) {
  await_previous_kernel();
  __shared__ int warp_hist[kWarps][kBins];
  __shared__ int total[kBins];
  __shared__ uint32_t cand_key[kThreads];
  __shared__ int32_t cand_col[kThreads];
  __shared__ int warp_ties[kWarps];
  __shared__ uint32_t threshold;
  __shared__ int need, found, greater_slots;
  __shared__ bool take_all;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = x + r * stride;
    // Radix select: after the pass at `shift`, the threshold's bits above shift are known, and
    // `need` is how many keys equal to it on those bits are among the k largest.
    uint32_t prefix = 0, mask = 0;
    if (threadIdx.x == 0) need = k, take_all = false;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < kWarps * kBins; i += kThreads) (&warp_hist[0][0])[i] = 0;
      __syncthreads();
      for (int64_t base = 0; base < cols; base += kThreads) {
        const int64_t c = base + threadIdx.x;
        const float v = c < cols ? row[c] : NAN;
        const uint32_t key = order_key(v);
        const bool in = !isnan(v) && (key & mask) == prefix;
        const int bin = in ? int((key >> shift) & 0xFF) : kBins;
        const unsigned peers = __match_any_sync(kFullMask, bin);
        if (in && lane == __ffs(peers) - 1) atomicAdd(&warp_hist[warp][bin], __popc(peers));
      }
      __syncthreads();
      if (threadIdx.x < kBins) {
        int sum = 0;
        for (int w = 0; w < kWarps; ++w) sum += warp_hist[w][threadIdx.x];
        total[threadIdx.x] = sum;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int cum = 0;
        if (shift == 24) {
          for (int b = 0; b < kBins; ++b) cum += total[b];
          found = min(cum, k);
          take_all = cum <= k;  // every non-NaN value is among the k largest
          cum = 0;
        }
        for (int b = kBins - 1; b >= 0 && !take_all; --b) {
          cum += total[b];
          if (cum >= need) {
            need -= cum - total[b];
            threshold = (prefix & mask) | (uint32_t(b) << shift);
            break;
          }
        }
        greater_slots = 0;
      }
      __syncthreads();
      if (take_all) break;
      prefix = threshold;
      mask |= 0xFFu << shift;
    }
    // Collect: keys above the threshold in any order, then the first `need` equal ones by column.
    const uint32_t limit = take_all ? 0u : threshold;
    const int ties = take_all ? 0 : need;
    const int first_tie = found - ties;
    int taken = 0;
    for (int64_t base = 0; base < cols; base += kThreads) {
      const int64_t c = base + threadIdx.x;
      const float v = c < cols ? row[c] : NAN;
      const uint32_t key = order_key(v);
      const bool valid = !isnan(v);
      if (valid && (take_all || key > limit)) {
        const int slot = atomicAdd(&greater_slots, 1);
        cand_key[slot] = key, cand_col[slot] = int32_t(c);
      }
      const bool tie = valid && !take_all && key == limit;
      const unsigned ballot = __ballot_sync(kFullMask, tie);
      if (lane == 0) warp_ties[warp] = __popc(ballot);
      __syncthreads();
      int before = 0, all = 0;
      for (int w = 0; w < kWarps; ++w) {
        before += w < warp ? warp_ties[w] : 0;
        all += warp_ties[w];
      }
      const int rank = taken + before + __popc(ballot & ((1u << lane) - 1));
      if (tie && rank < ties) cand_key[first_tie + rank] = key, cand_col[first_tie + rank] = int32_t(c);
      taken += all;
      __syncthreads();  // warp_ties is the next chunk's
    }
    __syncthreads();
    const int t = threadIdx.x;
    if (t < found) {
      const uint32_t key = cand_key[t];
      const int32_t col = cand_col[t];
      int rank = 0;
      for (int j = 0; j < found; ++j)
        rank += cand_key[j] > key || (cand_key[j] == key && cand_col[j] < col);
      index[r * k + rank] = col;
      values[r * values_stride + rank] = row[col];
    } else if (t < k) {
      index[r * k + t] = -1;
      values[r * values_stride + t] = -INFINITY;
    }
    __syncthreads();  // the shared arrays are the next row's
  }
}

}  // namespace

void launch_top_k(const DeviceContext& ctx, const Tensor& x, int64_t k, int32_t* index, Tensor values) {
  if (x.rows == 0) return;
  launch_kernel(top_k_kernel, grid_for(x.rows, 1, ctx.limits.max_blocks), kThreads, 0, ctx.stream, x.data,
                x.stride, x.rows, x.cols, int(k), index, values.data, values.stride);
  STRATA_CUDA_CHECK_LAUNCH("top_k_kernel");
}

}  // namespace strata::cuda::detail
