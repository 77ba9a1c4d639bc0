// The AVX2+FMA build of ops_vec_body.h. The compiler vectorizes the element-wise loops by itself;
// the reductions are written out with intrinsics (it keeps lane accumulators scalar) in exactly
// the lane order of the body, so both builds still agree bit for bit.
#include <immintrin.h>

#include "backend/cpu/ops_vec_body.h"

namespace strata::cpu {

namespace {

float avx2_dot(const float* a, const float* b, int64_t n) {
  __m256 lo = _mm256_setzero_ps();
  __m256 hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
  }
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  for (int l = 0; i < n; ++i, ++l) lanes[l] = std::fma(a[i], b[i], lanes[l]);
  return combine_lanes(lanes);
}

float avx2_sum_squares(const float* x, int64_t n) { return avx2_dot(x, x, n); }

constexpr VecKernels make_avx2() {
  VecKernels k = make_vec_kernels("avx2");
  k.dot = avx2_dot;
  k.sum_squares = avx2_sum_squares;
  return k;
}

const VecKernels kVecAvx2 = make_avx2();

}  // namespace

const VecKernels* vec_avx2() { return &kVecAvx2; }

}  // namespace strata::cpu
