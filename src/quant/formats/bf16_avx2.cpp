#include "quant/formats/float_avx2.h"

namespace strata::quant {

float dot_bf16_avx2(const void* w, const void* a, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(w);
  return avx2::dot_lanes32(
      [h](int64_t i) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(h + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      },
      [h](int64_t i) { return bf16_to_fp32(h[i]); }, static_cast<const float*>(a), n);
}

}  // namespace strata::quant
