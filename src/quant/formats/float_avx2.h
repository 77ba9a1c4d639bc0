// The float-format dot shared by f32/f16/bf16_avx2.cpp: four 8-wide FMA accumulators hold lanes
// i % 32 of the reference (dot_lanes32), the tail continues those lanes in scalar fma, and the
// reduction is the reference's.
#pragma once

#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant::avx2 {

// load8(i): weights i..i+7 as fp32; load1(i): weight i.
template <typename Load8, typename Load1>
float dot_lanes32(Load8 load8, Load1 load1, const float* a, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(load8(i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
  if (i < n) {
    alignas(32) float lanes[32];
    for (int k = 0; k < 4; ++k) _mm256_store_ps(lanes + 8 * k, acc[k]);
    for (int64_t j = i; j < n; ++j) lanes[j - i] = std::fma(load1(j), a[j], lanes[j - i]);
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_load_ps(lanes + 8 * k);
  }
  return reduce8_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

}  // namespace strata::quant::avx2
