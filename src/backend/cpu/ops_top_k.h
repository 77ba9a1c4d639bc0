// Each row's k largest values (Backend::top_k): the reference the CUDA kernel is tested against,
// in the order the sampler sorts its candidates (decode/sampler.cpp), so that sampling from them
// is sampling from the whole row with top-k.
#pragma once

#include <span>

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// index [rows * k] (row-major, k = values.cols) and values [rows, k]: the row's k largest non-NaN
// values, largest first, the lower column first among equals; past the non-NaN count index -1 and
// value -inf.
void top_k(const Tensor& x, std::span<int32_t> index, Tensor values);

}  // namespace strata::cpu
