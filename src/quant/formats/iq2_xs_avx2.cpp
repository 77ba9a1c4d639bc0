// IQ2_XS . Q8_K with AVX2, bit-exact with the scalar reference (see iq_common.h).
#include "quant/formats/iq_avx2.h"
#include "quant/formats/iq_common.h"

namespace strata::quant::iq {

float dot_iq2_xs_avx2(const void* weights, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ2XS*>(weights);
  const auto* y = static_cast<const BlockQ8K*>(act);
  __m128 acc = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kQK; ++i) {
    const BlockIQ2XS& b = x[i];
    const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
    const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 16));

    // Grid indices, sign bytes and scales of the whole block, decoded once with SIMD and read back
    // per sub-block from the stack.
    alignas(32) uint16_t index[32];
    const __m256i mask9 = _mm256_set1_epi16(511);
    _mm256_store_si256(reinterpret_cast<__m256i*>(index), _mm256_and_si256(q0, mask9));
    _mm256_store_si256(reinterpret_cast<__m256i*>(index + 16), _mm256_and_si256(q1, mask9));
    alignas(32) uint8_t signs[32];
    const __m256i fields = _mm256_permute4x64_epi64(
        _mm256_packus_epi16(_mm256_srli_epi16(q0, 9), _mm256_srli_epi16(q1, 9)), 0xD8);
    _mm256_store_si256(reinterpret_cast<__m256i*>(signs), full_sign_bytes(fields));
    // Scale of each 16-element half, 2s+1, one int32 per half holding it twice as int16.
    alignas(32) int32_t scale[16];
    uint32_t packed[2];
    std::memcpy(packed, b.scales, 8);
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    for (int k = 0; k < 2; ++k) {
      const __m256i nib = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_set1_epi32(int32_t(packed[k])), shifts), _mm256_set1_epi32(15));
      const __m256i ls = _mm256_add_epi32(_mm256_add_epi32(nib, nib), _mm256_set1_epi32(1));
      _mm256_store_si256(reinterpret_cast<__m256i*>(scale + 8 * k), twice16(ls));
    }

    const int8_t* q8 = y[i].qs;
    __m256i sum = _mm256_setzero_si256();
    // Not unrolled: with a variable ib the per-sub-block values come from the stack as pure
    // broadcast loads; fully unrolled, the compiler keeps them in registers and spends port-5
    // shuffles to extract them, which is the bottleneck of this kernel.
#pragma GCC unroll 1
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t* ix = index + 4 * ib;
      const __m256i grid = gather4(kIQ2XSGrid, ix[0], ix[1], ix[2], ix[3]);
      const __m256i p =
          signed_products(grid, sign_masks(signs + 4 * ib),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * ib)));
      // maddubs put elements 0..15 in the low lane and 16..31 in the high one: one scale each.
      const __m256i sv =
          _mm256_blend_epi32(broadcast32(scale + 2 * ib), broadcast32(scale + 2 * ib + 1), 0xF0);
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, sv));
    }
    acc = accumulate_block(acc, sum, b.d, y[i].d);
  }
  return _mm_cvtss_f32(acc) * 0.125f;
}

}  // namespace strata::quant::iq
