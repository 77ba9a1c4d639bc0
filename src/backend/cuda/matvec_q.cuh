// The skeleton shared by the integer mat-vecs (matvec_q_*.cu): a CTA of kWarps warps computes
// kWarps * R rows of y = W a for T activations a (the activation already in the layout the CPU
// backend pairs with the format: Q8_0 or Q8_K blocks, or fp32), walking the rows in steps of kStep
// blocks; each warp owns R of the rows.
//
// Each step's bytes (a chunk of every row of the CTA, and one chunk of each activation, shared by
// all warps) are copied with cp.async into a shared-memory stage, coalesced, while the CTA
// computes the previous step from the other stage; a format's lanes then read whatever part of a
// chunk they own with aligned shared loads. That decouples the global access pattern (contiguous
// runs of at least a kilobyte per row, as wide as the alignment allows) from the lane mapping each
// format needs for its integer dot products. (A first version staged 272-592 bytes per row and
// per warp: DRAM reached only 40-50% of the copy rate with runs that short.)
//
// Exactness: a format's step() forms each block's integer sum exactly (dp4a, integer shuffles) and
// applies the float operations of its CPU dot_ref in the same order (per-lane chains b % 8, one
// chain, or eight element lanes), so every y equals quant::kernels(t).dot_ref(row, act, cols) bit
// for bit, whatever R, T, the grid or the run. A row's arithmetic never depends on the other rows
// or activations of its CTA, so a T-activation call equals T one-activation calls.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda/act_q.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/ops.h"

namespace strata::cuda::detail::mvq {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFull = 0xffffffffu;

// What a kernel needs besides its format's constants.
struct Args {
  const uint8_t* w;
  size_t row_stride;
  int64_t rows;
  int nb;      // blocks per row
  int nsteps;  // ceil(nb / kStep)
  const uint8_t* act;
  size_t act_stride;   // bytes between the activations of consecutive tokens
  int tokens;          // activations present, <= the kernel's T
  float* y;            // y[t * rows + r]
  int w_unit, a_unit;  // copy granularity (bytes) for weight and activation chunks
  const uint64_t* iq2xs_grid;
  // run_row_groups<K, true>: the fp32 activation (one), which the CTA quantizes into shared
  // memory itself (act_blocks blocks) instead of copying `act`.
  const float* x;
  int act_blocks;
  // The shared-memory stage (stage_layout): bytes of a row's chunk and of an activation's chunk.
  int stage_row, stage_act;
  // A grouped MoE launch (moe_q_grouped_kernel): activation t and its output row, per token (in
  // shared memory); null: act + t * act_stride and y + t * rows.
  const uint8_t* const* act_rows;
  float* const* y_rows;
};

// (kGather: a grouped MoE launch's; a template parameter so that the other kernels compile to
// what they were: a run-time test changed the registers ptxas gave the Q8_0 mat-vec from 128 to 56
// with spills.)
template <bool kGather>
__device__ __forceinline__ const uint8_t* act_of(const Args& a, int tok) {
  if constexpr (kGather) return a.act_rows[tok];
  return a.act + size_t(tok) * a.act_stride;
}

template <bool kGather>
__device__ __forceinline__ float* y_of(const Args& a, int tok) {
  if constexpr (kGather) return a.y_rows[tok];
  return a.y + size_t(tok) * size_t(a.rows);
}

// The matrices of a matvec_q_matrices_kernel launch and the CTAs each takes.
struct Matrices {
  struct Matrix {
    const uint8_t* w;
    size_t row_stride;
    int64_t rows;
    float* y;
    int first_cta, ctas;
  } at[kMaxMatvecQMatrices];
  int n;
};

// Copies ------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int N>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  if constexpr (N == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)), "l"(src)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "n"(N)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// `bytes` from global src to 16-byte aligned shared dst, by the 32 lanes of a warp, in pieces of
// `unit` bytes (16, 8, 4 asynchronously; 2 with plain loads and stores); unit divides bytes and
// the address of src. Consecutive lanes take consecutive pieces, so each request is coalesced.
__device__ __forceinline__ void warp_copy(uint8_t* dst, const uint8_t* src, int bytes, int unit,
                                          int lane) {
  switch (unit) {
    case 16:
      for (int o = 16 * lane; o < bytes; o += 16 * 32) cp_async<16>(dst + o, src + o);
      break;
    case 8:
      for (int o = 8 * lane; o < bytes; o += 8 * 32) cp_async<8>(dst + o, src + o);
      break;
    case 4:
      for (int o = 4 * lane; o < bytes; o += 4 * 32) cp_async<4>(dst + o, src + o);
      break;
    default:
      for (int o = 2 * lane; o < bytes; o += 2 * 32)
        *reinterpret_cast<uint16_t*>(dst + o) = __ldg(reinterpret_cast<const uint16_t*>(src + o));
      break;
  }
}

// Small integer and float helpers
// --------------------------------------------------------------------

__device__ __forceinline__ float half_bits_to_float(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

__device__ __forceinline__ uint32_t ld_shared_u32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Sum of v over the lanes of each aligned group of `width` lanes (a power of two, <= 32); exact for
// integers, so the order of the butterfly does not matter.
template <int width>
__device__ __forceinline__ int group_sum(int v) {
#pragma unroll
  for (int o = 1; o < width; o <<= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Reduce-scatter of N values per lane over each aligned group of 8 lanes: at every lane offset
// (4, 2, 1) a lane keeps half of its values, sends the other half to its partner and adds what it
// receives, so N values cost N - 1 shuffles instead of 3N. Lane j ends with the group's sum of
// value j >> (3 - log2 N) (N = 8: value j). Exact: integer sums do not depend on the order.
template <int N, int kOffset>
__device__ __forceinline__ int reduce_scatter_round(int* v, int j) {
  if constexpr (kOffset == 0) {
    return v[0];
  } else if constexpr (N == 1) {
    v[0] += __shfl_xor_sync(kFull, v[0], kOffset);
    return reduce_scatter_round<1, kOffset / 2>(v, j);
  } else {
    const bool upper = (j & kOffset) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const int send = upper ? v[i] : v[i + N / 2], keep = upper ? v[i + N / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(kFull, send, kOffset);
    }
    return reduce_scatter_round<N / 2, kOffset / 2>(v, j);
  }
}

template <int N>
__device__ __forceinline__ int reduce_scatter8(int (&v)[N], int j) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "1, 2, 4 or 8 values");
  return reduce_scatter_round<N, 4>(v, j);
}

// The last step of every float dot of the CPU reference (quant/formats/blocks.h reduce8):
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) where lane `stride * c` of an 8-lane group
// holds l_c (stride 1: lanes c; stride 8: every eighth lane). Every lane of the group ends with the
// result: each adds the same two values.
template <int stride>
__device__ __forceinline__ float reduce8_lanes(float v) {
  v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 4 * stride));
  v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 2 * stride));
  return __fadd_rn(v, __shfl_xor_sync(kFull, v, 1 * stride));
}

