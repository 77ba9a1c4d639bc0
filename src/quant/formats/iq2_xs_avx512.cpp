// IQ2_XS . Q8_K with AVX-512 (BW, VL, VNNI), bit-exact with the scalar reference (see
// iq_common.h). It is iq2_xs_avx2.cpp's kernel with the two steps AVX-512 does in fewer
// instructions, at the same 256-bit width (on Zen 4 a 512-bit operation costs two 256-bit ones,
// and the grid rows come in 256-bit pieces anyway):
//  - signs: a sub-block's 32 element signs are one 32-bit word of the block's full sign bytes,
//    used directly as a mask register; a masked subtract negates the q8 codes under it (AVX2
//    spreads each sign byte with a shuffle, an and and a compare, then applies vpsignb);
//  - scales: vpdpwssd multiplies the int16 pair sums by the sub-block scales and accumulates in
//    one instruction (AVX2: vpmaddwd, then vpaddd).
#include "quant/formats/iq_avx2.h"
#include "quant/formats/iq_common.h"

namespace strata::quant::iq {

namespace {

// The dot of one weight row with N activations; grid rows, sign masks and scales are built once
// per sub-block for all of them.
template <int N>
void dot_n(const BlockIQ2XS* x, const BlockQ8K* const* y, int64_t nb, float* out) {
  __m128 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const BlockIQ2XS& b = x[i];
    const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
    const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 16));
    // The 7-bit sign fields (bits 9..15 of each code) as bytes in element order, made full: bit j
    // of byte g is the sign of element 8g + j, so 32-bit word ib is sub-block ib's mask.
    alignas(32) uint32_t sign_words[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sign_words),
                       full_sign_bytes(_mm256_permute4x64_epi64(
                           _mm256_packus_epi16(_mm256_srli_epi16(q0, 9), _mm256_srli_epi16(q1, 9)),
                           0xD8)));
    const uint32_t* words = opaque(sign_words);
    const __m256i scales = iq2xs_scales(b.scales);

    __m256i sum[N];
    for (int j = 0; j < N; ++j) sum[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t* code = b.qs + 4 * ib;
      const __m256i grid =
          gather4(kIQ2XSGrid, code[0] & 511u, code[1] & 511u, code[2] & 511u, code[3] & 511u);
      const __mmask32 negative = _cvtu32_mask32(words[ib]);
      const __m256i sv = iq2xs_scale_pick(scales, ib);
      for (int j = 0; j < N; ++j) {
        const __m256i q8 =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][i].qs + 32 * ib));
        // grid < 128 unsigned and q8 in [-127, 127] (negation exact): the int16 pair sums of
        // maddubs stay below 2 * 43 * 127.
        const __m256i p = _mm256_maddubs_epi16(
            grid, _mm256_mask_sub_epi8(q8, negative, _mm256_setzero_si256(), q8));
        sum[j] = _mm256_dpwssd_epi32(sum[j], p, sv);
      }
    }
    for (int j = 0; j < N; ++j) acc[j] = accumulate_block(acc[j], sum[j], b.d, y[j][i].d);
  }
  for (int j = 0; j < N; ++j) out[j] = _mm_cvtss_f32(acc[j]) * 0.125f;
}

}  // namespace

float dot_iq2_xs_avx512(const void* weights, const void* act, int64_t n) {
  const auto* y = static_cast<const BlockQ8K*>(act);
  float out;
  dot_n<1>(static_cast<const BlockIQ2XS*>(weights), &y, n / kQK, &out);
  return out;
}

void dot_rows_iq2_xs_avx512(const void* weights, const void* const* acts, int count, int64_t n,
                            float* out) {
  const auto* x = static_cast<const BlockIQ2XS*>(weights);
  const auto* const* y = reinterpret_cast<const BlockQ8K* const*>(acts);
  switch (count) {
    case 1: dot_n<1>(x, y, n / kQK, out); break;
    case 2: dot_n<2>(x, y, n / kQK, out); break;
    case 3: dot_n<3>(x, y, n / kQK, out); break;
    case 4: dot_n<4>(x, y, n / kQK, out); break;
    case 5: dot_n<5>(x, y, n / kQK, out); break;
    case 6: dot_n<6>(x, y, n / kQK, out); break;
    case 7: dot_n<7>(x, y, n / kQK, out); break;
    default: dot_n<8>(x, y, n / kQK, out); break;
  }
}

}  // namespace strata::quant::iq
