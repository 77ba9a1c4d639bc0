// AVX2 activation quantization: the rule of act_rule.h, the same bytes as quant/act.cpp.
#include <immintrin.h>

#include <cstring>

#include "quant/act_rule.h"
#include "quant/formats/blocks.h"
#include "util/half.h"

namespace strata::quant {

namespace {

inline __m256i abs_bits(const float* x) {
  return _mm256_and_si256(_mm256_loadu_si256((const __m256i*)x), _mm256_set1_epi32(0x7fffffff));
}

// Largest |x| (as bits) of n elements, n a multiple of 8.
uint32_t amax_bits(const float* x, int n) {
  __m256i m = _mm256_setzero_si256();
  for (int i = 0; i < n; i += 8) m = _mm256_max_epu32(m, abs_bits(x + i));
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
  return uint32_t(_mm_cvtsi128_si32(h));
}

// The first of n elements whose |x| has the bits `amax` (one exists).
int first_with(const float* x, int n, uint32_t amax) {
  const __m256i target = _mm256_set1_epi32(int(amax));
  for (int i = 0;; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(abs_bits(x + i), target)));
    if (hit) return i + __builtin_ctz(unsigned(hit));
  }
}

// The codes of n elements (n a multiple of 32): round-to-nearest-even(x * mul), which cvtps does
// under the default MXCSR; the products are within +-127.5, so the packs never saturate.
void write_codes(const float* x, int8_t* q, int n, const ActScale& s) {
  if (s.zero) {
    std::memset(q, 0, size_t(n));
    return;
  }
  const __m256 mul = _mm256_set1_ps(s.mul);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int i = 0; i < n; i += 32) {
    __m256i r[4];
    for (int k = 0; k < 4; ++k)
      r[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), mul));
    const __m256i w01 = _mm256_packs_epi32(r[0], r[1]);
    const __m256i w23 = _mm256_packs_epi32(r[2], r[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
    _mm256_storeu_si256((__m256i*)(q + i), b);
  }
}

}  // namespace

void quantize_act_avx2(ActFormat f, const float* x, void* out, int64_t n) {
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
      const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
      for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float* xb = x + b * kQK_K;
        const uint32_t amax = amax_bits(xb, kQK_K);
        const ActScale s = q8_k_scale(amax, amax ? xb[first_with(xb, kQK_K, amax)] : 0.0f);
        y[b].d = s.d;
        write_codes(xb, y[b].qs, kQK_K, s);
        // Each 32 codes give two group sums: 4-element partials in the low and high 128 bits.
        for (int g = 0; g < 8; ++g) {
          const __m256i q = _mm256_loadu_si256((const __m256i*)(y[b].qs + 32 * g));
          const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
          __m128i lo = _mm256_castsi256_si128(sum), hi = _mm256_extracti128_si256(sum, 1);
          lo = _mm_hadd_epi32(lo, hi);
          lo = _mm_hadd_epi32(lo, lo);
          y[b].bsums[2 * g] = int16_t(_mm_cvtsi128_si32(lo));
          y[b].bsums[2 * g + 1] = int16_t(_mm_extract_epi32(lo, 1));
        }
      }
      return;
    }
  }
}

}  // namespace strata::quant