// The kernel --------------------------------------------------------------------------------------

// K (a format's kernel traits) provides R, T, kStep, kBytes, kActBlockBytes, kRowPad (bytes
// after each row's chunk in a stage), kActStride (a full step of one activation), kSharedBytes, a
// zero-constructible Acc, and the device functions init_shared (CTA tables, may __syncthreads),
// step and finish. A format's step reads its blocks in groups of at most kBlockGrain, possibly
// past the row's last block (the results unused).
template <class K>
constexpr int kCtaRows = kWarps* K::R;

constexpr int kBlockGrain = 4;

// A launch's stages hold chunks of kStep blocks, or of the whole row (rounded up to kBlockGrain)
// when that is shorter, and there are two of them only when a row takes more than one step: the
// down projection of a 512-wide expert (two IQ2_XS blocks) then needs 2.4 KB of stage per CTA
// instead of 2 x 19 KB, so every CTA of a MoE launch is resident at once instead of each looping
// over three row groups.
struct StageLayout {
  int row, act;  // bytes of a row's chunk (16-aligned, with the format's pad), of an activation's
  int bytes;     // one stage: the CTA's row chunks, then its activations' chunks
  int count;     // 1 or 2
};

// Bytes after each activation's chunk in a stage: K::kActPad where a format sets one (the
// tensor-core traits, whose fragment loads read eight activations at one offset), else none.
template <class K>
constexpr int kActPad = [] {
  if constexpr (requires { K::kActPad; })
    return int(K::kActPad);
  else
    return 0;
}();

