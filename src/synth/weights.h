// Synthetic tensor contents, fast and deterministic. A matrix row of any format is a slice of a
// pool of valid blocks (drawn once per (type, magnitude)), starting at a position hashed from the
// seed, the tensor and the row, so rows and tensors differ while generation is a memcpy per row.
// Small vectors with their own distributions (norm gains, ssm_a, dt bias) are drawn directly.
// Everything is a function of (seed, plan): the same seed gives the same bytes on any machine.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "model/arch.h"
#include "quant/types.h"

namespace strata::synth {

class WeightSource {
 public:
  // Sizes the pools for every (spec, type) of the plan.
  WeightSource(uint64_t seed, const std::vector<model::TensorSpec>& specs,
               const std::vector<quant::Type>& types);

  // Writes rows [row0, row0 + nrows) of tensor `index` (row = ne[0] elements) to dst.
  void fill_rows(size_t index, int64_t row0, int64_t nrows, uint8_t* dst);

  // The rms the values of a spec are drawn with (Init::Matrix: 1/sqrt(fan-in)).
  static float matrix_rms(const model::TensorSpec& s);

 private:
  struct Pool {
    std::vector<uint8_t> bytes;  // nblocks blocks, then the first max_row blocks again
    int64_t nblocks = 0;
    int64_t max_row = 0;  // blocks in the longest row drawn from it
  };
  using PoolKey = std::pair<quant::Type, float>;

  void build_pool(const PoolKey& key, Pool& pool) const;
  void fill_direct(size_t index, uint8_t* dst) const;

  uint64_t seed_;
  const std::vector<model::TensorSpec>& specs_;
  const std::vector<quant::Type>& types_;
  std::map<PoolKey, Pool> pools_;
};

}  // namespace strata::synth
