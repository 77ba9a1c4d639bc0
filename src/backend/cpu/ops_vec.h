// The vector kernels the hot CPU ops are built from, in two builds of one source
// (ops_vec_body.h): a baseline one and an AVX2+FMA one, picked once at run time.
//
// Both builds compute bitwise the same results. Every multiply-add is an explicit fused
// multiply-add (std::fma, a hardware instruction in the AVX2 build and a correctly rounded libm
// call in the baseline one), so the compiler's freedom to contract a*b+c into an FMA in one build
// and not the other never changes a bit. Reductions use one fixed order that does not depend on
// the caller: element i accumulates into lane i % 16 (two 8-wide accumulators, enough to hide the
// FMA latency), lanes l and l + 8 are added, and those 8 are combined as
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
#pragma once

#include <cstdint>

namespace strata::cpu {

inline constexpr int kLanes = 16;

struct VecKernels {
  const char* name;
  // sum_i a[i] * b[i] in the fixed lane order.
  float (*dot)(const float* a, const float* b, int64_t n);
  // sum_i x[i]^2 in the fixed lane order.
  float (*sum_squares)(const float* x, int64_t n);
  // y[i] = (x[i] * s) * w[i], or x[i] * s where w is null. In place is fine.
  void (*scale_mul)(const float* x, float s, const float* w, float* y, int64_t n);
  // y[i] = fma(a, x[i], y[i] * c): the online-softmax update of an accumulator.
  void (*rescale_axpy)(float c, float a, const float* x, float* y, int64_t n);
  // y[i] = fma(a, x[i], y[i]).
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  // One token of the gated delta rule on one head's state S[dk][dv] (row i of S is key dim i):
  //   S *= decay; kv[j] = sum_i S[i][j] k[i]; delta[j] = (v[j] - kv[j]) * beta;
  //   S[i][j] = fma(k[i], delta[j], S[i][j]); out[j] = sum_i S[i][j] q[i].
  // The sums over i run i = 0, 1, ... as fma chains starting from 0, one per column j.
  // `scratch` holds dv floats.
  void (*delta_rule_step)(float* S, const float* q, const float* k, const float* v, float decay,
                          float beta, int64_t dk, int64_t dv, float* scratch, float* out);
};

extern const VecKernels kVecBaseline;
// The AVX2+FMA build; only callable where strata::cpu_features().avx2 holds.
const VecKernels* vec_avx2();
// The build this process uses (AVX2 where strata::cpu_features() allows it).
const VecKernels& vec();

}  // namespace strata::cpu
