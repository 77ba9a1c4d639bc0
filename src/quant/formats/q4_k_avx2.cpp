// Q4_K x Q8_K with AVX2: exact integer S and M per super-block (maddubs of the nibbles, madd by
// the group scale), then the reference's two fmas into lane b % 8.
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

float dot_q4_k_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t mins;
    const __m256i sc = avx2::scales_k4(x[b].scales, y[b].bsums, &mins);
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256((const __m256i*)(x[b].qs + 32 * j));
      const __m256i lo = _mm256_and_si256(q, m4),
                    hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
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
