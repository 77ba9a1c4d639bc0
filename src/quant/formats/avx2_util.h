// Helpers for the *_avx2.cpp kernels (include only from files compiled with -mavx2 -mfma -mf16c).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/formats/blocks.h"
#include "quant/formats/prefetch.h"

namespace strata::quant::avx2 {

// Sum of 8 int32 lanes (exact, so any order).
inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

inline int32_t hsum_epi32(__m128i s) {
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// Dot of 32 signed bytes (a in [-127, 127]) as 8 int32 partial sums: |w| * sign(a, w) keeps the
// unsigned-by-signed multiply of maddubs exact.
inline __m256i dot_i8(__m256i w, __m256i a) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// Transposing reductions of int32 partials (exact, any order), built from unpacks and adds:
// vphaddd costs about four times an unpack on the AMD EPYC box (docs/PERFORMANCE.md).
// pair_sums: per 128-bit half, lanes [a, b, a, b] with a's and b's half summed in pairs.
inline __m256i pair_sums(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
// quad_sums of pair_sums(p0, p1) and pair_sums(p2, p3): per 128-bit half, p0..p3's half sums.
inline __m256i quad_sums(__m256i p01, __m256i p23) {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(p01, p23), _mm256_unpackhi_epi64(p01, p23));
}
// Blocks 0..3 in g0 and 4..7 in g1 (as quad_sums leaves them) to lanes 0..7.
inline __m256i octet_sums(__m256i g0, __m256i g1) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
                          _mm256_permute2x128_si256(g0, g1, 0x31));
}

// The exact per-block sums of 8 vectors of int32 partials, block k in lane k.
inline __m256i block_sums8(const __m256i* p) {
  return octet_sums(quad_sums(pair_sums(p[0], p[1]), pair_sums(p[2], p[3])),
                    quad_sums(pair_sums(p[4], p[5]), pair_sums(p[6], p[7])));
}

// The fp16 d of 8 consecutive blocks as 8 floats. The eight 16-bit fields are packed into two
// 64-bit words with scalar loads, shifts and ors, which run on the integer ports: inserting them one
// by one (vpinsrw) took two vector-shuffle uops each, the ports the dot kernels are bound by.
template <typename Block>
__m256 scales8(const Block* x) {
  auto four = [](const Block* b) {
    return uint64_t(b[0].d) | uint64_t(b[1].d) << 16 | uint64_t(b[2].d) << 32 |
           uint64_t(b[3].d) << 48;
  };
  return _mm256_cvtph_ps(_mm_set_epi64x(int64_t(four(x + 4)), int64_t(four(x))));
}

// shuffle_epi8 mask that broadcasts int16 lane `lo` over the low 128 bits and lane `hi` over the
// high 128 bits (indices within each 128-bit half).
inline __m256i pick16(int lo, int hi) {
  return _mm256_setr_m128i(_mm_set1_epi16(int16_t(((2 * lo + 1) << 8) | (2 * lo))),
                           _mm_set1_epi16(int16_t(((2 * hi + 1) << 8) | (2 * hi))));
}

// The Q4_K/Q5_K scale field (see scale_min_k4) decoded with 32-bit masks: the 8 scales as int16
// in both 128-bit halves (for pick16), and sum_s m_s * (bsums_2s + bsums_2s+1) over the block.
inline __m256i scales_k4(const uint8_t* packed, const int16_t* bsums, int32_t* mins) {
  uint32_t u[3];
  std::memcpy(u, packed, sizeof(u));
  const uint32_t sc_lo = u[0] & 0x3f3f3f3f, mn_lo = u[1] & 0x3f3f3f3f;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
  const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_setr_epi32(int(mn_lo), int(mn_hi), 0, 0));
  const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i*)bsums),
                                       _mm_loadu_si128((const __m128i*)(bsums + 8)));
  *mins = hsum_epi32(_mm_madd_epi16(pairs, m16));
  return _mm256_broadcastsi128_si256(
      _mm_cvtepu8_epi16(_mm_setr_epi32(int(sc_lo), int(sc_hi), 0, 0)));
}

// Finishes a dot: the 8 lanes of `acc` (or of `lanes` after scalar tail updates) reduced exactly
// as reduce8 does.
inline float reduce8_ps(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

}  // namespace strata::quant::avx2
