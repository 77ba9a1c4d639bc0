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

// Four sign bytes at p (groups of 8 elements) to 32 byte masks, 0xFF where the element is negative.
inline __m256i sign_masks(const uint8_t* p) {
  int32_t four;
  std::memcpy(&four, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(four), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bits = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
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

// Eight 32-bit table entries as one vector, the same way.
inline __m256i gather8(const uint32_t* table, const uint8_t* idx) {
  const auto b = [&](int k) { return _mm256_set1_epi32(int32_t(table[idx[k]])); };
  const __m256i q0 = _mm256_blend_epi32(b(0), b(1), 0x02),
                q1 = _mm256_blend_epi32(b(2), b(3), 0x08);
  const __m256i q2 = _mm256_blend_epi32(b(4), b(5), 0x20),
                q3 = _mm256_blend_epi32(b(6), b(7), 0x80);
  return _mm256_blend_epi32(_mm256_blend_epi32(q0, q1, 0x0C), _mm256_blend_epi32(q2, q3, 0xC0),
                            0xF0);
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
