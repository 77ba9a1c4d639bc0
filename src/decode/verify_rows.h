// The rows of one decode window checked in order, the one loop Session::generate and SequenceRun
// share (docs/SPECULATION.md): row r gives the token after window token r, which the output
// takes; the draft at window token r + 1 stands iff it is that token (exact acceptance), or, with
// typical acceptance on, iff the typical rule accepts it. The first draft that does not stand
// ends the window, and the rows after it are the caller's to roll back.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "spec/speculator.h"

namespace strata::decode {

struct RowHooks {
  // Polled before each row; true ends the generation (the caller notes why).
  std::function<bool()> cancelled;
  // The token row r gives.
  std::function<int32_t(int64_t row)> choose;
  // Typical acceptance of the draft after row r, which that row did not choose; empty: exact.
  std::function<bool(int64_t row, int32_t draft)> typical;
  // Takes the token of row r into the output; true when the generation ends with it.
  std::function<bool(int64_t row, int32_t id)> take;
};

struct WindowRows {
  int64_t kept = 1;   // rows whose input tokens stay in the state
  int judged = 0;     // drafts compared with the token their row gave
  int accepted = 0;   // the first `accepted` of those stood
  bool done = false;  // the generation ended in this window
};

// `window`: the window's tokens (the pending token, then the drafts); empty for the row a
// prefill ends with, which is checked as a window of one row.
WindowRows verify_rows(std::span<const int32_t> window, const RowHooks& hooks);

// RowHooks::typical for `o` (empty when its acceptance is exact): the typical rule
// (spec::typical_accept) at `temperature` over the window's logits rows of n_vocab each.
std::function<bool(int64_t row, int32_t draft)> typical_rule(const spec::Options& o, std::span<const float> logits,
                                                            int64_t n_vocab, float temperature);

}  // namespace strata::decode
