#include "quant/formats/float_avx2.h"

namespace strata::quant {

float dot_f32_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  return avx2::dot_lanes32([x](int64_t i) { return _mm256_loadu_ps(x + i); },
                           [x](int64_t i) { return x[i]; }, static_cast<const float*>(a), n);
}

}  // namespace strata::quant
