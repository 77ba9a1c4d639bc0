// The one source of the vector kernels (see ops_vec.h), included by ops_vec.cpp and
// ops_vec_avx2.cpp. It lives in an anonymous namespace on purpose: each includer compiles its
// own copy with its own instruction set, and internal linkage keeps the linker from merging the
// two copies into one.
//
// The loops are written so the compiler vectorizes them without reassociating anything: every
// loop over j is element-wise, and the lane accumulators of the reductions are independent.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/ops_vec.h"

namespace strata::cpu {
namespace {

// The lane combination of the reductions (ops_vec.h); lanes holds kLanes partial sums.
inline float combine_lanes(const float* lanes) {
  float l[8];
  for (int i = 0; i < 8; ++i) l[i] = lanes[i] + lanes[i + 8];
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

float body_dot(const float* a, const float* b, int64_t n) {
  float lanes[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) lanes[i % kLanes] = std::fma(a[i], b[i], lanes[i % kLanes]);
  return combine_lanes(lanes);
}

float body_sum_squares(const float* x, int64_t n) { return body_dot(x, x, n); }

void body_scale_mul(const float* x, float s, const float* w, float* y, int64_t n) {
  if (w) {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * s) * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
  }
}

void body_rescale_axpy(float c, float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i] * c);
}

void body_axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

void body_delta_rule_step(float* S, const float* q, const float* k, const float* v, float decay,
                          float beta, int64_t dk, int64_t dv, float* scratch, float* out) {
  float* kv = scratch;
  for (int64_t j = 0; j < dv; ++j) kv[j] = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    const float ki = k[i];
    for (int64_t j = 0; j < dv; ++j) {
      row[j] *= decay;
      kv[j] = std::fma(row[j], ki, kv[j]);
    }
  }
  float* delta = kv;  // kv is dead once delta is formed
  for (int64_t j = 0; j < dv; ++j) delta[j] = (v[j] - kv[j]) * beta;
  for (int64_t j = 0; j < dv; ++j) out[j] = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    const float ki = k[i];
    const float qi = q[i];
    for (int64_t j = 0; j < dv; ++j) {
      row[j] = std::fma(ki, delta[j], row[j]);
      out[j] = std::fma(row[j], qi, out[j]);
    }
  }
}

constexpr VecKernels make_vec_kernels(const char* name) {
  return {name,
          body_dot,
          body_sum_squares,
          body_scale_mul,
          body_rescale_axpy,
          body_axpy,
          body_delta_rule_step};
}

}  // namespace
}  // namespace strata::cpu
