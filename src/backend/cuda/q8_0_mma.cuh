// One Q8_0 block of 16 weight rows x 8 activations on the tensor cores, shared by the tiles
// (matmul_q8_0_mma.cu) and the few-activation mat-vec (matvec_q_q8_0.cu).
//
// CPU reference (quant/formats/q8_0.cpp): per block b the exact s = sum q_w q_a, then
// lane[b % 8] = fma(d_w * d_a, float(s), lane[b % 8]); the eight lanes meet in reduce8. One
// mma.sync m16n8k32 (int8 in, int32 out) is one block of 32 codes for 16 rows x 8 activations,
// and its int32 results are those blocks' exact sums; only the float steps after it need the CPU's
// order. Thread (g, tig) of the warp holds the results of rows g, g + 8 x activations 2 tig,
// 2 tig + 1 (e = 0..3, row-major).
#pragma once

#include "backend/cuda/matvec_q.cuh"

namespace strata::cuda::detail::mvq::q8_0_mma {

constexpr int kBlockBytes = 34;

// Codes 4 tig .. 4 tig + 3 (lo) and 16 + 4 tig .. (hi) of block i of a staged chunk. An odd
// block's codes are word-aligned; an even block's start 2 bytes past a word.
__device__ __forceinline__ void block_codes(const uint8_t* chunk, int i, int tig, uint32_t& lo,
                                            uint32_t& hi) {
  const uint8_t* codes = chunk + kBlockBytes * i + 2;
  if (i & 1) {
    lo = ld_shared_u32(codes + 4 * tig);
    hi = ld_shared_u32(codes + 16 + 4 * tig);
  } else {
    const uint8_t* p = codes - 2 + 4 * tig;
    lo = __funnelshift_r(ld_shared_u32(p), ld_shared_u32(p + 4), 16);
    hi = __funnelshift_r(ld_shared_u32(p + 16), ld_shared_u32(p + 20), 16);
  }
}

__device__ __forceinline__ float block_scale(const uint8_t* chunk, int i) {
  return half_bits_to_float(*reinterpret_cast<const uint16_t*>(chunk + kBlockBytes * i));
}

// float(s), exactly, for |s| < 2^22 (a Q8_0 block sum is at most 32 * 128 * 127 in magnitude):
// the magic-number add instead of I2F, which runs at an eighth of the FMA rate on sm_90.
__device__ __forceinline__ float small_int_to_float(int s) {
  return __fsub_rn(__int_as_float(0x4B400000 + s), 12582912.0f);
}

// The CPU's reduce8: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
__device__ __forceinline__ float reduce8(const float (&l)[8]) {
  const float a0 = __fadd_rn(l[0], l[4]), a1 = __fadd_rn(l[1], l[5]);
  const float a2 = __fadd_rn(l[2], l[6]), a3 = __fadd_rn(l[3], l[7]);
  return __fadd_rn(__fadd_rn(a0, a2), __fadd_rn(a1, a3));
}

// Block i of the 16 staged rows row_g (rows g) and row_g8 (rows g + 8) against 8 staged
// activations: act_g is the B fragment's (activation g), act_c0 and act_c1 those of the thread's
// results (2 tig, 2 tig + 1). Each of the thread's four results extends its chain,
// chain[e] = fma(d_w * d_a, float(s_e), chain[e]).
__device__ __forceinline__ void block_step(const uint8_t* row_g, const uint8_t* row_g8,
                                           const uint8_t* act_g, const uint8_t* act_c0,
                                           const uint8_t* act_c1, int i, int tig,
                                           float (&chain)[4]) {
  uint32_t a0, a1, a2, a3, b0, b1;
  block_codes(row_g, i, tig, a0, a2);
  block_codes(row_g8, i, tig, a1, a3);
  block_codes(act_g, i, tig, b0, b1);
  const float dw[2] = {block_scale(row_g, i), block_scale(row_g8, i)};
  const float da[2] = {block_scale(act_c0, i), block_scale(act_c1, i)};
  int s[4];
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %10, %10, %10};"
      : "=r"(s[0]), "=r"(s[1]), "=r"(s[2]), "=r"(s[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#pragma unroll
  for (int e = 0; e < 4; ++e)
    chain[e] = __fmaf_rn(__fmul_rn(dw[e / 2], da[e % 2]), small_int_to_float(s[e]), chain[e]);
}

}  // namespace strata::cuda::detail::mvq::q8_0_mma
