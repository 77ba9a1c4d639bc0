// Helpers for the *_avx512.cpp kernels (include only from files compiled with the AVX-512 flags of
// CMakeLists.txt: F, BW, VL, DQ, VNNI). Internal linkage keeps these copies out of other files.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace strata::quant::avx512 {
namespace {

// The exact sums of 8 blocks of 32 bytes, block k in lane k of the result, from p[j] holding the
// 8 partial sums of block 2j in its low 256 bits and of block 2j + 1 in its high 256 bits.
inline __m256i block_sums8(const __m512i* p) {
  // Within each 128-bit lane: [p0 p1 p0 p1] partials, then [p0 p1 p2 p3].
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
  const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
  // 128-bit lanes 0 and 1 hold blocks 0, 2, 4, 6; lanes 2 and 3 blocks 1, 3, 5, 7.
  const __m512i v = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, v));
}

// Two consecutive 32-byte blocks' codes as one vector (block_q8_0 is 34 bytes: d, then qs).
template <typename Block>
inline __m512i codes2(const Block* x) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)x[0].qs)),
                            _mm256_loadu_si256((const __m256i*)x[1].qs), 1);
}

}  // namespace
}  // namespace strata::quant::avx512
