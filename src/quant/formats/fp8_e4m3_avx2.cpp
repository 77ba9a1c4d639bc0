// FP8_E4M3 . F32 with AVX2 and F16C, bit-exact with the scalar reference: it follows the
// evaluation order defined in fp8_e4m3.cpp (one 8-wide vector per quarter of a block).
#include <immintrin.h>

#include "quant/fp8.h"

namespace strata::quant {

namespace {
// 16 codes (one per 16-bit lane) to the fp16 with the same bits in the same places: sign to bit 15,
// exponent and mantissa to bits 13..7. Its value is the E4M3 value / 2^8 (bias 15 vs 7), subnormals
// included, so cvtph_ps then * 256 decodes exactly. The NaN codes get an all-ones fp16 exponent so
// they stay NaN.
inline __m256i e4m3_as_fp16(__m256i codes) {
  const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(codes, 8), 1),
                                     _mm256_set1_epi16(int16_t(0xBFFF)));
  const __m256i nan =
      _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)), _mm256_set1_epi16(0x3F80));
  return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7E00)));
}

inline __m256 decode8(__m128i half_bits) {
  return _mm256_mul_ps(_mm256_cvtph_ps(half_bits), _mm256_set1_ps(256.0f));
}
}  // namespace

float dot_fp8_e4m3_avx2(const void* weights, const void* act, int64_t n) {
  const auto* b = static_cast<const BlockFP8*>(weights);
  const float* x = static_cast<const float*>(act);
  __m256 lane = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kFP8BlockElems; ++i, x += kFP8BlockElems) {
    const uint8_t* q = b[i].q;
    const __m256i h01 =
        e4m3_as_fp16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
    const __m256i h23 = e4m3_as_fp16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
    const __m256 lo =
        _mm256_fmadd_ps(decode8(_mm256_extracti128_si256(h01, 1)), _mm256_loadu_ps(x + 8),
                        _mm256_mul_ps(decode8(_mm256_castsi256_si128(h01)), _mm256_loadu_ps(x)));
    const __m256 hi = _mm256_fmadd_ps(
        decode8(_mm256_extracti128_si256(h23, 1)), _mm256_loadu_ps(x + 24),
        _mm256_mul_ps(decode8(_mm256_castsi256_si128(h23)), _mm256_loadu_ps(x + 16)));
    lane = _mm256_fmadd_ps(_mm256_set1_ps(b[i].scale), _mm256_add_ps(lo, hi), lane);
  }
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(lane), _mm256_extractf128_ps(lane, 1));
  const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

}  // namespace strata::quant
