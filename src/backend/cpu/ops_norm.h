// Row normalizations, per group of `group` columns, in fp32 as the reference computes them, and
// the per-group dot products of qwen4exp's PLE gates.
#pragma once

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// y = (x * inv) * w with inv = 1 / sqrt(sum(x^2) / group + eps); w: F32 [group] or null.
void rms_norm(ThreadPool& pool, const Tensor& x, const Weight* w, int64_t group, float eps,
              Tensor y);
// y = x * inv with inv = 1 / sqrt(sum(x^2) + eps).
void l2_norm(ThreadPool& pool, const Tensor& x, int64_t group, float eps, Tensor y);
// y[r, g] = sign(d) * sqrt(max(|d|, 1e-6)) with d = dot(a, b over group g of row r) * scale;
// y has one column per group.
void signed_sqrt_dot(ThreadPool& pool, const Tensor& a, const Tensor& b, int64_t group,
                     float scale, Tensor y);

}  // namespace strata::cpu
