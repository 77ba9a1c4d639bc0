// Row normalizations, per group of `group` columns, in fp32 as the reference computes them.
#pragma once

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// y = (x * inv) * w with inv = 1 / sqrt(sum(x^2) / group + eps); w: F32 [group] or null.
void rms_norm(ThreadPool& pool, const Tensor& x, const Weight* w, int64_t group, float eps,
              Tensor y);
// y = x * inv with inv = 1 / sqrt(sum(x^2) + eps).
void l2_norm(ThreadPool& pool, const Tensor& x, int64_t group, float eps, Tensor y);

}  // namespace strata::cpu
