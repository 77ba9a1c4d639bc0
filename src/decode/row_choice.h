// Where a sequence's next token is chosen: plain greedy choices, top-k / nucleus sampling and
// plain temperature sampling are chosen where the logits are (model::ForwardExtras::greedy /
// top_k: a token or the candidates per row come back, not n_vocab floats); penalties and whatever
// reads or edits the logits (a constraint, typical acceptance) take the rows. Session::generate
// and SequenceRun (several sequences per window) choose through this one path.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "decode/sampler.h"
#include "model/model.h"

namespace strata::decode {

class RowChoice {
 public:
  // `rows_unread`: nothing reads or edits the rows (no logits filter, no typical acceptance).
  RowChoice(const SamplingParams& params, bool rows_unread);
  RowChoice(const RowChoice&) = delete;
  RowChoice& operator=(const RowChoice&) = delete;

  // What a window is asked to choose (null: not that way); at most one is set.
  std::vector<int32_t>* greedy() { return greedy_ ? &choices_ : nullptr; }
  model::TopLogits* top() {
    return candidates_.k > 0 || candidates_.draw_temperature > 0.0f ? &candidates_ : nullptr;
  }
  // Before each window: row r of its logits will be chosen for position first + r (what choose()
  // is then given), so a plain temperature draw in the window uses that position's uniform number.
  void at_positions(uint64_t first, int64_t rows);

  // The sampler's token for row r of the last window, keyed by `position`: from what the window
  // chose, or from `logits` (the window's rows, n_vocab each) after `filter` edits the row in place.
  int32_t choose(Sampler& sampler, std::span<float> logits, int64_t r, std::span<const int32_t> history,
                 uint64_t position, const std::function<void(std::span<float>)>& filter);

 private:
  bool greedy_;
  uint64_t seed_;
  uint64_t first_position_ = 0;
  std::vector<int32_t> choices_;
  model::TopLogits candidates_;
};

}  // namespace strata::decode
