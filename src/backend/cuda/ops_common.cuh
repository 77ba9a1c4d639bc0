// Device helpers the op kernels share: the CPU backend's lane-order dot product (so norms,
// attention scores and block scores reduce in exactly the order ops_vec.h defines), the activation
// quantization rule of quant/act_rule.h, and launch-size arithmetic.
//
// Every float operation that the CPU reference performs as a separate multiply and add is written
// with __fmul_rn / __fadd_rn here: nvcc contracts a plain `a * b + c` into an FMA, which would
// change bits the CPU does not change.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <span>

#include "backend/cuda/act_rule.cuh"
#include "backend/cuda/ops.h"

namespace strata::cuda::detail {

constexpr unsigned kFullMask = 0xffffffffu;

// The sequences of one launch passed by value (a window of several sequences, or the whole window
// as one): grid row blockIdx.y takes at[blockIdx.y].
template <class Sequence>
struct SequenceTable {
  static constexpr int kMax = 32;
  Sequence at[kMax];
};

// Runs launch(table, n) over the items, each as to_sequence(item), in tables of up to kMax.
template <class Sequence, class Item, class ToSequence, class Launch>
void for_each_sequence_table(std::span<const Item> items, ToSequence to_sequence, Launch launch) {
  constexpr size_t kMax = SequenceTable<Sequence>::kMax;
  for (size_t at = 0; at < items.size(); at += kMax) {
    const size_t n = std::min(items.size() - at, kMax);
    SequenceTable<Sequence> table{};
    for (size_t i = 0; i < n; ++i) table.at[i] = to_sequence(items[at + i]);
    launch(table, unsigned(n));
  }
}

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
  // Eight elements' loads at a time ahead of their links of the chain (the order is unchanged).
  int64_t i = l;
  for (; i + 7 * 16 < n; i += 8 * 16) {
    float av[8], bv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) av[k] = a[i + 16 * k], bv[k] = b[i + 16 * k];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc = __fmaf_rn(av[k], bv[k], acc);
  }
  for (; i < n; i += 16) acc = __fmaf_rn(a[i], b[i], acc);
  acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 8));
  acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 4));
  acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 2));
  return __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 1));
}

// Quantizes one activation block held by a warp (lane l holds elements l * kPerLane ..
// l * kPerLane + kPerLane - 1) by quant/act_rule.h's rule and replaces each value by what the block
// encodes, as the CPU dequantizes it: float(q) * fp16(d) (Q8_0) or float(q) * d (Q8_K, whose d is
// negative when the block's first largest element is positive, so a zero code is -0 there too).
template <int kPerLane>
__device__ __forceinline__ void quantize_block_warp(float (&v)[kPerLane], ActQuant mode) {
  const uint32_t amax = act_warp_amax(v);
  const float first_max = mode == ActQuant::Q8_K ? act_warp_first_max(v, amax) : 0.0f;
  if (act_block_is_zero(amax)) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) v[i] = 0.0f;
    return;
  }
  float mul, scale;
  if (mode == ActQuant::Q8_0) {
    mul = __fdiv_rn(127.0f, __uint_as_float(amax));
    scale = __half2float(__float2half_rn(__fdiv_rn(__uint_as_float(amax), 127.0f)));
  } else {
    mul = __fdiv_rn(-127.0f, first_max);
    scale = __fdiv_rn(1.0f, mul);
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    v[i] = __fmul_rn(float(__float2int_rn(__fmul_rn(v[i], mul))), scale);
}

// 1 / (1 + e^-g), the CPU's sigmoid (up to expf's rounding).
__device__ __forceinline__ float sigmoid_value(float g) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
}

// silu(g) * u as the CPU computes it: (g / (1 + e^-g)) * u.
__device__ __forceinline__ float swiglu_value(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// The delta rule's log decay: ssm_a * softplus(a + dt_bias), softplus(z) = z > 20 ? z :
// log1p(exp(z)) (torch's threshold).
__device__ __forceinline__ float decay_value(float a, float dt_bias, float ssm_a) {
  const float z = __fadd_rn(a, dt_bias);
  const float softplus = z > 20.0f ? z : log1pf(expf(z));
  return __fmul_rn(ssm_a, softplus);
}

// silu(x) as the CPU computes it: x / (1 + e^-x).
__device__ __forceinline__ float silu_value(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

}  // namespace strata::cuda::detail
