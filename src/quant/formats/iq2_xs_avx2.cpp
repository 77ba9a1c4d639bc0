// IQ2_XS . Q8_K with AVX2, bit-exact with the scalar reference (see iq_common.h).
//
// Per 32-element sub-block: four grid rows (broadcast loads + blends), 32 sign masks, one maddubs
// of |grid| x signed q8 and one madd by the two half scales. The kernel is bound by vector ALU
// operations (about 12 per sub-block on three ports), so the changes that paid off remove work
// around them (measured, see docs/PERFORMANCE.md):
//  - the sub-block loop is fully unrolled: no counter or pointer updates, constant offsets;
//  - the block's sign bytes stay in registers (sign_halves), not stored and reloaded;
//  - grid indices are read straight from the block (a 16-bit load and an and), so nothing waits
//    on a store to the stack;
//  - the two half scales of a sub-block come from one vpshufb of a per-block scale vector instead
//    of two broadcasts and a blend.
// Hardware gathers (vpgatherqq) for the grid, and for a compile-time table of sign rows, were
// measured too: fewer instructions (166 against 225 per block) but slower on this Sapphire Rapids.
#include "quant/formats/iq_avx2.h"
#include "quant/formats/iq_common.h"

namespace strata::quant::iq {

namespace {

// The dot of one weight row with N activations. Everything that depends only on the weights (grid
// rows, sign masks, scales) is built once per sub-block; each activation then costs a load, a sign,
// a maddubs, a madd and an add, and its own block accumulator in the order of iq_common.h.
template <int N>
void dot_n(const BlockIQ2XS* x, const BlockQ8K* const* y, int64_t nb, float* out) {
  __m128 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const BlockIQ2XS& b = x[i];
    const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
    const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 16));
    // The 7-bit sign fields (bits 9..15 of each code) as bytes in element order, made full.
    const __m256i fields = _mm256_permute4x64_epi64(
        _mm256_packus_epi16(_mm256_srli_epi16(q0, 9), _mm256_srli_epi16(q1, 9)), 0xD8);
    const SignHalves signs = sign_halves(full_sign_bytes(fields));

    const __m256i scales = iq2xs_scales(b.scales);

    __m256i sum[N];
    for (int j = 0; j < N; ++j) sum[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t* code = b.qs + 4 * ib;
      const __m256i grid =
          gather4(kIQ2XSGrid, code[0] & 511u, code[1] & 511u, code[2] & 511u, code[3] & 511u);
      const __m256i negative = sign_masks(signs, ib);
      const __m256i sv = iq2xs_scale_pick(scales, ib);
      for (int j = 0; j < N; ++j) {
        const __m256i p = signed_products(
            grid, negative,
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][i].qs + 32 * ib)));
        sum[j] = _mm256_add_epi32(sum[j], _mm256_madd_epi16(p, sv));
      }
    }
    for (int j = 0; j < N; ++j) acc[j] = accumulate_block(acc[j], sum[j], b.d, y[j][i].d);
  }
  for (int j = 0; j < N; ++j) out[j] = _mm_cvtss_f32(acc[j]) * 0.125f;
}

}  // namespace

float dot_iq2_xs_avx2(const void* weights, const void* act, int64_t n) {
  const auto* y = static_cast<const BlockQ8K*>(act);
  float out;
  dot_n<1>(static_cast<const BlockIQ2XS*>(weights), &y, n / kQK, &out);
  return out;
}

void dot_rows_iq2_xs_avx2(const void* weights, const void* const* acts, int count, int64_t n,
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
