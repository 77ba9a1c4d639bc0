// The per-block activation quantizers of act_q.cu, for its kernels and for the integer mat-vecs
// that quantize their activation themselves (matvec_q.cuh): ggml's block_q8_0 / block_q8_K, byte
// for byte what quant::quantize_act_ref writes. out may be global or shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/act_rule.cuh"

namespace strata::cuda::detail {

// util/half.h's fp32_to_fp16, bit for bit (round to nearest even, quiet NaN payloads kept).
__device__ __forceinline__ uint32_t fp32_to_fp16_bits(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u, abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;
  if (abs < 0x38800000u) {
    const float scaled = __fmul_rn(__uint_as_float(abs), 0x1p24f);
    uint32_t q = __float2uint_rz(scaled);
    const float rem = __fsub_rn(scaled, __uint2float_rn(q));
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return sign | q;
  }
  return sign | ((abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u) >> 13);
}

// Codes of n elements: round-to-even(x * mul), or zeros for a zero block.
template <int n>
__device__ __forceinline__ void act_codes(const float* e, bool zero, float mul, int* q) {
#pragma unroll
  for (int k = 0; k < n; ++k) q[k] = zero ? 0 : __float2int_rn(__fmul_rn(e[k], mul));
}

__device__ __forceinline__ uint32_t act_pack4(const int* q) {
  return (uint32_t(q[0]) & 0xffu) | (uint32_t(q[1]) & 0xffu) << 8 | (uint32_t(q[2]) & 0xffu) << 16 |
         (uint32_t(q[3]) & 0xffu) << 24;
}

// block_q8_K (f32 d, 256 codes, 16 int16 sums of 16 codes) by the 32 lanes of a warp, lane l
// holding elements 8l .. 8l + 7 in u, v; out 4-byte aligned.
__device__ __forceinline__ void quantize_q8_k_values(float4 u, float4 v, uint8_t* o, int lane) {
  const float e[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
  const uint32_t amax = act_warp_amax(e);
  const float first_max = act_warp_first_max(e, amax);
  const bool zero = act_block_is_zero(amax);
  const float mul = zero ? 0.0f : __fdiv_rn(-127.0f, first_max);
  const float d = zero ? 0.0f : __fdiv_rn(1.0f, mul);
  int q[8];
  act_codes<8>(e, zero, mul, q);
  if (lane == 0) *reinterpret_cast<float*>(o) = d;
  *reinterpret_cast<uint32_t*>(o + 4 + 8 * lane) = act_pack4(q);
  *reinterpret_cast<uint32_t*>(o + 8 + 8 * lane) = act_pack4(q + 4);
  int sum = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) sum += q[k];
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // lanes 2g, 2g + 1 hold the 16 codes of sum g
  if (lane % 2 == 0) *reinterpret_cast<int16_t*>(o + 260 + lane) = int16_t(sum);
}

// The same from x[0, 256) (16-byte aligned).
__device__ __forceinline__ void quantize_q8_k_block(const float* x, uint8_t* o, int lane) {
  const float4* src = reinterpret_cast<const float4*>(x) + 2 * lane;
  quantize_q8_k_values(src[0], src[1], o, lane);
}

// block_q8_0 (fp16 d, 32 codes) by an aligned group of 8 lanes, lane sub = lane % 8 holding
// elements 4 sub .. 4 sub + 3 in u; out 2-byte aligned. Every lane of the warp calls it (the
// shuffles span the group); an inactive lane's block is not written.
__device__ __forceinline__ void quantize_q8_0_values(float4 u, uint8_t* o, bool active, int sub) {
  const float e[4] = {u.x, u.y, u.z, u.w};
  uint32_t amax = max(max(act_abs_bits(e[0]), act_abs_bits(e[1])),
                      max(act_abs_bits(e[2]), act_abs_bits(e[3])));
#pragma unroll
  for (int off = 4; off > 0; off >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const bool zero = act_block_is_zero(amax);
  const float d = zero ? 0.0f : __fdiv_rn(__uint_as_float(amax), 127.0f);
  int q[4];
  act_codes<4>(e, zero, zero ? 0.0f : __fdiv_rn(127.0f, __uint_as_float(amax)), q);
  if (!active) return;
  if (sub == 0) *reinterpret_cast<uint16_t*>(o) = uint16_t(fp32_to_fp16_bits(d));
  const uint32_t packed = act_pack4(q);
  *reinterpret_cast<uint16_t*>(o + 2 + 4 * sub) = uint16_t(packed);
  *reinterpret_cast<uint16_t*>(o + 4 + 4 * sub) = uint16_t(packed >> 16);
}

// The same from x[0, 32) (16-byte aligned; an inactive lane's block is read too).
__device__ __forceinline__ void quantize_q8_0_block(const float* x, uint8_t* o, bool active,
                                                    int sub) {
  quantize_q8_0_values(reinterpret_cast<const float4*>(x)[sub], o, active, sub);
}

}  // namespace strata::cuda::detail
