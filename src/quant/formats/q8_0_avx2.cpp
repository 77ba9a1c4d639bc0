// Q8_0 x Q8_0 with AVX2: eight blocks at a time, their exact integer sums transposed into one
// vector (block k in lane k), so one fma per 8 blocks reproduces the reference's lane b % 8.
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

float dot_q8_0_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = n / kQK;
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i p[8];
    for (int k = 0; k < 8; ++k)
      p[k] = avx2::dot_i8(_mm256_loadu_si256((const __m256i*)x[b + k].qs),
                          _mm256_loadu_si256((const __m256i*)y[b + k].qs));
    const __m256 d = _mm256_mul_ps(avx2::scales8(x + b), avx2::scales8(y + b));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(avx2::block_sums8(p)), acc);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (; b < nb; ++b) {
    const int32_t s = avx2::hsum_epi32(avx2::dot_i8(_mm256_loadu_si256((const __m256i*)x[b].qs),
                                                    _mm256_loadu_si256((const __m256i*)y[b].qs)));
    const float d = _cvtsh_ss(x[b].d) * _cvtsh_ss(y[b].d);
    lanes[b % 8] = std::fma(d, float(s), lanes[b % 8]);
  }
  return reduce8(lanes);
}

}  // namespace strata::quant