// Whether K reads only the a.tokens activations present (K::kPresentTokensOnly: the tensor-core
// traits clamp their fragment loads), so the stages hold no copies of the last one in the others'
// places. (Those copies were most of a 2-activation Q8_0 tensor-core launch's L2 traffic, every
// CTA reading the same lines: 38 us against 22 for 8 activations.)
template <class K>
constexpr bool kPresentTokensOnly = [] {
  if constexpr (requires { K::kPresentTokensOnly; })
    return bool(K::kPresentTokensOnly);
  else
    return false;
}();

template <class K>
__host__ __device__ constexpr StageLayout stage_layout(int64_t row_blocks) {
  const int64_t grained = (row_blocks + kBlockGrain - 1) / kBlockGrain * kBlockGrain;
  const int blocks = grained < K::kStep ? int(grained) : K::kStep;
  const int row = (blocks * K::kBytes + 15) / 16 * 16 + K::kRowPad;
  const int act = (blocks * K::kActBlockBytes + 15) / 16 * 16 + kActPad<K>;
  return {row, act, kCtaRows<K> * row + K::T * act, row_blocks > K::kStep ? 2 : 1};
}

// Elements of the format's activation block when the CTA can quantize it itself (Q8_0: 34 bytes,
// Q8_K: 292), else 0 (an fp32 activation is copied as it is).
template <class K>
constexpr int kActElems = K::kActBlockBytes == 34 ? 32 : K::kActBlockBytes == 292 ? 256 : 0;

// Where the CTA's own quantized activation starts, after the tables and the stages.
template <class K>
__host__ __device__ constexpr int fused_act_offset(const StageLayout& s) {
  return (K::kSharedBytes + s.count * s.bytes + 15) / 16 * 16;
}

template <class K>
constexpr int64_t kColsPerStep = int64_t(K::kStep) * kActElems<K>;

template <class K>
constexpr int kFusedActBytes =
    kActElems<K> == 0
        ? 0
        : int((kMaxFusedActCols + kColsPerStep<K> - 1) / kColsPerStep<K>) * K::kActStride;

// The CTA quantizes a.x into dst (a.act_blocks blocks of K's activation layout), warp by warp,
// with kBatch rounds of loads in flight before their quantization. Q8_K takes one: four rounds of
// a warp's 256 floats held 32 more registers at the kernel's peak, and the MoE's IQ2_XS gate/up
// ran slower for it (a window of 8 rows' experts 92.6 -> 85.0 us on the H200, two calls).
template <class K>
__device__ __forceinline__ void quantize_act_in_cta(uint8_t* dst, const Args& a, int warp,
                                                    int lane) {
  constexpr int kBatch = kActElems<K> == 256 ? 1 : 4;
  if constexpr (kActElems<K> == 256) {  // a warp per block
    for (int b0 = warp; b0 < a.act_blocks; b0 += kBatch * kWarps) {
      float4 u[kBatch], v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int b = min(b0 + k * kWarps, a.act_blocks - 1);
        const float4* src = reinterpret_cast<const float4*>(a.x + size_t(b) * 256) + 2 * lane;
        u[k] = src[0], v[k] = src[1];
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (b0 + k * kWarps < a.act_blocks)
          quantize_q8_k_values(u[k], v[k], dst + size_t(b0 + k * kWarps) * 292, lane);
    }
  } else if constexpr (kActElems<K> == 32) {  // 8 lanes per block, 4 blocks a warp
    for (int b0 = 4 * warp + lane / 8; b0 - lane / 8 < a.act_blocks; b0 += kBatch * 4 * kWarps) {
      float4 u[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int b = min(b0 + k * 4 * kWarps, a.act_blocks - 1);
        u[k] = reinterpret_cast<const float4*>(a.x + size_t(b) * 32)[lane % 8];
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int b = b0 + k * 4 * kWarps;
        quantize_q8_0_values(u[k], dst + size_t(b < a.act_blocks ? b : 0) * 34, b < a.act_blocks,
                             lane % 8);
      }
    }
  }
}

