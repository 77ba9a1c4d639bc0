// Q3_K x Q8_K with AVX2: q = low - 4 * (high bit clear) as two unsigned maddubs (exact in int16),
// madd by the group scales, then the reference's fma into lane b % 8.
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

namespace {

// The 16 signed scales (q3_k_scales) as int16, decoded with 32-bit masks.
__m256i scales(const uint8_t* s) {
  uint32_t u[3];
  std::memcpy(u, s, sizeof(u));
  const uint32_t lo = 0x0f0f0f0f, hi = 0x03030303;
  const __m128i v = _mm_setr_epi32(int((u[0] & lo) | ((u[2] & hi) << 4)),
                                   int((u[1] & lo) | (((u[2] >> 2) & hi) << 4)),
                                   int(((u[0] >> 4) & lo) | (((u[2] >> 4) & hi) << 4)),
                                   int(((u[1] >> 4) & lo) | (((u[2] >> 6) & hi) << 4)));
  return _mm256_cvtepi8_epi16(_mm_sub_epi8(v, _mm_set1_epi8(32)));
}

}  // namespace

float dot_q3_k_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const __m256i sc = scales(x[b].scales);
    const __m256i hm = _mm256_loadu_si256((const __m256i*)x[b].hmask);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i sch =
          h ? _mm256_permute2x128_si256(sc, sc, 0x11) : _mm256_permute2x128_si256(sc, sc, 0x00);
      const __m256i q = _mm256_loadu_si256((const __m256i*)(x[b].qs + 32 * h));
      for (int j = 0; j < 4; ++j) {
        const __m256i act = _mm256_loadu_si256((const __m256i*)(y[b].qs + 128 * h + 32 * j));
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        const __m256i four =
            _mm256_slli_epi16(_mm256_andnot_si256(_mm256_srli_epi16(hm, 4 * h + j), one), 2);
        const __m256i p =
            _mm256_sub_epi16(_mm256_maddubs_epi16(low, act), _mm256_maddubs_epi16(four, act));
        acc = _mm256_add_epi32(
            acc, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sch, avx2::pick16(2 * j, 2 * j + 1))));
      }
    }
    lanes[b % 8] = std::fma(_cvtsh_ss(x[b].d) * y[b].d, float(avx2::hsum_epi32(acc)), lanes[b % 8]);
  }
  return reduce8(lanes);
}

}  // namespace strata::quant
