// Q6_K x Q8_K with AVX2: the 6-bit codes u = q + 32 go through maddubs unsigned, and the offset
// comes back exactly as -32 * sum_s sc_s * bsums_s; then the reference's fma into lane b % 8.
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

float dot_q6_k_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(x + b, sizeof(BlockQ6_K));
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)x[b].scales));
    const __m256i offset = _mm256_madd_epi16(sc, _mm256_loadu_si256((const __m256i*)y[b].bsums));
    __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, 5));
    for (int h = 0; h < 2; ++h) {
      const __m256i sch =
          h ? _mm256_permute2x128_si256(sc, sc, 0x11) : _mm256_permute2x128_si256(sc, sc, 0x00);
      const __m256i ql0 = _mm256_loadu_si256((const __m256i*)(x[b].ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256((const __m256i*)(x[b].ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256((const __m256i*)(x[b].qh + 32 * h));
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, m4),
                          _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4)),
          _mm256_or_si256(_mm256_and_si256(ql1, m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4)),
      };
      for (int k = 0; k < 4; ++k) {
        const __m256i act = _mm256_loadu_si256((const __m256i*)(y[b].qs + 128 * h + 32 * k));
        const __m256i p = _mm256_maddubs_epi16(u[k], act);
        acc = _mm256_add_epi32(
            acc, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sch, avx2::pick16(2 * k, 2 * k + 1))));
      }
    }
    lanes[b % 8] = std::fma(_cvtsh_ss(x[b].d) * y[b].d, float(avx2::hsum_epi32(acc)), lanes[b % 8]);
  }
  return reduce8(lanes);
}

}  // namespace strata::quant
