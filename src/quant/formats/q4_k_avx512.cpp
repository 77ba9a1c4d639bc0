// Q4_K x Q8_K with AVX-512 (BW, VL, VNNI), bitwise the reference (dot_scale_min_k_ref): 64 codes at
// a time, two sub-blocks side by side in one 512-bit vector, one maddubs of the nibbles by the
// activation and one vpdpwssd by the two sub-block scales; the exact integer S and M per
// super-block then take the reference's two fmas into lane b % 8.
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

namespace {

// vpermw indices spreading int16 scale 2j over the low 256 bits and scale 2j + 1 over the high.
inline __m512i scale_pair_index(int j) {
  return _mm512_inserti64x4(_mm512_set1_epi16(int16_t(2 * j)), _mm256_set1_epi16(int16_t(2 * j + 1)), 1);
}

}  // namespace

float dot_q4_k_avx512(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int32_t mins;
    const __m512i sc = _mm512_castsi256_si512(avx2::scales_k4(x[b].scales, y[b].bsums, &mins));
    __m512i acc = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      // Byte l of the 32 holds code 64j + l in its low nibble and code 64j + 32 + l in its high.
      const __m256i q = _mm256_loadu_si256((const __m256i*)(x[b].qs + 32 * j));
      const __m512i codes = _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), m4);
      const __m512i p = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(y[b].qs + 64 * j));
      acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(scale_pair_index(j), sc));
    }
    float& lane = lanes[b % 8];
    lane = std::fma(_cvtsh_ss(x[b].d) * y[b].d, float(_mm512_reduce_add_epi32(acc)), lane);
    lane = std::fma(-(_cvtsh_ss(x[b].dmin) * y[b].d), float(mins), lane);
  }
  return reduce8(lanes);
}

}  // namespace strata::quant
