// Q6_K x Q8_K with AVX-512 (BW, VL, VNNI), bitwise the reference: as q6_k_avx2.cpp, the 6-bit codes
// u = q + 32 go through maddubs unsigned and the offset comes back exactly as
// -32 * sum_s sc_s * bsums_s; here 64 codes (four 16-element scale groups) at a time, whose int16
// pair sums one vpdpwssd multiplies by their scales and accumulates. Then the reference's fma into
// lane b % 8.
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

namespace {

// vpermw indices: int16 lane i of the pair sums of 64 codes starting at code 64r belongs to
// scale 4r + i / 8.
struct ScaleIndex {
  alignas(64) uint16_t row[4][32];
  constexpr ScaleIndex() : row{} {
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 32; ++i) row[r][i] = uint16_t(4 * r + i / 8);
  }
};
constexpr ScaleIndex kScaleIndex{};

inline __m512i scale_index(int r) { return _mm512_load_si512(kScaleIndex.row[r]); }

// Two 256-bit halves as one vector.
inline __m512i join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

}  // namespace

float dot_q6_k_avx512(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(x + b, sizeof(BlockQ6_K));
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)x[b].scales));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    const __m256i offset = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i*)y[b].bsums));
    __m512i acc =
        _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, 5)));
    for (int h = 0; h < 2; ++h) {
      // Codes 128h + 0..63 take the low nibbles of ql[64h .. 64h + 63] and bit pairs 0 and 2 of
      // qh[32h ..]; codes 128h + 64..127 the high nibbles and bit pairs 4 and 6.
      const __m512i ql = _mm512_loadu_si512(x[b].ql + 64 * h);
      const __m256i qh = _mm256_loadu_si256((const __m256i*)(x[b].qh + 32 * h));
      const __m512i hi01 = _mm512_and_si512(join(qh, _mm256_srli_epi16(qh, 2)), m3);
      const __m512i hi23 = _mm512_and_si512(join(_mm256_srli_epi16(qh, 4), _mm256_srli_epi16(qh, 6)), m3);
      const __m512i u01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(hi01, 4));
      const __m512i u23 =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_slli_epi16(hi23, 4));
      const __m512i p01 = _mm512_maddubs_epi16(u01, _mm512_loadu_si512(y[b].qs + 128 * h));
      const __m512i p23 = _mm512_maddubs_epi16(u23, _mm512_loadu_si512(y[b].qs + 128 * h + 64));
      acc = _mm512_dpwssd_epi32(acc, p01, _mm512_permutexvar_epi16(scale_index(2 * h), sc));
      acc = _mm512_dpwssd_epi32(acc, p23, _mm512_permutexvar_epi16(scale_index(2 * h + 1), sc));
    }
    lanes[b % 8] =
        std::fma(_cvtsh_ss(x[b].d) * y[b].d, float(_mm512_reduce_add_epi32(acc)), lanes[b % 8]);
  }
  return reduce8(lanes);
}

}  // namespace strata::quant