// Warp w copies its own R row chunks and the chunks of activations w, w + kWarps, ... (kFused:
// only the rows).
template <class K, bool kFused, bool kGather>
__device__ __forceinline__ void stage_step(uint8_t* stage, const Args& a, int64_t r0, int t,
                                           int warp, int lane) {
  const int blk0 = t * K::kStep;
  const int nblk = min(K::kStep, a.nb - blk0);
  // (Sixteen rows a warp, the tensor-core traits: a loop, or their addresses hold the registers.)
#pragma unroll(K::R > 8 ? 1 : K::R)
  for (int rr = 0; rr < K::R; ++rr) {
    const int row = warp * K::R + rr;
    // Rows past the end copy the last row again, so every byte a lane reads was written.
    const int64_t r = min(r0 + row, a.rows - 1);
    warp_copy(stage + row * a.stage_row,
              a.w + size_t(r) * a.row_stride + size_t(blk0) * K::kBytes, nblk * K::kBytes, a.w_unit,
              lane);
  }
  if constexpr (!kFused) {  // (fused: the activation is already in shared memory)
    const int staged = kPresentTokensOnly<K> ? min(K::T, a.tokens) : K::T;
    for (int tok = warp; tok < staged; tok += kWarps) {
      const int src = min(tok, a.tokens - 1);
      warp_copy(stage + kCtaRows<K> * a.stage_row + tok * a.stage_act,
                act_of<kGather>(a, src) + size_t(blk0) * K::kActBlockBytes, nblk * K::kActBlockBytes,
                a.a_unit, lane);
    }
  }
}

// The row groups a CTA takes: blockIdx.x, blockIdx.x + gridDim.x, ... (GridShare), or its share of
// one matrix in a launch of several (MatrixShare). (A type, not two numbers, so the one-matrix
// kernels compile to what they were: with the numbers as arguments the compiler allocated the
// Q8_0 8-activation kernel 96 registers instead of 128.)
struct GridShare {
  __device__ int64_t first() const { return blockIdx.x; }
  __device__ int64_t stride() const { return gridDim.x; }
};
struct MatrixShare {
  int64_t first_group, ctas;
  __device__ int64_t first() const { return first_group; }
  __device__ int64_t stride() const { return ctas; }
};

// Row groups share.first(), + share.stride(), ... of y = W a (K::init_shared done).
// kFused: the CTA quantizes a.x itself (a template parameter, so the plain mat-vec carries none of
// that code: with it compiled in, the Q8_0 mat-vec measured 6.9 -> 9.3 us on the H200).
// The stages are laid out for rows of at most `stage_blocks` blocks (a.nb or more).
template <class K, bool kFused, class Share = GridShare, bool kGather = false>
__device__ __forceinline__ void run_row_groups(uint8_t* smem, Args& a, int64_t stage_blocks,
                                               const Share share = {}) {
  static_assert(!kFused || kActElems<K> != 0, "only Q8_0 and Q8_K activations are fused");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const StageLayout layout = stage_layout<K>(stage_blocks);
  a.stage_row = layout.row, a.stage_act = layout.act;
  uint8_t* const stages = smem + K::kSharedBytes;
  const int64_t groups = (a.rows + kCtaRows<K> - 1) / kCtaRows<K>;
  uint8_t* const fused_act = smem + fused_act_offset<K>(layout);
  for (int64_t g = share.first(); g < groups; g += share.stride()) {
    const int64_t r0 = g * kCtaRows<K>;
    typename K::Acc acc{};
    stage_step<K, kFused, kGather>(stages, a, r0, 0, warp, lane);
    cp_async_commit();
    // While the first weights are on their way (the loop's first barrier publishes it).
    if constexpr (kFused)
      if (g == share.first()) quantize_act_in_cta<K>(fused_act, a, warp, lane);
    for (int t = 0; t < a.nsteps; ++t) {
      if (t + 1 < a.nsteps)
        stage_step<K, kFused, kGather>(stages + ((t + 1) & 1) * layout.bytes, a, r0, t + 1, warp,
                                       lane);
      cp_async_commit();
      cp_async_wait<1>();  // step t's group has landed (only step t + 1's may be in flight)
      __syncthreads();     // ... for every thread's copies
      const uint8_t* stage = stages + (t & 1) * layout.bytes;
      const uint8_t* act =
          kFused ? fused_act + t * K::kActStride : stage + kCtaRows<K> * layout.row;
      K::step(stage + warp * K::R * layout.row, act, smem, a, t, lane, acc);
      __syncthreads();  // every warp is done reading this stage before it is refilled
    }
    K::template finish<kGather>(acc, a, r0 + warp * K::R, lane);
  }
}

