// The greedy choice of each row (Backend::argmax): the reference the CUDA kernel is tested
// against, and what the sampler's greedy path picks (NaN never wins, the lowest column among
// equals).
#pragma once

#include <span>

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// index[r]: row r's argmax (-1 when all of it is NaN); prob[r, 0]: its softmax probability
// (prob without rows: not computed).
void argmax(const Tensor& x, std::span<int32_t> index, Tensor prob);

}  // namespace strata::cpu
