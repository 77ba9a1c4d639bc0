// One generation as a step machine, so that several can share windows (decode::Batcher): the
// same steps as Session::generate (reuse the prefix the session's state holds, prefill, sample,
// stream, stop strings, hooks, snapshot) but it asks for the rows of its next window and is
// handed their logits, instead of calling the model itself. Because a row's result never
// depends on the other rows of its window, a run produces exactly the tokens Session::generate
// produces for the same prompt and parameters.
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
  // rows; then the token it sampled last. Empty once done; a should_stop() that fires here ends
  // the run (FinishReason::Cancelled).
  std::span<const int32_t> next_rows(int64_t budget);
  bool prefilling() const { return phase_ == Phase::Prefill; }
  model::State& state() { return session_.state_; }

  // What the window chooses for this run's last row (RowChoice): a greedy choice or top-k
  // candidates in the window, or the logits row.
  RowChoice& choice() { return choice_; }
  // The logits of the last of the rows next_rows() gave, once the window has run them (empty when
  // choice() had the window choose). A hook that throws ends the run with that error.
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

  void sample(std::span<float> logits);
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
