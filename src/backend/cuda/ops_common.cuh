// Device helpers the op kernels share: the CPU backend's lane-order dot product (so norms,
// attention scores and block scores reduce in exactly the order ops_vec.h defines), the activation
// quantization rule of quant/act.cpp, and launch-size arithmetic.
//
// Every float operation that the CPU reference performs as a separate multiply and add is written
// with __fmul_rn / __fadd_rn here: nvcc contracts a plain `a * b + c` into an FMA, which would
// change bits the CPU does not change.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/ops.h"

namespace strata::cuda::detail {

constexpr unsigned kFullMask = 0xffffffffu;

// Grid size for `work` units of `per_block` each, capped at max_blocks (kernels stride).
inline int grid_for(int64_t work, int64_t per_block, int max_blocks) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return int(blocks < 1 ? 1 : blocks < max_blocks ? blocks : max_blocks);
}

// dot(a, b) over n elements computed by the 16 lanes of a half-warp exactly as ops_vec.h's dot:
// element i accumulates into lane i % 16 as an fma chain, lanes l and l + 8 are added, then
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). The xor butterfly 8, 4, 2, 1 inside the
// half-warp forms exactly these sums (addition commutes bitwise), so every lane of the half ends
// with the same value. All 32 lanes must call it (each half computes its own dot).
__device__ __forceinline__ float half_warp_dot(const float* __restrict__ a,
                                               const float* __restrict__ b, int64_t n) {
  const int l = threadIdx.x & 15;
  float acc = 0.0f;
  for (int64_t i = l; i < n; i += 16) acc = __fmaf_rn(a[i], b[i], acc);
  acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 8));
  acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 4));
  acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 2));
  return __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 1));
}

// Quantizes one activation block held by a warp (kPerLane values per lane, any assignment of
// elements to lanes) by quant/act.cpp's rule and replaces each value by what the block encodes:
// d * q (Q8_K) or fp16(d) * q (Q8_0). amax is taken on the bit patterns, so the warp's order does
// not matter; d = amax / 127; a block with d below FLT_MIN (zero, tiny, nan) becomes zeros; else
// q = round-to-nearest-even(clamp(x * (1 / d), -127, 127)).
template <int kPerLane>
__device__ __forceinline__ void quantize_block_warp(float (&v)[kPerLane], ActQuant mode) {
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) amax = max(amax, __float_as_uint(v[i]) & 0x7fffffffu);
  amax = __reduce_max_sync(kFullMask, amax);
  const float d = __fdiv_rn(__uint_as_float(amax), 127.0f);
  if (!(d >= FLT_MIN)) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) v[i] = 0.0f;
    return;
  }
  const float id = __fdiv_rn(1.0f, d);
  const float scale = mode == ActQuant::Q8_0 ? __half2float(__float2half_rn(d)) : d;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    float q = __fmul_rn(v[i], id);
    q = q > -127.0f ? q : -127.0f;
    q = q < 127.0f ? q : 127.0f;
    v[i] = __fmul_rn(scale, __fadd_rn(rintf(q), 0.0f));  // + 0: a -0 code is the integer 0
  }
}

// silu(g) * u as the CPU computes it: (g / (1 + e^-g)) * u.
__device__ __forceinline__ float swiglu_value(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

}  // namespace strata::cuda::detail
