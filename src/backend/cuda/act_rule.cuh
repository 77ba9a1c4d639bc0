// quant/act_rule.h on the device: the scale step of ggml's x86 activation quantization, with the
// CPU's IEEE roundings (__fdiv_rn), for the warp-wide quantizers of act_q.cu and ops_common.cuh.
// A warp holds one activation block, lane l elements l * kPerLane .. l * kPerLane + kPerLane - 1.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

namespace strata::cuda::detail {

__device__ __forceinline__ uint32_t act_abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// act_rule.h's act_block_is_zero: amax zero, inf or nan, or 127 / amax overflowing.
__device__ __forceinline__ bool act_block_is_zero(uint32_t amax) {
  return amax == 0u || amax >= 0x7f800000u ||
         !(__fdiv_rn(127.0f, __uint_as_float(amax)) <= FLT_MAX);
}

// The warp's largest |x| as bits; every lane gets it.
template <int kPerLane>
__device__ __forceinline__ uint32_t act_warp_amax(const float (&v)[kPerLane]) {
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) amax = max(amax, act_abs_bits(v[i]));
  return __reduce_max_sync(0xffffffffu, amax);
}

// Q8_K's signed max: the block's first element whose |x| has the bits amax (there is one), given
// to every lane. Each lane offers its own first such element; the lowest index wins.
template <int kPerLane>
__device__ __forceinline__ float act_warp_first_max(const float (&v)[kPerLane], uint32_t amax) {
  const int lane = threadIdx.x & 31;
  int local = kPerLane;
  for (int i = kPerLane - 1; i >= 0; --i)
    if (act_abs_bits(v[i]) == amax) local = i;
  float mine = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (i == local) mine = v[i];
  // A lane without such an element offers an index past the block, never a lane's own range.
  const unsigned offer = local < kPerLane ? unsigned(lane * kPerLane + local) : 32u * kPerLane;
  const unsigned index = __reduce_min_sync(0xffffffffu, offer);
  return __shfl_sync(0xffffffffu, mine, int(index / kPerLane));
}

}  // namespace strata::cuda::detail
