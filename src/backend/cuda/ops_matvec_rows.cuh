// One weight row dotted with several fp32 activations by one warp, shared by matmul and the MoE
// kernels. For each activation the lanes, the groups each lane takes (g = lane, lane + 32, ...),
// their fma order and the final xor butterfly are exactly matvec.cu's, so every result is bitwise
// Device::matvec of that activation; the row's blocks are decoded once per pass of up to
// kActsPerPass activations instead of once per activation.
#pragma once

#include "backend/cuda/decode.cuh"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

constexpr int kActsPerPass = 8;

// acc + v . (a, b), accumulated in element order (matvec.cu's dot8).
__device__ __forceinline__ float dot8_values(const float v[8], float4 a, float4 b, float acc) {
  acc = __fmaf_rn(v[0], a.x, acc);
  acc = __fmaf_rn(v[1], a.y, acc);
  acc = __fmaf_rn(v[2], a.z, acc);
  acc = __fmaf_rn(v[3], a.w, acc);
  acc = __fmaf_rn(v[4], b.x, acc);
  acc = __fmaf_rn(v[5], b.y, acc);
  acc = __fmaf_rn(v[6], b.z, acc);
  return __fmaf_rn(v[7], b.w, acc);
}

__device__ __forceinline__ float dot8_rows(const float v[8], const float4* x, float acc) {
  return dot8_values(v, __ldg(x), __ldg(x + 1), acc);
}

// The lane's groups g, g + 32, ... of one activation while kDepth of them remain, in the order
// of warp_row_dots' loop below, with the loads of kDepth groups issued before the chain consumes
// them. Without that, each group waited for its own loads: a 2048-wide fp32 row (8 groups a lane)
// took 7.3 us on the H200 and 6.2 with four in flight (eight measured no better).
template <typename D, int kDepth>
__device__ __forceinline__ float lane_dot_batches(const uint8_t*& p, int& g, int lane, int groups,
                                                  const float4* x, const DecodeTables& tables,
                                                  float acc) {
  constexpr int kGroups = D::kElems / 8;
  constexpr size_t kStepBytes = size_t(32 / kGroups) * D::kBytes;
  for (; g + 32 * (kDepth - 1) < groups; g += 32 * kDepth, p += kDepth * kStepBytes) {
    float v[kDepth][8];
    float4 a[kDepth], b[kDepth];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      D::decode(p + d * kStepBytes, lane % kGroups, tables, v[d]);
      const float4* xd = x + 2 * (g + 32 * d - lane);
      a[d] = __ldg(xd), b[d] = __ldg(xd + 1);
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) acc = dot8_values(v[d], a[d], b[d], acc);
  }
  return acc;
}

template <typename D>
__device__ __forceinline__ float lane_dot_one(const uint8_t* p, int lane, int groups,
                                              const float4* x, const DecodeTables& tables) {
  int g = lane;
  const float acc = lane_dot_batches<D, 4>(p, g, lane, groups, x, tables, 0.0f);
  return lane_dot_batches<D, 1>(p, g, lane, groups, x, tables, acc);
}

// For items i in [0, n) (n <= kActsPerPass): store(i, W_row . act_of(i)), called on lane 0.
// act_of(i) is a 16-byte aligned row of 8 * groups floats. All 32 lanes must call it.
template <typename D, typename ActOf, typename Store>
__device__ __forceinline__ void warp_row_dots(const uint8_t* __restrict__ w_row, int groups, int n,
                                              const DecodeTables& tables, ActOf act_of,
                                              Store store) {
  constexpr int kGroups = D::kElems / 8;
  constexpr size_t kStepBytes = size_t(32 / kGroups) * D::kBytes;
  const int lane = threadIdx.x & 31, gi = lane % kGroups;
  const float4* xp[kActsPerPass];
#pragma unroll
  for (int j = 0; j < kActsPerPass; ++j)
    xp[j] = reinterpret_cast<const float4*>(act_of(j < n ? j : 0)) + 2 * lane;
  float acc[kActsPerPass];
#pragma unroll
  for (int j = 0; j < kActsPerPass; ++j) acc[j] = 0.0f;
  const uint8_t* p = w_row + (lane / kGroups) * D::kBytes;
  if (n == 1) acc[0] = lane_dot_one<D>(p, lane, groups, xp[0], tables);
  for (int g = lane; n > 1 && g < groups; g += 32, p += kStepBytes) {
    float v[8];
    D::decode(p, gi, tables, v);
    const int step = 2 * (g - lane);
#pragma unroll
    for (int j = 0; j < kActsPerPass; ++j)
      if (j < n) acc[j] = dot8_rows(v, xp[j] + step, acc[j]);
  }
#pragma unroll
  for (int j = 0; j < kActsPerPass; ++j) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      acc[j] = __fadd_rn(acc[j], __shfl_xor_sync(kFullMask, acc[j], offset));
    if (lane == 0 && j < n) store(j, acc[j]);
  }
}

}  // namespace strata::cuda::detail
