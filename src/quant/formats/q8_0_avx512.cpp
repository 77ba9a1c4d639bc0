// Q8_0 x Q8_0 with AVX-512 VNNI, bitwise the reference (q8_0.cpp): eight blocks at a time, two per
// 512-bit vector through one vpdpbusd, their exact integer sums transposed into one 8-lane vector
// (block k in lane k), so one fma per 8 blocks reproduces the reference's lane b % 8.
#include <algorithm>
#include <cmath>

#include "quant/formats/avx2_util.h"
#include "quant/formats/avx512_util.h"

namespace strata::quant {

namespace {

// The dot of one weight row with N activations; the weight's |w| and sign mask are made once for
// all of them.
template <int N>
void dot_n(const BlockQ8_0* x, const BlockQ8_0* const* y, int64_t nb, float* out) {
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    prefetch_ahead(x + b, 8 * sizeof(BlockQ8_0));
    __m512i p[N][4];
    for (int pair = 0; pair < 4; ++pair) {
      const __m512i w = avx512::codes2(x + b + 2 * pair);
      const __m512i uw = _mm512_abs_epi8(w);
      const __mmask64 negative = _mm512_movepi8_mask(w);
      for (int j = 0; j < N; ++j) {
        const __m512i a = avx512::codes2(y[j] + b + 2 * pair);
        p[j][pair] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), uw,
                                         _mm512_mask_sub_epi8(a, negative, _mm512_setzero_si512(), a));
      }
    }
    const __m256 dw = avx2::scales8(x + b);
    for (int j = 0; j < N; ++j) {
      const __m256 d = _mm256_mul_ps(dw, avx2::scales8(y[j] + b));
      acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(avx512::block_sums8(p[j])), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[j]);
    for (int64_t t = b; t < nb; ++t) {
      const int32_t s = avx2::hsum_epi32(avx2::dot_i8(
          _mm256_loadu_si256((const __m256i*)x[t].qs), _mm256_loadu_si256((const __m256i*)y[j][t].qs)));
      const float d = _cvtsh_ss(x[t].d) * _cvtsh_ss(y[j][t].d);
      lanes[t % 8] = std::fma(d, float(s), lanes[t % 8]);
    }
    out[j] = reduce8(lanes);
  }
}

}  // namespace

float dot_q8_0_avx512(const void* w, const void* a, int64_t n) {
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float out;
  dot_n<1>(static_cast<const BlockQ8_0*>(w), &y, n / kQK, &out);
  return out;
}

void dot_rows_q8_0_avx512(const void* w, const void* const* acts, int count, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* const* y = reinterpret_cast<const BlockQ8_0* const*>(acts);
  for (int j = 0; j < count; j += 4) {
    switch (std::min(4, count - j)) {
      case 1: dot_n<1>(x, y + j, n / kQK, out + j); break;
      case 2: dot_n<2>(x, y + j, n / kQK, out + j); break;
      case 3: dot_n<3>(x, y + j, n / kQK, out + j); break;
      default: dot_n<4>(x, y + j, n / kQK, out + j); break;
    }
  }
}

}  // namespace strata::quant
