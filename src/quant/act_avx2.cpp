// AVX2 activation quantization: the rule of act.cpp, same bytes (see the comment there).
#include <immintrin.h>

#include <cfloat>
#include <cstring>

#include "quant/formats/blocks.h"
#include "util/half.h"

namespace strata::quant {

namespace {

// n is a multiple of 32. Returns d and writes the n codes.
float quantize_block(const float* x, int8_t* q, int n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_setzero_si256();
  for (int i = 0; i < n; i += 8)
    m = _mm256_max_epi32(m,
                         _mm256_and_si256(_mm256_loadu_si256((const __m256i*)(x + i)), abs_mask));
  __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
  const float amax = _mm_cvtss_f32(_mm_castsi128_ps(h));

  const float d = amax / 127.0f;
  if (!(d >= FLT_MIN)) {
    std::memset(q, 0, size_t(n));
    return 0.0f;
  }
  const __m256 id = _mm256_set1_ps(1.0f / d);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int i = 0; i < n; i += 32) {
    __m256i r[4];
    for (int k = 0; k < 4; ++k) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), id);
      v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
      r[k] = _mm256_cvtps_epi32(v);  // MXCSR default: nearest, ties to even, as nearbyint
    }
    const __m256i w01 = _mm256_packs_epi32(r[0], r[1]);
    const __m256i w23 = _mm256_packs_epi32(r[2], r[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
    _mm256_storeu_si256((__m256i*)(q + i), b);
  }
  return d;
}

}  // namespace

void quantize_act_avx2(ActFormat f, const float* x, void* out, int64_t n) {
  switch (f) {
    case ActFormat::F32:
      std::memcpy(out, x, size_t(n) * sizeof(float));
      return;
    case ActFormat::Q8_0: {
      auto* y = static_cast<BlockQ8_0*>(out);
      for (int64_t b = 0; b < n / kQK; ++b)
        y[b].d = fp32_to_fp16(quantize_block(x + b * kQK, y[b].qs, kQK));
      return;
    }
    case ActFormat::Q8_K: {
      auto* y = static_cast<BlockQ8_K*>(out);
      const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
      for (int64_t b = 0; b < n / kQK_K; ++b) {
        y[b].d = quantize_block(x + b * kQK_K, y[b].qs, kQK_K);
        // Each 32 codes give two group sums: 4-element partials in the low and high 128 bits.
        for (int g = 0; g < 8; ++g) {
          const __m256i q = _mm256_loadu_si256((const __m256i*)(y[b].qs + 32 * g));
          const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
          __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
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
