// Each row's softmax sum at a temperature (Backend::sampling_sums): the reference the CUDA kernel
// is tested against, and the sum the host sampler takes over a whole row (decode/sampler.cpp).
#pragma once

#include "backend/cpu/ops_common.h"
#include "backend/sampling_weight.h"

namespace strata::cpu {

// sums [rows, 1]: each row's sum of sampling_weight(x, the row's largest non-NaN value,
// temperature) over its non-NaN values, in backend::ChunkedSum's order; 0 for a row of NaNs.
void sampling_sums(const Tensor& x, float temperature, Tensor sums);

}  // namespace strata::cpu
