// Each row's softmax sum at a temperature (Backend::sampling_sums): the reference the CUDA kernel
// is tested against, and the sum the host sampler takes over a whole row (decode/sampler.cpp).
#pragma once

#include "backend/cpu/ops_common.h"
#include "backend/sampling_weight.h"

namespace strata::cpu {

// Adds weights column by column in ascending column order, in kSumChunk's order: each chunk's
// weights in turn, then the chunks' sums.
class ChunkedSum {
 public:
  void add(int64_t column, float weight) {
    const int64_t chunk = column / backend::kSumChunk;
    if (chunk != chunk_) {
      total_ += part_;
      part_ = 0.0f;
      chunk_ = chunk;
    }
    part_ += weight;
  }
  float total() const { return total_ + part_; }

 private:
  int64_t chunk_ = -1;
  float part_ = 0.0f, total_ = 0.0f;
};

// sums [rows, 1]: each row's sum of sampling_weight(x, the row's largest non-NaN value,
// temperature) over its non-NaN values, in ChunkedSum's order; 0 for a row of NaNs.
void sampling_sums(const Tensor& x, float temperature, Tensor sums);

}  // namespace strata::cpu