// kFromX: one activation, quantized by each CTA itself (launch<K, true>).
template <class K, bool kFromX = false>
__global__ void __launch_bounds__(kThreads) matvec_q_kernel(Args a) {
  await_previous_kernel();
  extern __shared__ __align__(16) uint8_t smem[];
  K::init_shared(smem, a);
  run_row_groups<K, kFromX>(smem, a, a.nb);
}

// Several matrices of one x (1 to kMaxMatvecTokens activations) in one launch (matvec_q over
// MatvecQMatrix lists): CTAs first_cta .. first_cta + ctas - 1 of the grid take matrix i's row
// groups, each exactly as the one-matrix kernel would (the same bits).
template <class K>
__global__ void __launch_bounds__(kThreads) matvec_q_matrices_kernel(Args a, const Matrices m) {
  await_previous_kernel();
  extern __shared__ __align__(16) uint8_t smem[];
  K::init_shared(smem, a);
  int i = 0;
  while (i + 1 < m.n && int(blockIdx.x) >= m.at[i + 1].first_cta) ++i;
  a.w = m.at[i].w;
  a.row_stride = m.at[i].row_stride;
  a.rows = m.at[i].rows;
  a.y = m.at[i].y;
  run_row_groups<K, false>(smem, a, a.nb,
                           MatrixShare{int64_t(blockIdx.x) - m.at[i].first_cta, m.at[i].ctas});
}

// The widest copy unit (16, 8, 4 or 2 bytes) that divides every address a chunk copy starts at and
// every chunk length: the base address, the stride between rows, a full chunk, the last chunk.
__host__ __device__ inline int copy_unit(const void* base, size_t stride, size_t full_chunk,
                                         size_t last_chunk) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(base) | stride | full_chunk | last_chunk | 16;
  return int(bits & (~bits + 1));  // lowest set bit
}

// The copy unit of a matrix's row chunks (steps of K::kStep blocks, the last of `last` blocks).
// Where the row stride is a multiple of 16 the last chunk's length does not bind it: warp_copy's
// last piece may then run past the chunk, into the row's padding and never past its stride, so a
// row of 74-byte blocks that CudaBackend::weight padded to a 16-byte stride is copied in 16-byte
// units.
template <class K>
__host__ __device__ inline int weight_copy_unit(const void* w, size_t row_stride, size_t last) {
  return copy_unit(w, row_stride, size_t(K::kStep) * K::kBytes,
                   row_stride % 16 == 0 ? 0 : last * K::kBytes);
}

// Blocks in the widest row a MoE launch reads: what its stages are laid out for.
__host__ __device__ inline int64_t moe_stage_blocks(const MoeQLaunch& l) {
  return (l.max_cols + l.block_elems - 1) / l.block_elems;
}

