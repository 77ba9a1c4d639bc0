#include "decode/batcher.h"

#include <exception>
#include <vector>

#include "util/error.h"

namespace strata::decode {

Batcher::Batcher(model::Model& model, int64_t row_budget) : model_(model), row_budget_(row_budget) {
  if (row_budget < 1) fail("batcher: the row budget ", row_budget, " must be at least 1");
}

size_t Batcher::step(std::span<SequenceRun* const> runs) {
  std::vector<model::Model::SequenceRows> rows;
  std::vector<SequenceRun*> in_window;
  // A run alone in the window may draft (and its MTP head read the rows' hidden states).
  size_t live = 0;
  for (SequenceRun* run : runs) live += !run->done();
  const bool alone = live == 1;
  const auto add = [&](SequenceRun* run, int64_t budget) {
    const auto tokens = run->next_rows(budget, alone);
    if (tokens.empty()) return int64_t(0);
    rows.push_back({tokens, &run->state(), run->mode(), run->choice().greedy(), run->choice().top(),
                    run->journal(), run->hidden()});
    in_window.push_back(run);
    return int64_t(tokens.size());
  };
  for (SequenceRun* run : runs)
    if (!run->done() && !run->prefilling()) add(run, 1);
  int64_t left = row_budget_;
  for (SequenceRun* run : runs)
    if (!run->done() && run->prefilling() && (left > 0 || in_window.empty())) left -= add(run, left);
  if (rows.empty()) return 0;
  std::vector<std::vector<float>> logits;
  try {
    logits = model_.forward_batch(rows);
  } catch (const std::exception& e) {
    for (SequenceRun* run : in_window) run->fail(e.what());
    return in_window.size();
  }
  for (size_t i = 0; i < in_window.size(); ++i) in_window[i]->take(logits[i]);
  return in_window.size();
}

}  // namespace strata::decode
