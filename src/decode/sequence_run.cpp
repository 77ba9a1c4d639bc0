#include "decode/sequence_run.h"

#include <algorithm>

#include "util/error.h"

namespace strata::decode {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

SequenceRun::SequenceRun(Session& session, std::span<const int32_t> prompt, GenerateParams params,
                         PieceFn on_piece)
    : session_(session),
      prompt_(prompt.begin(), prompt.end()),
      params_(std::move(params)),
      on_piece_(std::move(on_piece)),
      sampler_(params_.sampling, session.model_.config().n_vocab),
      choice_(params_.sampling, !params_.logits_filter),
      detok_(session.tokenizer_),
      stops_(params_.stop),
      history_(prompt.begin(), prompt.end()) {
  params_.validate();
  if (!params_.forced.empty()) strata::fail("generate: a forced continuation needs Session::generate");
  if (prompt_.empty()) strata::fail("generate: the prompt is empty");
  const int64_t n = int64_t(prompt_.size());
  if (n > session_.n_ctx()) strata::fail("the prompt has ", n, " tokens, more than the context of ", session_.n_ctx());
  const int64_t reused = session_.reuse_prefix(prompt_);
  result_.telemetry.reused_tokens = reused;
  result_.telemetry.prompt_tokens = n - reused;
  next_ = reused;
  keep_ = session_.snapshot_position(params_, reused, n);
  prefill_start_ = Clock::now();
}

std::span<const int32_t> SequenceRun::next_rows(int64_t budget) {
  if (phase_ == Phase::Done) return {};
  if (params_.should_stop && params_.should_stop()) {
    finish(FinishReason::Cancelled);
    return {};
  }
  // The window's one logits row is chosen (sample()) for the position after history_.
  choice_.at_positions(history_.size(), 1);
  if (phase_ == Phase::Decode) {
    pending_ = 1;
    return std::span(&last_, 1);
  }
  int64_t count = std::min({std::max<int64_t>(budget, 1), params_.batch, int64_t(prompt_.size()) - next_});
  if (keep_ > next_ && keep_ < next_ + count) count = keep_ - next_;
  pending_ = count;
  return std::span(prompt_).subspan(size_t(next_), size_t(count));
}

void SequenceRun::take(std::span<float> logits) {
  if (phase_ == Phase::Done) return;
  try {
    if (phase_ == Phase::Prefill) {
      const auto rows = std::span(prompt_).subspan(size_t(next_), size_t(pending_));
      session_.tokens_.insert(session_.tokens_.end(), rows.begin(), rows.end());
      next_ += pending_;
      if (next_ == keep_) session_.keep_snapshot();
      if (next_ < int64_t(prompt_.size())) return;
      const auto now = Clock::now();
      result_.telemetry.prefill_seconds = seconds_between(prefill_start_, now);
      decode_start_ = now;
      cache_start_ = session_.model_.expert_stats();
      phase_ = Phase::Decode;
    } else {
      session_.tokens_.push_back(last_);
      ++result_.telemetry.decode_steps;
      ++result_.telemetry.decode_tokens;
    }
    sample(logits);
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

// One step of Session::generate's decode loop, from the logits of the row just run.
void SequenceRun::sample(std::span<float> logits) {
  if (int64_t(result_.tokens.size()) >= params_.max_tokens) return finish(FinishReason::Length);
  if (params_.should_stop && params_.should_stop()) return finish(FinishReason::Cancelled);
  // Keyed by the position, as Session::generate draws.
  const int32_t id = choice_.choose(sampler_, logits, 0, history_, history_.size(), params_.logits_filter);
  if (session_.is_end(id)) return finish(FinishReason::Eos);
  result_.tokens.push_back(id);
  history_.push_back(id);
  if (params_.on_token) params_.on_token(id);
  emit(stops_.feed(detok_.push(uint32_t(id))));
  if (stops_.stopped()) return finish(FinishReason::Stop);
  if (int64_t(result_.tokens.size()) == params_.max_tokens || session_.state_.n_past >= session_.n_ctx())
    return finish(FinishReason::Length);
  last_ = id;
}

void SequenceRun::emit(const std::string& text) {
  if (text.empty()) return;
  result_.text += text;
  if (on_piece_) on_piece_(text);
}

void SequenceRun::finish(FinishReason reason) {
  const auto now = Clock::now();
  result_.finish = reason;
  if (phase_ == Phase::Prefill) {
    // Stopped before the prompt was in: nothing was generated (as Session::generate returns).
    result_.telemetry.prefill_seconds = seconds_between(prefill_start_, now);
    phase_ = Phase::Done;
    return;
  }
  phase_ = Phase::Done;
  if (!stops_.stopped()) {
    emit(stops_.feed(detok_.flush()));
    if (stops_.stopped())
      result_.finish = FinishReason::Stop;
    else
      emit(stops_.flush());
  }
  if (stops_.stopped()) result_.stop_sequence = stops_.matched();
  Telemetry& tm = result_.telemetry;
  tm.decode_seconds = seconds_between(decode_start_, now);
  tm.generated_tokens = int64_t(result_.tokens.size());
  if (cache_start_) fill_cache_telemetry(tm, session_.model_.expert_stats()->since(*cache_start_));
}

void SequenceRun::fail(const std::string& error) {
  error_ = error;
  phase_ = Phase::Done;
  // A failed window may have advanced the state partway (as Session::generate, start afresh).
  session_.reset();
}

}  // namespace strata::decode