// Matrix l.matrices[blockIdx.z] of the expert of list position blockIdx.y (launch.h's
// MoeQLaunch): the mat-vec above with that expert's rows and the pair's activation, so each
// pair's y is bitwise the plain mat-vec's.
// (K::moe_min_ctas(): CTAs per SM the register budget must allow. IQ2_XS and Q8_0 fit 6 without
// spilling, which keeps a decode token's gate/up CTAs, 10 experts x 2 x 32, resident at once;
// the compiler's own choice, 122 registers, allowed 4.)
template <class K>
__global__ void __launch_bounds__(kThreads, K::moe_min_ctas()) moe_q_kernel(const MoeQLaunch l) {
  await_previous_kernel();
  extern __shared__ __align__(16) uint8_t smem[];
  Args a{};
  a.iq2xs_grid = l.tables.iq2xs_grid;
  K::init_shared(smem, a);
  const int64_t i = l.first + blockIdx.y, p = l.listed ? l.listed[i] : i;
  const int m = l.matrices[blockIdx.z];
  float* y = l.y[blockIdx.z] + (l.y_at_pair ? p : i) * l.y_stride;
  const int32_t e = l.ids[p];
  const ExpertEntry* en = e >= 0 && e < l.n_experts ? &l.table[e] : nullptr;
  if (!en || !en->w[m]) {
    if (l.write_zeros)
      for (int64_t r = int64_t(blockIdx.x) * kThreads + threadIdx.x; r < l.max_rows;
           r += int64_t(gridDim.x) * kThreads)
        y[r] = 0.0f;
    return;
  }
  // (The host checked every expert's columns against max_cols, which sized the stages.)
  const int64_t stage_blocks = moe_stage_blocks(l);
  if (en->type[m] != int32_t(l.type) || en->cols[m] > l.max_cols) return;
  const int64_t row = (l.act_at_pair ? p : i) / l.act_div;
  a.w = static_cast<const uint8_t*>(en->w[m]);
  a.row_stride = en->row_stride[m];
  a.rows = en->rows[m];
  a.nb = en->cols[m] / l.block_elems;
  a.nsteps = (a.nb + K::kStep - 1) / K::kStep;
  a.tokens = 1;
  a.y = y;
  const size_t last = size_t(a.nb % K::kStep);
  a.w_unit = weight_copy_unit<K>(a.w, a.row_stride, last);
  if constexpr (kActElems<K> != 0) {
    if (l.x) {
      a.x = l.x + row * l.x_stride;
      a.act_blocks = en->cols[m] / kActElems<K>;
      return run_row_groups<K, true>(smem, a, stage_blocks);
    }
  }
  const int act = en->act[m];
  a.act = l.act[act] + size_t(row) * l.act_stride[act];
  a.act_stride = l.act_stride[act];
  a.a_unit = copy_unit(a.act, a.act_stride, size_t(K::kStep) * K::kActBlockBytes,
                       last * K::kActBlockBytes);
  run_row_groups<K, false>(smem, a, stage_blocks);
}

// A long list's pairs grouped by expert (MoeQLaunch::groups): CTA row blockIdx.y is chunk
// l.first + blockIdx.y, up to K::T pairs of one expert (consecutive in its group), and runs them
// as one K::T-activation mat-vec of that expert's matrix l.matrices[blockIdx.z]: the expert's
// rows are decoded once per chunk instead of once per pair. Each pair's y is still bitwise the
// plain mat-vec's (a row's arithmetic never depends on the other activations of its CTA).
// Pairs whose expert id is outside the table are in no group (moe_hidden_kernel zeroes their
// output rows).
template <class K>
__global__ void __launch_bounds__(kThreads) moe_q_grouped_kernel(const MoeQLaunch l) {
  await_previous_kernel();
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ const uint8_t* act_rows[K::T];
  __shared__ float* y_rows[K::T];
  Args a{};
  a.iq2xs_grid = l.tables.iq2xs_grid;
  K::init_shared(smem, a);
  const MoeGroups& gr = l.groups;
  const int64_t chunk = l.first + blockIdx.y;
  if (chunk >= *gr.n_chunks) return;
  // The expert's slot: the last whose first chunk is at or before this one.
  int lo = 0, hi = *gr.n_active - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (gr.chunk_first[mid] <= chunk) lo = mid; else hi = mid - 1;
  }
  const int m = l.matrices[blockIdx.z];
  const ExpertEntry& en = l.table[gr.active[lo]];
  const int64_t c = (chunk - gr.chunk_first[lo]) * K::T;
  const int n = int(min(int64_t(K::T), gr.count[lo] - c));
  if (int(threadIdx.x) < n) {
    const int64_t i = gr.items[gr.first[lo] + c + threadIdx.x];
    const int64_t p = l.listed ? l.listed[i] : i;
    y_rows[threadIdx.x] = l.y[blockIdx.z] + (l.y_at_pair ? p : i) * l.y_stride;
    const int act = en.act[m];
    act_rows[threadIdx.x] = l.act[act] + size_t((l.act_at_pair ? p : i) / l.act_div) * l.act_stride[act];
  }
  __syncthreads();
  if (!en.w[m]) {
    if (l.write_zeros)
      for (int tok = 0; tok < n; ++tok)
        for (int64_t r = threadIdx.x; r < l.max_rows; r += kThreads) y_rows[tok][r] = 0.0f;
    return;
  }
  if (en.type[m] != int32_t(l.type) || en.cols[m] > l.max_cols) return;
  a.w = static_cast<const uint8_t*>(en.w[m]);
  a.row_stride = en.row_stride[m];
  a.rows = en.rows[m];
  a.nb = en.cols[m] / l.block_elems;
  a.nsteps = (a.nb + K::kStep - 1) / K::kStep;
  a.tokens = n;
  a.act_rows = act_rows;
  a.y_rows = y_rows;
  const size_t last = size_t(a.nb % K::kStep);
  a.w_unit = weight_copy_unit<K>(a.w, a.row_stride, last);
  const int act = en.act[m];
  a.a_unit = copy_unit(l.act[act], l.act_stride[act], size_t(K::kStep) * K::kActBlockBytes,
                       last * K::kActBlockBytes);
  run_row_groups<K, false, GridShare, true>(smem, a, moe_stage_blocks(l));
}

