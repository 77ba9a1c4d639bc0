// AVX2 building blocks shared by the i-quant dot kernels. Include only from *_avx2.cpp files:
// everything here is compiled for AVX2, and internal linkage keeps these copies out of the scalar
// files.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace strata::quant::iq {
namespace {

// Full sign bytes for 32 seven-bit sign fields (one per byte of s): bit 7 is set when the field has
// an odd number of bits, so that each group of 8 elements has an even number of negatives.
inline __m256i full_sign_bytes(__m256i s) {
  const __m256i parity_hi = _mm256_setr_epi8(                                  //
      0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,  //
      0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i lo = _mm256_and_si256(s, low4);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(s, 4), low4);
  const __m256i parity =
      _mm256_xor_si256(_mm256_shuffle_epi8(parity_hi, lo), _mm256_shuffle_epi8(parity_hi, hi));
  return _mm256_or_si256(s, parity);
}

// Full sign bytes (one per group of 8 elements) to 32 byte masks, 0xFF where the element is
// negative. v holds the wanted half of the block's 32 sign bytes (sub-blocks 0..3 or 4..7) in both
// 128-bit lanes (see sign_halves); k picks the sub-block within that half. An in-lane vpshufb with
// a constant control spreads each sign byte over its 8 elements, and an and/compare with the bit
// pattern 1, 2, 4, .., 128 turns bit j into a mask for element j. Keeping the sign bytes in
// registers, rather than storing them per block and broadcasting 4 of them back per sub-block,
// takes a store-to-load round trip off every block.
struct SpreadControl {
  alignas(32) uint8_t row[4][32];
  constexpr SpreadControl() : row{} {
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 32; ++j) row[k][j] = uint8_t(4 * k + j / 8);
  }
};
inline constexpr SpreadControl kSpreadControl{};

inline __m256i sign_masks(__m256i v, int k) {
  const __m256i spread = _mm256_shuffle_epi8(
      v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kSpreadControl.row[k])));
  const __m256i bits = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
}

// Sub-blocks 0..3 (lo) and 4..7 (hi) of 32 full sign bytes, each copied to both 128-bit lanes.
struct SignHalves {
  __m256i lo, hi;
};
inline SignHalves sign_halves(__m256i full) {
  return {_mm256_permute4x64_epi64(full, 0x44), _mm256_permute4x64_epi64(full, 0xEE)};
}
inline __m256i sign_masks(const SignHalves& s, int ib) {
  return sign_masks(ib < 4 ? s.lo : s.hi, ib & 3);
}

// Pairwise int16 sums of grid * sign * q8 for 32 elements (grid < 128 unsigned, so pairs stay below
// 2 * 127 * 127 < 2^15). The sign goes onto q8, which is exact because Q8_K codes are in [-127,
// 127] (quantize_act never writes -128, as in ggml); -128 would negate to itself.
inline __m256i signed_products(__m256i grid, __m256i negative, __m256i q8) {
  return _mm256_maddubs_epi16(grid,
                              _mm256_sign_epi8(q8, _mm256_or_si256(negative, _mm256_set1_epi8(1))));
}

// int16 x2 packed into one int32 (v in both halves), so vpbroadcastd can spread it from memory.
inline __m256i twice16(__m256i v) {
  return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

inline __m256i broadcast32(const int32_t* p) { return _mm256_set1_epi32(*p); }

// Hides from the optimizer where a pointer into a per-block stack array points. The sub-block
// loops are fully unrolled (no counter, constant offsets); without this, GCC forwards the vector
// stores that filled the array into registers and extracts each index or sign word with port-5
// shuffles (vpextrw, vpermq), the bottleneck. With it, every per-sub-block value is a plain load.
template <typename T>
inline T* opaque(T* p) {
  asm("" : "+r"(p));
  return p;
}

// Four 64-bit table entries as one vector, built from broadcast loads and blends so that no
// shuffle-port instruction is needed (vpinsrq and vinserti128 would all queue on port 5).
inline __m256i gather4(const uint64_t* table, uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
  const __m256i lo = _mm256_blend_epi32(_mm256_set1_epi64x(int64_t(table[i0])),
                                        _mm256_set1_epi64x(int64_t(table[i1])), 0x0C);
  const __m256i hi = _mm256_blend_epi32(_mm256_set1_epi64x(int64_t(table[i2])),
                                        _mm256_set1_epi64x(int64_t(table[i3])), 0xC0);
  return _mm256_blend_epi32(lo, hi, 0xF0);
}

// IQ2_XS's sub-block scales 2s+1 as int16: the low 128-bit half holds the eight first-half scales
// (low nibbles of the scale bytes), the high half the eight second-half ones. maddubs leaves
// elements 0..15 of a sub-block in the low half and 16..31 in the high half, so one in-lane
// shuffle per sub-block (iq2xs_scale_pick) puts each scale under its own products.
inline __m256i iq2xs_scales(const uint8_t* scale_bytes) {
  const __m128i sb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scale_bytes));
  const __m128i nib = _mm_and_si128(_mm_unpacklo_epi64(sb, _mm_srli_epi16(sb, 4)), _mm_set1_epi8(15));
  return _mm256_cvtepu8_epi16(_mm_add_epi8(_mm_add_epi8(nib, nib), _mm_set1_epi8(1)));
}

// Row ib selects int16 lane ib of each 128-bit half.
struct ScalePick {
  alignas(32) uint8_t row[8][32];
  constexpr ScalePick() : row{} {
    for (int ib = 0; ib < 8; ++ib)
      for (int k = 0; k < 32; ++k) row[ib][k] = uint8_t(2 * ib + (k & 1));
  }
};
inline constexpr ScalePick kScalePick{};

// Sub-block ib's two scales, each spread over the int16 products of its 16 elements.
inline __m256i iq2xs_scale_pick(__m256i scales, int ib) {
  return _mm256_shuffle_epi8(scales,
                             _mm256_load_si256(reinterpret_cast<const __m256i*>(kScalePick.row[ib])));
}

// The per-block float step of iq_common.h, bit for bit: acc = fma(float(sum of lanes), dw * da,
// acc).
inline __m128 accumulate_block(__m128 acc, __m256i isum, uint16_t dw, float da) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  const __m128 d = _mm_mul_ss(_mm_cvtph_ps(_mm_cvtsi32_si128(dw)), _mm_set_ss(da));
  return _mm_fmadd_ss(_mm_cvtepi32_ps(s), d, acc);
}

}  // namespace
}  // namespace strata::quant::iq
