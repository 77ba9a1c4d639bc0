// QSA's indexer ops that model/qsa.cpp ran on the host: pooled block keys (block_mean) and the
// choice of attended positions (qsa_select).
//
// qsa_select takes one thread block per row. The top `keep` blocks are found in `keep` rounds: the
// order "score descending, then block ascending" is total, so each round's winner is the best
// block strictly after the previous winner in that order, found by a block-wide argmin whose
// result does not depend on the reduction's shape. The winners are then sorted ascending and
// expanded to positions, followed by the incomplete tail.
#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

__global__ void block_mean_kernel(const float* __restrict__ x, int64_t x_stride, int64_t x_rows,
                                  const int32_t* __restrict__ firsts, int64_t block, int64_t rows,
                                  int64_t cols, float* __restrict__ y, int64_t y_stride) {
  await_previous_kernel();
  const int64_t n = rows * cols;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = u / cols, c = u % cols, first = firsts[b];
    if (first < 0 || first + block > x_rows) {
      y[b * y_stride + c] = 0.0f;
      continue;
    }
    float sum = 0.0f;
    for (int64_t r = 0; r < block; ++r) sum = __fadd_rn(sum, x[(first + r) * x_stride + c]);
    y[b * y_stride + c] = __fdiv_rn(sum, float(block));
  }
}

constexpr int kSelectThreads = 256;

// Whether block a (score sa) comes before block b in the selection order.
__device__ __forceinline__ bool before(float sa, int64_t a, float sb, int64_t b) {
  return sa != sb ? sa > sb : a < b;
}

// The best (score, block) over the thread block; b = -1 stands for none. Every thread gets it.
__device__ void block_best(float& s, int64_t& b, float* s_sh, int64_t* b_sh) {
  for (int off = 16; off > 0; off >>= 1) {
    const float os = __shfl_xor_sync(kFullMask, s, off);
    const int64_t ob = __shfl_xor_sync(kFullMask, b, off);
    if (ob >= 0 && (b < 0 || before(os, ob, s, b))) s = os, b = ob;
  }
  const int warp = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) s_sh[warp] = s, b_sh[warp] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kSelectThreads / 32; ++w)
      if (b_sh[w] >= 0 && (b_sh[0] < 0 || before(s_sh[w], b_sh[w], s_sh[0], b_sh[0])))
        s_sh[0] = s_sh[w], b_sh[0] = b_sh[w];
  }
  __syncthreads();
  s = s_sh[0];
  b = b_sh[0];
  __syncthreads();  // s_sh / b_sh are reused by the next round
}

// Dynamic shared memory: top_blocks winners.
__global__ void __launch_bounds__(kSelectThreads)
    qsa_select_kernel(const float* __restrict__ scores, int64_t s_stride, int64_t s_cols,
                      const int32_t* __restrict__ positions, int64_t block, int64_t top_blocks,
                      int32_t* __restrict__ selected, int64_t sel_cols,
                      int32_t* __restrict__ counts) {
  await_previous_kernel();
  extern __shared__ int64_t chosen[];
  __shared__ float s_sh[kSelectThreads / 32];
  __shared__ int64_t b_sh[kSelectThreads / 32];
  const int64_t t = blockIdx.x;
  const int64_t p = positions[t];
  const int64_t complete = p < 0 ? 0 : (p + 1) / block;
  const int64_t nb = complete < s_cols ? complete : s_cols;
  const int64_t want = top_blocks < nb ? top_blocks : nb;
  const float* row = scores + t * s_stride;
  float prev_s = 0.0f;
  int64_t prev_b = -1, keep = 0;
  for (; keep < want; ++keep) {
    float s = 0.0f;
    int64_t b = -1;
    for (int64_t c = threadIdx.x; c < nb; c += kSelectThreads) {
      const float sc = row[c];
      if (sc != sc) continue;  // nan never wins
      if (prev_b >= 0 && !before(prev_s, prev_b, sc, c)) continue;  // taken in an earlier round
      if (b < 0 || before(sc, c, s, b)) s = sc, b = c;
    }
    block_best(s, b, s_sh, b_sh);
    if (b < 0) break;  // only nan scores left (all threads agree: b came from block_best)
    if (threadIdx.x == 0) chosen[keep] = b;
    prev_s = s;
    prev_b = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // ascending block order; keep is at most top_blocks
    for (int64_t i = 1; i < keep; ++i)
      for (int64_t j = i; j > 0 && chosen[j - 1] > chosen[j]; --j) {
        const int64_t tmp = chosen[j];
        chosen[j] = chosen[j - 1];
        chosen[j - 1] = tmp;
      }
  }
  __syncthreads();
  int32_t* out = selected + t * sel_cols;
  const int64_t tail_first = complete * block, tail = p + 1 - tail_first;
  for (int64_t i = threadIdx.x; i < keep * block; i += kSelectThreads)
    out[i] = int32_t(chosen[i / block] * block + i % block);
  for (int64_t i = threadIdx.x; i < tail; i += kSelectThreads)
    out[keep * block + i] = int32_t(tail_first + i);
  if (threadIdx.x == 0) counts[t] = int32_t(keep * block + (tail > 0 ? tail : 0));
}

}  // namespace

void launch_block_mean(const DeviceContext& ctx, const Tensor& x, const int32_t* firsts,
                       int64_t block, Tensor y) {
  if (y.rows == 0 || y.cols == 0) return;
  launch_kernel(block_mean_kernel, grid_for(y.rows * y.cols, 256, ctx.limits.max_blocks), 256, 0,
                ctx.stream, x.data, x.stride, x.rows, firsts, block, y.rows, y.cols, y.data,
                y.stride);
  STRATA_CUDA_CHECK_LAUNCH("block_mean_kernel");
}

void launch_qsa_select(const DeviceContext& ctx, const Tensor& scores, const int32_t* positions,
                       int64_t block, int64_t top_blocks, int32_t* selected, int64_t sel_cols,
                       int32_t* counts) {
  if (scores.rows == 0) return;
  const size_t shared = size_t(top_blocks > 0 ? top_blocks : 1) * sizeof(int64_t);
  launch_kernel(qsa_select_kernel, int(scores.rows), kSelectThreads, shared, ctx.stream,
                scores.data, scores.stride, scores.cols, positions, block, top_blocks, selected,
                sel_cols, counts);
  STRATA_CUDA_CHECK_LAUNCH("qsa_select_kernel");
}

}  // namespace strata::cuda::detail
