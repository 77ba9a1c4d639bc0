// IQ3_XXS . Q8_K with AVX2, bit-exact with the scalar reference (see iq_common.h).
//
// Same structure as iq2_xxs_avx2.cpp (see the notes in iq2_xs_avx2.cpp on what was measured):
// fully unrolled sub-block loop, sign bytes in registers, grid indices loaded from the block, the
// eight 32-bit grid entries of a sub-block fetched with one vpgatherdd.
#include "quant/formats/iq_avx2.h"
#include "quant/formats/iq_common.h"

namespace strata::quant::iq {

float dot_iq3_xxs_avx2(const void* weights, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ3XXS*>(weights);
  const auto* y = static_cast<const BlockQ8K*>(act);
  __m128 acc = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kQK; ++i) {
    const BlockIQ3XXS& b = x[i];
    // The eight signs|scale words follow the 64 grid indices, in sub-block order.
    const __m256i aux = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + kQK / 4));
    const __m256i fields = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(aux, _mm256_set1_epi32(0x7F)),
                        _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_set1_epi32(0x7F00))),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_set1_epi32(0x7F0000)),
            _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_set1_epi32(0x7F000000))));
    const SignHalves signs = sign_halves(full_sign_bytes(fields));
    alignas(32) int32_t scale_store[8];
    const __m256i s4 = _mm256_srli_epi32(aux, 28);
    _mm256_store_si256(reinterpret_cast<__m256i*>(scale_store),
                       twice16(_mm256_add_epi32(_mm256_add_epi32(s4, s4), _mm256_set1_epi32(1))));
    const int32_t* scale = opaque(scale_store);

    const int8_t* q8 = y[i].qs;
    __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* ix = b.qs + 8 * ib;
      // One hardware gather of the eight 32-bit grid entries. Here it beats broadcasts and blends
      // (eight broadcast loads and seven blends on the vector ports) by about 20%; for the 64-bit grids
      // of IQ2_XXS/IQ2_XS, four entries per vpgatherqq, it measured slower than gather4.
      const __m256i grid = _mm256_i32gather_epi32(
          reinterpret_cast<const int*>(kIQ3XXSGrid),
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ix))), 4);
      const __m256i p =
          signed_products(grid, sign_masks(signs, ib),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * ib)));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, broadcast32(scale + ib)));
    }
    acc = accumulate_block(acc, sum, b.d, y[i].d);
  }
  return _mm_cvtss_f32(acc) * 0.25f;
}

}  // namespace strata::quant::iq
