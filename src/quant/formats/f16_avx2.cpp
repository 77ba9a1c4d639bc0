#include "quant/formats/float_avx2.h"

namespace strata::quant {

float dot_f16_avx2(const void* w, const void* a, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(w);
  return avx2::dot_lanes32(
      [h](int64_t i) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + i))); },
      [h](int64_t i) { return _cvtsh_ss(h[i]); }, static_cast<const float*>(a), n);
}

}  // namespace strata::quant