// Host side ---------------------------------------------------------------------------------------

// Dynamic shared memory of a launch: K's tables, its stages, and with `fused` the whole quantized
// activation.
template <class K>
constexpr size_t smem_bytes(const StageLayout& s, bool fused) {
  return fused ? size_t(fused_act_offset<K>(s)) + size_t(kFusedActBytes<K>)
               : size_t(K::kSharedBytes) + size_t(s.count) * size_t(s.bytes);
}

// CTAs of `kernel` resident per SM on `device` with `smem` bytes of dynamic shared memory, its
// limit first raised to `most` bytes where that is above the default 48 KiB (most = 0: to the
// device's opt-in limit, and no CTA where smem is past it); looked up once per device and size (a
// launch must not pay for the query; a model has a few sizes).
template <auto kernel>
int resident_per_sm(int device, size_t smem, size_t most) {
  static std::mutex mutex;
  static std::map<std::pair<int, size_t>, int> per_sm;
  const std::lock_guard lock(mutex);
  if (const auto it = per_sm.find({device, smem}); it != per_sm.end()) return it->second;
  if (most == 0) {
    int limit = 0;
    check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "cudaDeviceGetAttribute");
    most = size_t(limit);
  }
  int blocks_per_sm = 0;
  if (smem <= most) {
    if (most > 48 * 1024)
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)),
            "cudaFuncSetAttribute");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, smem),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  }
  per_sm.emplace(std::pair{device, smem}, blocks_per_sm);
  return blocks_per_sm;
}

// The same for a kernel of K's skeleton, whose stages are at most those of a row of K::kStep + 1
// blocks with the fused activation.
template <class K, auto kernel>
int resident_ctas(int device, size_t smem) {
  const int blocks_per_sm =
      resident_per_sm<kernel>(device, smem, smem_bytes<K>(stage_layout<K>(K::kStep + 1), true));
  if (blocks_per_sm < 1) fail("CUDA matvec_q: kernel does not fit on the device");
  return blocks_per_sm;
}

// One matrix on matvec_q_kernel<K, kFromX>: one CTA per row group while they fit at once.
template <class K, bool kFromX>
void launch_one_matrix(const MatvecQLaunch& l, const Args& a, size_t smem) {
  const int64_t groups = (l.rows + kCtaRows<K> - 1) / kCtaRows<K>;
  const int64_t resident =
      int64_t(resident_ctas<K, matvec_q_kernel<K, kFromX>>(l.device, smem)) * l.sm_count;
  const int grid = int(groups < resident ? groups : resident);
  launch_kernel(matvec_q_kernel<K, kFromX>, grid, kThreads, smem, l.stream, a);
  check_launch("matvec_q launch");
}

