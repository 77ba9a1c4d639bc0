// Q2_K x Q8_K with AVX2: 2-bit codes through maddubs, madd by the 4-bit group scales, the mins
// term from bsums; then the reference's two fmas into lane b % 8.
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

float dot_q2_k_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m128i m4 = _mm_set1_epi8(0x0F);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const __m128i packed = _mm_loadu_si128((const __m128i*)x[b].scales);
    const __m256i sc = _mm256_cvtepu8_epi16(_mm_and_si128(packed, m4));
    const __m256i mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
    const int32_t mins =
        avx2::hsum_epi32(_mm256_madd_epi16(mn, _mm256_loadu_si256((const __m256i*)y[b].bsums)));
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i sch =
          h ? _mm256_permute2x128_si256(sc, sc, 0x11) : _mm256_permute2x128_si256(sc, sc, 0x00);
      const __m256i q = _mm256_loadu_si256((const __m256i*)(x[b].qs + 32 * h));
      for (int j = 0; j < 4; ++j) {
        const __m256i act = _mm256_loadu_si256((const __m256i*)(y[b].qs + 128 * h + 32 * j));
        const __m256i p =
            _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3), act);
        acc = _mm256_add_epi32(
            acc, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sch, avx2::pick16(2 * j, 2 * j + 1))));
      }
    }
    float& lane = lanes[b % 8];
    lane = std::fma(_cvtsh_ss(x[b].d) * y[b].d, float(avx2::hsum_epi32(acc)), lane);
    lane = std::fma(-(_cvtsh_ss(x[b].dmin) * y[b].d), float(mins), lane);
  }
  return reduce8(lanes);
}

}  // namespace strata::quant
