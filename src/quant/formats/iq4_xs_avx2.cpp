// IQ4_XS . Q8_K with AVX2, bit-exact with the scalar reference (see iq_common.h).
#include "quant/formats/iq_avx2.h"
#include "quant/formats/iq_common.h"

namespace strata::quant::iq {

float dot_iq4_xs_avx2(const void* weights, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ4XS*>(weights);
  const auto* y = static_cast<const BlockQ8K*>(act);
  const __m256i values =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
  const __m256i low4 = _mm256_set1_epi8(15);
  __m128 acc = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kQK; ++i) {
    const BlockIQ4XS& b = x[i];
    // The eight 6-bit scales minus 32, each as int16 twice in an int32 for vpbroadcastd.
    uint32_t scales_l;
    std::memcpy(&scales_l, b.scales_l, 4);
    const __m256i lo =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int32_t(scales_l)),
                                           _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                         _mm256_set1_epi32(15));
    const __m256i hi =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b.scales_h),
                                           _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                         _mm256_set1_epi32(3));
    alignas(32) int32_t scale[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(scale),
                       twice16(_mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)),
                                                _mm256_set1_epi32(32))));

    const int8_t* q8 = y[i].qs;
    __m256i sum = _mm256_setzero_si256();
    // Not unrolled, so that per-sub-block values are broadcast loads (see iq2_xs_avx2.cpp).
#pragma GCC unroll 1
    for (int ib = 0; ib < 8; ++ib) {
      // Elements 0..15 of the sub-block are the low nibbles of its 16 bytes, 16..31 the high.
      const __m256i bytes = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * ib)));
      const __m256i nibbles =
          _mm256_and_si256(_mm256_blend_epi32(bytes, _mm256_srli_epi16(bytes, 4), 0xF0), low4);
      const __m256i w = _mm256_shuffle_epi8(values, nibbles);
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * ib));
      // |w| <= 127 so w takes a's sign without overflow; |a| <= 128 enters unsigned.
      const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(w, a));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, broadcast32(scale + ib)));
    }
    acc = accumulate_block(acc, sum, b.d, y[i].d);
  }
  return _mm_cvtss_f32(acc);
}

}  // namespace strata::quant::iq
