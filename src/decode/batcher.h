// Continuous batching: several SequenceRuns share each window. Every decoding run adds its one
// row; prefilling runs fill what the row budget leaves, in the order given, so a long prompt
// rides along with the others' decode steps instead of stalling them. Runs join and leave
// between windows. The routed experts of a window are fetched once for all its rows
// (Model::forward_batch), and each run's tokens are those it would produce alone. A run that is
// the only one left speculates (when its session does): its windows carry drafts.
#pragma once

#include <cstdint>
#include <span>

#include "decode/sequence_run.h"
#include "model/model.h"

namespace strata::decode {

class Batcher {
 public:
  // `row_budget` (>= 1): prompt rows a window takes beyond the decode rows.
  Batcher(model::Model& model, int64_t row_budget);

  // Runs one window over the runs that want rows (distinct sessions). Returns the number of
  // runs that had rows in it (0: every run is done). A window that fails ends each of its runs
  // with the error.
  size_t step(std::span<SequenceRun* const> runs);

 private:
  model::Model& model_;
  int64_t row_budget_;
};

}  // namespace strata::decode
