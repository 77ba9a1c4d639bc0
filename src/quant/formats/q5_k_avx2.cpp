// Q5_K x Q8_K with AVX2: Q4_K's kernel with the fifth bit of each code or-ed in from qh.
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

float dot_q5_k_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t mins;
    const __m256i sc = avx2::scales_k4(x[b].scales, y[b].bsums, &mins);
    const __m256i qh = _mm256_loadu_si256((const __m256i*)x[b].qh);
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256((const __m256i*)(x[b].qs + 32 * j));
      // Bit 2j (low nibbles) and 2j + 1 (high) of qh, moved to bit 4 of each byte.
      const __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4);
      const __m256i hhi =
          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), hlo);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hhi);
      const __m256i plo =
          _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)(y[b].qs + 64 * j)));
      const __m256i phi =
          _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(y[b].qs + 64 * j + 32)));
      acc = _mm256_add_epi32(
          acc, _mm256_madd_epi16(plo, _mm256_shuffle_epi8(sc, avx2::pick16(2 * j, 2 * j))));
      acc = _mm256_add_epi32(
          acc, _mm256_madd_epi16(phi, _mm256_shuffle_epi8(sc, avx2::pick16(2 * j + 1, 2 * j + 1))));
    }
    float& lane = lanes[b % 8];
    lane = std::fma(_cvtsh_ss(x[b].d) * y[b].d, float(avx2::hsum_epi32(acc)), lane);
    lane = std::fma(-(_cvtsh_ss(x[b].dmin) * y[b].d), float(mins), lane);
  }
  return reduce8(lanes);
}

}  // namespace strata::quant
