// Q4_0 x Q8_0 with AVX2: as Q8_0 (eight blocks' exact sums transposed into one vector), the
// nibbles widened to signed bytes q - 8 first.
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

namespace {

// Elements 0..15 (low nibbles) then 16..31 (high nibbles), minus 8.
__m256i codes(const BlockQ4_0& x) {
  const __m128i q = _mm_loadu_si128((const __m128i*)x.qs);
  const __m256i both = _mm256_setr_m128i(q, _mm_srli_epi16(q, 4));
  return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

}  // namespace

float dot_q4_0_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = n / kQK;
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i p[8];
    for (int k = 0; k < 8; ++k)
      p[k] = avx2::dot_i8(codes(x[b + k]), _mm256_loadu_si256((const __m256i*)y[b + k].qs));
    const __m256 d = _mm256_mul_ps(avx2::scales8(x + b), avx2::scales8(y + b));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(avx2::block_sums8(p)), acc);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (; b < nb; ++b) {
    const int32_t s =
        avx2::hsum_epi32(avx2::dot_i8(codes(x[b]), _mm256_loadu_si256((const __m256i*)y[b].qs)));
    const float d = _cvtsh_ss(x[b].d) * _cvtsh_ss(y[b].d);
    lanes[b % 8] = std::fma(d, float(s), lanes[b % 8]);
  }
  return reduce8(lanes);
}

}  // namespace strata::quant
