// Shared pieces of the i-quant formats (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ4_XS): ggml's block layouts,
// the codebooks, the sign rule, and the one way every i-quant dot product turns a block's exact
// integer sum into a float, which the scalar and AVX2 kernels both follow so they agree bit for
// bit.
//
// Dot products pair with Q8_K activations. Each kernel sums, per 256-element block, the products of
// integer weight codes, integer sub-block scales and the activation's int8 codes exactly in int32;
// the float work per block is then one fused multiply-add, in block order,
//     acc = fma(float(isum), d_w * d_a, acc),
// and the row result is acc times the format's power-of-two unit (exact). Integer sums are the
// same in any order, so a SIMD kernel that sums its lanes differently still matches bit for bit.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "util/half.h"
#include "util/rng.h"

namespace strata::quant::iq {

constexpr int kQK = 256;  // elements per block (ggml's QK_K)

// ggml block_iq2_xxs: per 32 elements, two uint32: four grid indices (bytes), then four 7-bit sign
// fields in bits 0..27 and a 4-bit scale s in bits 28..31; element = d*(2s+1)/8*grid*sign.
struct BlockIQ2XXS {
  uint16_t d;  // fp16
  uint16_t qs[kQK / 8];
};
static_assert(sizeof(BlockIQ2XXS) == 66);

// ggml block_iq2_xs: per 8 elements one uint16, 9-bit grid index | 7-bit sign field << 9; per 32
// elements one scale byte, low nibble for the first 16 elements, high nibble for the second.
struct BlockIQ2XS {
  uint16_t d;
  uint16_t qs[kQK / 8];
  uint8_t scales[kQK / 32];
};
static_assert(sizeof(BlockIQ2XS) == 74);

// ggml block_iq3_xxs: qs[0..63] are grid indices (4 elements each), then per 32 elements one uint32
// of four 7-bit sign fields and a 4-bit scale s; element = d*(2s+1)/4*grid*sign.
struct BlockIQ3XXS {
  uint16_t d;
  uint8_t qs[3 * kQK / 8];
};
static_assert(sizeof(BlockIQ3XXS) == 98);

// ggml block_iq4_xs: 6-bit scales (low 4 bits in scales_l nibbles, high 2 bits in scales_h),
// element = d*(ls-32)*kIQ4NLValues[nibble]; in each 32-element sub-block byte j holds element j in
// its low nibble and element j+16 in its high nibble.
struct BlockIQ4XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK / 64];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIQ4XS) == 136);

// The activation side, ggml block_q8_K (as quant/act.cpp writes it): x ~= d*qs, bsums unused here.
// The AVX2 kernels rely on qs being in [-127, 127], which quantize_act guarantees.
struct BlockQ8K {
  float d;
  int8_t qs[kQK];
  int16_t bsums[kQK / 16];
};
static_assert(sizeof(BlockQ8K) == 292);

extern const uint64_t kIQ2XXSGrid[256];
extern const uint64_t kIQ2XSGrid[512];
extern const uint32_t kIQ3XXSGrid[256];

inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// A 7-bit sign field stores the signs of elements 0..6 of a group of 8 (bit set = negative); the
// sign of element 7 is implied: the group always has an even number of negatives (ggml's
// ksigns_iq2xs is exactly this function tabulated). Every 7-bit value is therefore valid. Takes the
// field in the low 7 bits of `bits` and ignores the rest.
constexpr uint8_t sign_byte(uint32_t bits) {
  const uint32_t field = bits & 127u;
  return uint8_t(field | uint32_t(std::popcount(field) & 1) << 7);
}

inline uint8_t grid_byte(uint64_t entry, int j) { return uint8_t(entry >> (8 * j)); }

inline float apply_sign(float v, uint8_t signs, int j) { return (signs >> j) & 1 ? -v : v; }

// One block's contribution to a dot product (see the top of this file).
inline float accumulate_block(float acc, int32_t isum, uint16_t dw, float da) {
  return std::fma(float(isum), fp16_to_fp32(dw) * da, acc);
}

// A random positive fp16 block scale in [limit/2, limit): random_blocks keeps values within about
// +-2 by passing 2 / (largest |code * sub-block scale| of the format).
inline uint16_t random_d(Rng& rng, float limit) {
  return fp32_to_fp16(limit * rng.uniform(0.5f, 1.0f));
}

// Random bytes for everything but d: every bit pattern of an i-quant block's payload is valid.
inline void random_bytes(Rng& rng, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) p[i] = uint8_t(rng.next() >> 56);
}

float dot_iq2_xxs_avx2(const void* w, const void* act, int64_t n);
float dot_iq2_xxs_avx512(const void* w, const void* act, int64_t n);
float dot_iq2_xs_avx2(const void* w, const void* act, int64_t n);
void dot_rows_iq2_xs_avx2(const void* w, const void* const* acts, int count, int64_t n, float* out);
float dot_iq2_xs_avx512(const void* w, const void* act, int64_t n);
void dot_rows_iq2_xs_avx512(const void* w, const void* const* acts, int count, int64_t n,
                            float* out);
float dot_iq3_xxs_avx2(const void* w, const void* act, int64_t n);
float dot_iq4_xs_avx2(const void* w, const void* act, int64_t n);

}  // namespace strata::quant::iq
