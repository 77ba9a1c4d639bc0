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

// acc + v . x[0, 8), accumulated in element order (matvec.cu's dot8).
__device__ __forceinline__ float dot8_rows(const float v[8], const float4* x, float acc) {
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
  for (int g = lane; g < groups; g += 32, p += kStepBytes) {
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
