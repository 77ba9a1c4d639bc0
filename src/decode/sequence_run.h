// One generation as a step machine, so that several can share windows (decode::Batcher): the
// same steps as Session::generate (reuse the prefix the session's state holds, prefill, sample,
// stream, stop strings, hooks, snapshot) but it asks for the rows of its next window and is
// handed their logits, instead of calling the model itself. Because a row's result never
// depends on the other rows of its window, a run produces exactly the tokens Session::generate
// produces for the same prompt and parameters.
//
// With speculation on in the session (SessionOptions::spec), a run whose window holds no other
// sequence drafts as Session::generate does: its window is the pending token and the drafts, its
// rows are verified with the same loop (verify_rows.h) and the state rolled back to the rows that
// stand. Windows shared with other sequences carry one row; the MTP head sees the hidden states
// of every window, shared or not, so it can draft as soon as the run is alone. Exact acceptance
// changes no token, so the output is still the plain one.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decode/generate.h"
#include "decode/row_choice.h"
#include "decode/sampler.h"
#include "decode/stop.h"
#include "tokenizer/detokenize.h"

namespace strata::decode {

class SequenceRun {
 public:
  // `session` (the state and prompt cache the run uses), the hooks in `params` and `on_piece`
  // must outlive the run. Throws strata::Error as Session::generate does for a bad prompt or
  // parameters.
  SequenceRun(Session& session, std::span<const int32_t> prompt, GenerateParams params, PieceFn on_piece);
  SequenceRun(const SequenceRun&) = delete;
  SequenceRun& operator=(const SequenceRun&) = delete;

  // The rows this run wants in the next window: while prefilling, at most `budget` (>= 1) prompt
  // rows; then the token it sampled last, followed by drafts when `alone` (the window holds no
  // other sequence) and the session speculates. Empty once done; a should_stop() that fires here
  // ends the run (FinishReason::Cancelled).
  std::span<const int32_t> next_rows(int64_t budget, bool alone = false);
  bool prefilling() const { return phase_ == Phase::Prefill; }
  model::State& state() { return session_.state_; }
  // How the window runs these rows (Model::SequenceRows): every row's logits and a journal for a
  // window with drafts; the hidden states when the MTP head reads them.
  model::LogitsMode mode() const;
  model::Journal* journal();
  std::vector<float>* hidden() { return hidden_asked_ ? &hidden_ : nullptr; }

  // What the window chooses for this run's rows (RowChoice): greedy choices or top-k candidates
  // in the window, or the logits rows.
  RowChoice& choice() { return choice_; }
  // The logits of the rows next_rows() gave once the window has run them: the last row's, or
  // every row's for a window with drafts (empty when choice() had the window choose). A hook that
  // throws ends the run with that error.
  void take(std::span<float> logits);
  // The window holding this run's rows failed: the run ends with `error`.
  void fail(const std::string& error);

  bool done() const { return phase_ == Phase::Done; }
  // After done(): the result, or the reason there is none.
  const GenerateResult& result() const { return result_; }
  const std::optional<std::string>& error() const { return error_; }

 private:
  enum class Phase { Prefill, Decode, Done };
  using Clock = std::chrono::steady_clock;

  spec::Speculator& speculator() { return session_.speculator_; }
  bool speculating() const { return session_.speculator_.enabled(); }
  bool drafted_window() const;  // the window in flight carries drafts after the pending token
  // Checks the rows of the window just run (the prefill's last row first) and keeps what stands.
  void verify(std::span<float> logits);
  void emit(const std::string& text);
  void finish(FinishReason reason);

  Session& session_;
  std::vector<int32_t> prompt_;
  GenerateParams params_;
  PieceFn on_piece_;
  Phase phase_ = Phase::Prefill;
  int64_t next_ = 0;      // the next prompt row to prefill
  int64_t pending_ = 0;   // rows handed out for the window in flight
  int64_t keep_ = -1;     // where the prefill copies the state (Session::snapshot_position)
  int32_t last_ = -1;     // the token sampled last, the next decode row
  std::vector<int32_t> window_;  // the decode window in flight: last_, then drafts
  spec::Speculator::Draft draft_;
  int64_t base_ = 0;             // positions before the window's first row
  bool alone_ = false;           // the window in flight holds this run alone
  bool hidden_asked_ = false;    // it returns the rows' hidden states (hidden_)
  std::vector<float> hidden_;
  Clock::time_point window_start_;
  spec::Report spec_start_;
  Sampler sampler_;
  RowChoice choice_;
  tokenizer::StreamDecoder detok_;
  StopMatcher stops_;
  std::vector<int32_t> history_;
  Clock::time_point prefill_start_, decode_start_;
  std::optional<experts::CacheStats> cache_start_;
  GenerateResult result_;
  std::optional<std::string> error_;
};

}  // namespace strata::decode
