// Each row's softmax sum at a temperature (Backend::sampling_sums) and each row's plain
// temperature draw (Backend::draw): the references the CUDA kernels are tested against, and what
// the host sampler takes over a whole row (decode/sampler.cpp).
#pragma once

#include <span>

#include "backend/cpu/ops_common.h"
#include "backend/sampling_weight.h"

namespace strata::cpu {

// sums [rows, 1]: each row's sum of sampling_weight(x, the row's largest non-NaN value,
// temperature) over its non-NaN values, in backend::ChunkedSum's order; 0 for a row of NaNs.
void sampling_sums(const Tensor& x, float temperature, Tensor sums);

// index[r]: row r's draw at `temperature` with uniforms[r] (backend::draw_row over the weights
// sampling_weight(x, the row's largest non-NaN value, temperature), NaN weighing 0); -1 for a row
// of NaNs.
void draw(const Tensor& x, float temperature, const Tensor& uniforms, std::span<int32_t> index);

}  // namespace strata::cpu
