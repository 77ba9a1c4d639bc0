// Element-wise ops and column shuffles: memory-bound loops the compiler vectorizes as they are
// (nothing here reduces, so vectorizing cannot change a bit).
#pragma once

#include <span>

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

void fill(Tensor t, float value);
void copy(const Tensor& src, Tensor dst);
// dst row rows[t] = src row t; negative ids skip their row.
void set_rows(const Tensor& src, std::span<const int32_t> rows, Tensor dst);
void add(const Tensor& a, const Tensor& b, Tensor y);
void scale(const Tensor& x, float s, Tensor y);
// y = x * sigmoid(gate), sigmoid(g) = 1 / (1 + e^-g); a one-column gate scales whole rows.
void mul_sigmoid(const Tensor& x, const Tensor& gate, Tensor y);
// y = silu(gate) * up (swiglu_value in ops_common.h).
void swiglu(ThreadPool& pool, const Tensor& gate, const Tensor& up, Tensor y);
void split_groups(const Tensor& x, int64_t n_groups, std::span<const int64_t> widths,
                  std::span<Tensor> outs);

}  // namespace strata::cpu
