// Q8_0 x Q8_0 with AVX2: eight blocks at a time, their exact integer sums transposed into one
// vector (block k in lane k), so one fma per 8 blocks reproduces the reference's lane b % 8.
#include <algorithm>
#include <cmath>

#include "quant/formats/avx2_util.h"

namespace strata::quant {

float dot_q8_0_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const int64_t nb = n / kQK;
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    prefetch_ahead(x + b, 8 * sizeof(BlockQ8_0));
    __m256i p[8];
    for (int k = 0; k < 8; ++k)
      p[k] = avx2::dot_i8(_mm256_loadu_si256((const __m256i*)x[b + k].qs),
                          _mm256_loadu_si256((const __m256i*)y[b + k].qs));
    const __m256 d = _mm256_mul_ps(avx2::scales8(x + b), avx2::scales8(y + b));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(avx2::block_sums8(p)), acc);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (; b < nb; ++b) {
    const int32_t s = avx2::hsum_epi32(avx2::dot_i8(_mm256_loadu_si256((const __m256i*)x[b].qs),
                                                    _mm256_loadu_si256((const __m256i*)y[b].qs)));
    const float d = _cvtsh_ss(x[b].d) * _cvtsh_ss(y[b].d);
    lanes[b % 8] = std::fma(d, float(s), lanes[b % 8]);
  }
  return reduce8(lanes);
}

namespace {

// The dot of one weight row with N activations, each result bitwise dot_q8_0_avx2's: per group of
// 8 blocks a weight block is loaded and made unsigned once for all activations, and the per-block
// sums are reduced two blocks at a time (block_sums8's transposition, done as the blocks arrive) so
// that N activations need few live registers.
template <int N>
void dot_n(const BlockQ8_0* x, const BlockQ8_0* const* y, int64_t nb, float* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    prefetch_ahead(x + b, 8 * sizeof(BlockQ8_0));
    __m256i half_sums[2][N];
    for (int half = 0; half < 2; ++half) {
      __m256i pair_sums[2][N];
      for (int pair = 0; pair < 2; ++pair) {
        const int64_t k = b + 4 * half + 2 * pair;
        const __m256i w0 = _mm256_loadu_si256((const __m256i*)x[k].qs);
        const __m256i w1 = _mm256_loadu_si256((const __m256i*)x[k + 1].qs);
        const __m256i u0 = _mm256_sign_epi8(w0, w0), u1 = _mm256_sign_epi8(w1, w1);
        for (int j = 0; j < N; ++j) {
          const __m256i a0 = _mm256_loadu_si256((const __m256i*)y[j][k].qs);
          const __m256i a1 = _mm256_loadu_si256((const __m256i*)y[j][k + 1].qs);
          const __m256i p0 = _mm256_madd_epi16(
              _mm256_maddubs_epi16(u0, _mm256_sign_epi8(a0, w0)), ones);
          const __m256i p1 = _mm256_madd_epi16(
              _mm256_maddubs_epi16(u1, _mm256_sign_epi8(a1, w1)), ones);
          pair_sums[pair][j] = avx2::pair_sums(p0, p1);
        }
      }
      for (int j = 0; j < N; ++j)
        half_sums[half][j] = avx2::quad_sums(pair_sums[0][j], pair_sums[1][j]);
    }
    const __m256 dw = avx2::scales8(x + b);
    for (int j = 0; j < N; ++j) {
      const __m256i sums = avx2::octet_sums(half_sums[0][j], half_sums[1][j]);
      acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, avx2::scales8(y[j] + b)),
                               _mm256_cvtepi32_ps(sums), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[j]);
    for (int64_t t = b; t < nb; ++t) {
      const int32_t s = avx2::hsum_epi32(avx2::dot_i8(
          _mm256_loadu_si256((const __m256i*)x[t].qs), _mm256_loadu_si256((const __m256i*)y[j][t].qs)));
      const float d = _cvtsh_ss(x[t].d) * _cvtsh_ss(y[j][t].d);
      lanes[t % 8] = std::fma(d, float(s), lanes[t % 8]);
    }
    out[j] = reduce8(lanes);
  }
}

}  // namespace

void dot_rows_q8_0_avx2(const void* w, const void* const* acts, int count, int64_t n, float* out) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* const* y = reinterpret_cast<const BlockQ8_0* const*>(acts);
  // More than four activations spill the per-activation sums, so larger groups run as fours.
  for (int j = 0; j < count; j += 4) {
    switch (std::min(4, count - j)) {
      case 1: out[j] = dot_q8_0_avx2(w, acts[j], n); break;
      case 2: dot_n<2>(x, y + j, n / kQK, out + j); break;
      case 3: dot_n<3>(x, y + j, n / kQK, out + j); break;
      default: dot_n<4>(x, y + j, n / kQK, out + j); break;
    }
  }
}

}  // namespace strata::quant
