// IQ2_XXS . Q8_K with AVX-512 (BW, VL, VNNI), bit-exact with the scalar reference (see
// iq_common.h): iq2_xxs_avx2.cpp's kernel with iq2_xs_avx512.cpp's two changes, the sub-block's 32
// signs as a mask register for a masked subtract, and vpdpwssd for the scale multiply and the add.
#include "quant/formats/iq_avx2.h"
#include "quant/formats/iq_common.h"

namespace strata::quant::iq {

float dot_iq2_xxs_avx512(const void* weights, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ2XXS*>(weights);
  const auto* y = static_cast<const BlockQ8K*>(act);
  __m128 acc = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kQK; ++i) {
    const BlockIQ2XXS& b = x[i];
    const auto* index = reinterpret_cast<const uint8_t*>(b.qs);
    // Sub-block ib is the word pair (grid indices, signs|scale) at 8*ib: gather the eight
    // signs|scale words in sub-block order.
    const __m256 w0 = _mm256_loadu_ps(reinterpret_cast<const float*>(b.qs));
    const __m256 w1 = _mm256_loadu_ps(reinterpret_cast<const float*>(b.qs + 16));
    const __m256i aux =
        _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(w0, w1, 0xDD)), 0xD8);

    // Byte k of word ib = sign field k of sub-block ib, made full: word ib is the sub-block's
    // 32-bit sign mask (bit 8k + j for element 8k + j).
    const __m256i fields = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(aux, _mm256_set1_epi32(0x7F)),
                        _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_set1_epi32(0x7F00))),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_set1_epi32(0x7F0000)),
            _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_set1_epi32(0x7F000000))));
    alignas(32) uint32_t sign_words[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sign_words), full_sign_bytes(fields));
    const uint32_t* words = opaque(sign_words);
    alignas(32) int32_t scale_store[8];
    const __m256i s4 = _mm256_srli_epi32(aux, 28);
    _mm256_store_si256(reinterpret_cast<__m256i*>(scale_store),
                       twice16(_mm256_add_epi32(_mm256_add_epi32(s4, s4), _mm256_set1_epi32(1))));
    const int32_t* scale = opaque(scale_store);

    const int8_t* q8 = y[i].qs;
    __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* ix = index + 8 * ib;
      const __m256i grid = gather4(kIQ2XXSGrid, ix[0], ix[1], ix[2], ix[3]);
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * ib));
      // grid < 128 unsigned, a in [-127, 127] (negation exact): maddubs pairs stay in int16.
      const __m256i p = _mm256_maddubs_epi16(
          grid, _mm256_mask_sub_epi8(a, _cvtu32_mask32(words[ib]), _mm256_setzero_si256(), a));
      sum = _mm256_dpwssd_epi32(sum, p, broadcast32(scale + ib));
    }
    acc = accumulate_block(acc, sum, b.d, y[i].d);
  }
  return _mm_cvtss_f32(acc) * 0.125f;
}

}  // namespace strata::quant::iq
