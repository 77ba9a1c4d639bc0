// AVX-512 activation quantization: the rule of act_rule.h, the same bytes as quant/act.cpp.
#include <immintrin.h>

#include <cstring>

#include "quant/act_rule.h"
#include "quant/formats/blocks.h"
#include "util/half.h"

namespace strata::quant {

namespace {

inline __m512i abs_bits(const float* x) {
  return _mm512_and_si512(_mm512_loadu_si512(x), _mm512_set1_epi32(0x7fffffff));
}

// Largest |x| (as bits) of n elements, n a multiple of 16.
uint32_t amax_bits(const float* x, int n) {
  __m512i m = _mm512_setzero_si512();
  for (int i = 0; i < n; i += 16) m = _mm512_max_epu32(m, abs_bits(x + i));
  return _mm512_reduce_max_epu32(m);
}

// The first of n elements whose |x| has the bits `amax` (one exists).
int first_with(const float* x, uint32_t amax) {
  const __m512i target = _mm512_set1_epi32(int(amax));
  for (int i = 0;; i += 16) {
    const __mmask16 hit = _mm512_cmpeq_epi32_mask(abs_bits(x + i), target);
    if (hit) return i + __builtin_ctz(unsigned(hit));
  }
}

// The codes of n elements (n a multiple of 16): round-to-nearest-even(x * mul) by cvtps under the
// default MXCSR; the products are within +-127.5, so the saturating narrowing never acts.
void write_codes(const float* x, int8_t* q, int n, const ActScale& s) {
  if (s.zero) {
    std::memset(q, 0, size_t(n));
    return;
  }
  const __m512 mul = _mm512_set1_ps(s.mul);
  for (int i = 0; i < n; i += 16) {
    const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), mul));
    _mm_storeu_si128((__m128i*)(q + i), _mm512_cvtsepi32_epi8(r));
  }
}

// The 16 sums of 16 codes of a Q8_K block. The codes are biased to unsigned (q + 128 = q ^ 0x80) so
// that vpsadbw sums each 8 of them; adjacent eight-sums are then added in pairs and the bias of
// 16 * 128 taken off. Every step is exact.
void write_bsums(const int8_t* q, int16_t* bsums) {
  const __m512i bias = _mm512_set1_epi8(int8_t(0x80));
  __m128i eights[4];
  for (int k = 0; k < 4; ++k) {
    const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(q + 64 * k), bias);
    eights[k] = _mm512_cvtepi64_epi16(_mm512_sad_epu8(u, _mm512_setzero_si512()));
  }
  const __m512i all = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_setr_m128i(eights[0], eights[1])),
      _mm256_setr_m128i(eights[2], eights[3]), 1);
  const __m512i sums = _mm512_sub_epi32(_mm512_madd_epi16(all, _mm512_set1_epi16(1)),
                                        _mm512_set1_epi32(16 * 128));
  _mm256_storeu_si256((__m256i*)bsums, _mm512_cvtepi32_epi16(sums));
}

}  // namespace

void quantize_act_avx512(ActFormat f, const float* x, void* out, int64_t n) {
  switch (f) {
    case ActFormat::F32:
      std::memcpy(out, x, size_t(n) * sizeof(float));
      return;
    case ActFormat::Q8_0: {
      auto* y = static_cast<BlockQ8_0*>(out);
      for (int64_t b = 0; b < n / kQK; ++b) {
        const float* xb = x + b * kQK;
        const ActScale s = q8_0_scale(amax_bits(xb, kQK));
        y[b].d = fp32_to_fp16(s.d);
        write_codes(xb, y[b].qs, kQK, s);
      }
      return;
    }
    case ActFormat::Q8_K: {
      auto* y = static_cast<BlockQ8_K*>(out);
      for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float* xb = x + b * kQK_K;
        const uint32_t amax = amax_bits(xb, kQK_K);
        const ActScale s = q8_k_scale(amax, amax ? xb[first_with(xb, amax)] : 0.0f);
        y[b].d = s.d;
        write_codes(xb, y[b].qs, kQK_K, s);
        write_bsums(y[b].qs, y[b].bsums);
      }
      return;
    }
  }
}

}  // namespace strata::quant