// kFromX (one matrix and one fp32 activation l.x of l.x_stride columns, at most
// kMaxFusedActCols): the CTAs quantize x themselves.
template <class K, bool kFromX = false>
void launch(const MatvecQLaunch& l) {
  Args a{};
  a.w = static_cast<const uint8_t*>(l.w);
  a.row_stride = l.row_stride;
  a.rows = l.rows;
  a.nb = int(l.blocks);
  a.nsteps = int((l.blocks + K::kStep - 1) / K::kStep);
  a.act = static_cast<const uint8_t*>(l.act);
  a.act_stride = l.act_stride;
  a.tokens = l.tokens;
  a.y = l.y;
  const size_t last = size_t(l.blocks % K::kStep);
  a.w_unit = weight_copy_unit<K>(l.w, l.row_stride, last);
  a.a_unit = copy_unit(l.act, l.act_stride, size_t(K::kStep) * K::kActBlockBytes,
                       last * K::kActBlockBytes);
  a.iq2xs_grid = l.tables.iq2xs_grid;

  if constexpr (kFromX) {
    static_assert(K::T == 1 && kActElems<K> != 0, "one activation the CTA can quantize");
    a.x = l.x;
    a.act_blocks = int(l.x_stride / kActElems<K>);
    return launch_one_matrix<K, true>(l, a, smem_bytes<K>(stage_layout<K>(l.blocks), true));
  }
  const size_t smem = smem_bytes<K>(stage_layout<K>(l.blocks), false);
  if (l.n_matrices <= 1) return launch_one_matrix<K, false>(l, a, smem);
  // Each matrix gets a CTA per row group while they all fit at once, else its share of them.
  const int64_t resident =
      int64_t(resident_ctas<K, matvec_q_matrices_kernel<K>>(l.device, smem)) * l.sm_count;
  int64_t groups[kMaxMatvecQMatrices], total = 0;
  for (int i = 0; i < l.n_matrices; ++i)
    total += groups[i] = (l.matrices[i].rows + kCtaRows<K> - 1) / kCtaRows<K>;
  Matrices m{};
  m.n = l.n_matrices;
  int grid = 0;
  for (int i = 0; i < l.n_matrices; ++i) {
    const MatvecQMatrix& src = l.matrices[i];
    const int64_t share = total <= resident ? groups[i] : groups[i] * resident / total;
    m.at[i] = {static_cast<const uint8_t*>(src.w), src.row_stride, src.rows, src.y, grid,
               int(share < 1 ? 1 : share)};
    grid += m.at[i].ctas;
    a.w_unit = std::min(a.w_unit, weight_copy_unit<K>(src.w, src.row_stride, last));
  }
  launch_kernel(matvec_q_matrices_kernel<K>, grid, kThreads, smem, l.stream, a, m);
  check_launch("matvec_q launch");
}

// moe_q_kernel<K> over the pairs, or with l.groups moe_q_grouped_kernel<G> (G::T = the chunk's
// pairs) over the chunks (at most l.max_chunks of them; the device knows how many).
template <class K, class G>
void launch_moe(const MoeQLaunch& l) {
  static_assert(K::T == 1 && G::T == kMoeChunkPairs, "one pair a CTA, or one chunk");
  if (l.n_pairs == 0 || l.n_matrices == 0) return;
  const bool grouped = l.groups.items != nullptr;
  const int64_t cta_rows = grouped ? kCtaRows<G> : kCtaRows<K>;
  const int64_t groups = (l.max_rows + cta_rows - 1) / cta_rows;
  const bool fused = !grouped && kActElems<K> != 0 && l.x;
  const size_t smem = grouped ? smem_bytes<G>(stage_layout<G>(moe_stage_blocks(l)), false)
                              : smem_bytes<K>(stage_layout<K>(moe_stage_blocks(l)), fused);
  const int64_t resident =
      int64_t(grouped ? resident_ctas<G, moe_q_grouped_kernel<G>>(l.device, smem)
                      : resident_ctas<K, moe_q_kernel<K>>(l.device, smem)) *
      l.sm_count;
  constexpr int64_t kMaxGridY = 65535;
  const int64_t rows_y = grouped ? l.max_chunks : l.n_pairs;
  for (int64_t first = 0; first < rows_y; first += kMaxGridY) {
    MoeQLaunch part = l;
    part.first = first;
    const int64_t ys = rows_y - first < kMaxGridY ? rows_y - first : kMaxGridY;
    // As few CTAs as take the fewest rounds of row groups each.
    const int64_t per_matrix = std::max<int64_t>(1, resident / (ys * l.n_matrices));
    const int64_t rounds = (groups + per_matrix - 1) / per_matrix;
    const int64_t gx = (groups + rounds - 1) / rounds;
    const dim3 grid(unsigned(gx), unsigned(ys), unsigned(l.n_matrices));
    if (grouped)
      launch_kernel(moe_q_grouped_kernel<G>, grid, kThreads, smem, l.stream, part);
    else
      launch_kernel(moe_q_kernel<K>, grid, kThreads, smem, l.stream, part);
    check_launch("moe_q launch");
  }
}

}  // namespace strata::cuda::detail::mvq
