// Mat-vec y = W x with an fp32 activation: one warp per row. Lane l decodes groups l, l + 32,
// l + 64, ... of the row (so a warp reads a contiguous span of blocks per step) and accumulates
// them in that order with FMAs; the 32 partial sums are combined by a fixed xor butterfly. No
// atomics and a fixed assignment of work to lanes: the result is bitwise the same on every run
// and for every grid size.
#include <climits>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/decode.cuh"
#include "backend/cuda/launch.h"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;

// acc + v . x[0, 8), accumulated in element order.
__device__ __forceinline__ float dot8(const float v[8], const float4* x, float acc) {
  const float4 a = __ldg(x), b = __ldg(x + 1);
  acc = __fmaf_rn(v[0], a.x, acc);
  acc = __fmaf_rn(v[1], a.y, acc);
  acc = __fmaf_rn(v[2], a.z, acc);
  acc = __fmaf_rn(v[3], a.w, acc);
  acc = __fmaf_rn(v[4], b.x, acc);
  acc = __fmaf_rn(v[5], b.y, acc);
  acc = __fmaf_rn(v[6], b.z, acc);
  return __fmaf_rn(v[7], b.w, acc);
}

template <typename D>
__global__ void __launch_bounds__(kThreads)
    matvec_kernel(const uint8_t* __restrict__ w, size_t row_stride, int64_t rows, int groups,
                  const float* __restrict__ x, float* __restrict__ y, DecodeTables tables) {
  await_previous_kernel();
  constexpr int kGroups = D::kElems / 8;
  static_assert(32 % kGroups == 0, "a warp step must cover whole blocks");
  // Group g = lane + 32 k of the row is group lane % kGroups of block lane / kGroups + k * (32 /
  // kGroups): the position inside the block is fixed per lane, so everything the decoder derives
  // from it (offsets, shifts, scale indices) is loop-invariant and computed once.
  constexpr size_t kStepBytes = size_t(32 / kGroups) * D::kBytes;
  const int lane = threadIdx.x % 32, gi = lane % kGroups;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows; r += warps) {
    const uint8_t* p = w + size_t(r) * row_stride + (lane / kGroups) * D::kBytes;
    const float4* xp = reinterpret_cast<const float4*>(x) + 2 * lane;
    float acc = 0.0f;
    int g = lane;
    // kUnroll steps decoded before any is accumulated, so their loads are in flight together
    // (the compiler does not hoist loads across iterations of the plain loop by itself).
    for (; g + 32 * (kUnroll - 1) < groups; g += 32 * kUnroll) {
      float v[kUnroll][8];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) D::decode(p + u * kStepBytes, gi, tables, v[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) acc = dot8(v[u], xp + 64 * u, acc);
      p += kUnroll * kStepBytes;
      xp += 64 * kUnroll;
    }
    for (; g < groups; g += 32, p += kStepBytes, xp += 64) {
      float v[8];
      D::decode(p, gi, tables, v);
      acc = dot8(v, xp, acc);
    }
    // Each lane adds the same two values (in either order, which is the same sum), so all lanes
    // end with identical bits.
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, offset));
    if (lane == 0) y[r] = acc;
  }
}

}  // namespace

void launch_matvec(quant::Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols,
                   const float* x, float* y, const DecodeTables& tables, const LaunchLimits& limits,
                   cudaStream_t stream) {
  const bool known = visit_decoder(t, [&](auto decoder) {
    using D = decltype(decoder);
    const char* name = quant::type_name(t);
    if (cols <= 0 || cols % D::kElems != 0 || cols % 8 != 0 || cols / 8 > INT_MAX - 32 * kUnroll)
      fail("CUDA matvec ", name, ": ", cols, " columns is not a positive multiple of the block (",
           int(D::kElems), ") and of 8");
    if (rows < 0) fail("CUDA matvec ", name, ": negative row count ", rows);
    if (row_stride < size_t(cols / D::kElems) * D::kBytes)
      fail("CUDA matvec ", name, ": row stride ", row_stride, " is shorter than a row");
    if (!aligned(w, D::kAlign) || row_stride % D::kAlign != 0 || !aligned(x, 16))
      fail("CUDA matvec ", name, ": weights and row stride need ", int(D::kAlign),
           "-byte alignment, the activation 16");
    if (rows == 0) return;
    const int64_t blocks_needed = (rows + kWarps - 1) / kWarps;
    const int grid = int(blocks_needed < limits.max_blocks ? blocks_needed : limits.max_blocks);
    launch_kernel(matvec_kernel<D>, grid, kThreads, 0, stream, static_cast<const uint8_t*>(w),
                  row_stride, rows, int(cols / 8), x, y, tables);
    check_launch("matvec launch");
  });
  if (!known) fail("CUDA matvec: no decoder for tensor type ", quant::type_name(t));
}

}  // namespace strata::cuda::detail
