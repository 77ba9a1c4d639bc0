#include "decode/sequence_run.h"

#include <algorithm>

#include "decode/verify_rows.h"
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
      choice_(params_.sampling, !params_.logits_filter && !session.speculator_.options().typical),
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

std::span<const int32_t> SequenceRun::next_rows(int64_t budget, bool alone) {
  if (phase_ == Phase::Done) return {};
  if (params_.should_stop && params_.should_stop()) {
    finish(FinishReason::Cancelled);
    return {};
  }
  alone_ = alone;
  hidden_asked_ = speculating() && speculator().wants_hidden();
  if (phase_ == Phase::Decode) {
    window_.assign(1, last_);
    draft_ = {};
    if (alone && speculating()) {
      const auto& st = session_.state_;
      const int64_t room = std::min(params_.max_tokens - int64_t(result_.tokens.size()) - 1,
                                    session_.n_ctx() - st.n_past - 1);
      draft_ = speculator().plan(history_, int(std::min<int64_t>(room, spec::kMaxDepth)));
      window_.insert(window_.end(), draft_.tokens.begin(), draft_.tokens.end());
    }
    base_ = session_.state_.n_past;
    pending_ = int64_t(window_.size());
    // Row r chooses the token after history_ + r.
    choice_.at_positions(history_.size(), pending_);
    speculator().window_starts();
    window_start_ = Clock::now();
    return window_;
  }
  // The prefill's one logits row is chosen for the position after the prompt.
  choice_.at_positions(history_.size(), 1);
  int64_t count = std::min({std::max<int64_t>(budget, 1), params_.batch, int64_t(prompt_.size()) - next_});
  if (keep_ > next_ && keep_ < next_ + count) count = keep_ - next_;
  pending_ = count;
  return std::span(prompt_).subspan(size_t(next_), size_t(count));
}

bool SequenceRun::drafted_window() const { return phase_ == Phase::Decode && window_.size() > 1; }

model::LogitsMode SequenceRun::mode() const {
  return drafted_window() ? model::LogitsMode::All : model::LogitsMode::Last;
}

model::Journal* SequenceRun::journal() { return drafted_window() ? &speculator().journal() : nullptr; }

void SequenceRun::take(std::span<float> logits) {
  if (phase_ == Phase::Done) return;
  try {
    if (phase_ == Phase::Prefill) {
      const auto rows = std::span(prompt_).subspan(size_t(next_), size_t(pending_));
      if (hidden_asked_) speculator().observe(next_, hidden_);
      session_.tokens_.insert(session_.tokens_.end(), rows.begin(), rows.end());
      next_ += pending_;
      if (next_ == keep_) session_.keep_snapshot();
      if (next_ < int64_t(prompt_.size())) return;
      const auto now = Clock::now();
      result_.telemetry.prefill_seconds = seconds_between(prefill_start_, now);
      decode_start_ = now;
      cache_start_ = session_.model_.expert_stats();
      if (speculating()) {
        spec_start_ = speculator().report();
        speculator().start(history_);
      }
      phase_ = Phase::Decode;
      window_.clear();
    }
    verify(logits);
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

// Session::generate's decode loop, one window at a time.
void SequenceRun::verify(std::span<float> logits) {
  if (int64_t(result_.tokens.size()) >= params_.max_tokens) return finish(FinishReason::Length);
  FinishReason reason = FinishReason::Length;
  const RowHooks hooks{
      .cancelled =
          [&] {
            if (!params_.should_stop || !params_.should_stop()) return false;
            reason = FinishReason::Cancelled;
            return true;
          },
      // Keyed by the position, as Session::generate draws.
      .choose =
          [&](int64_t r) {
            return choice_.choose(sampler_, logits, r, history_, history_.size(), params_.logits_filter);
          },
      .typical = typical_rule(speculator().options(), logits, session_.model_.config().n_vocab,
                              params_.sampling.temperature),
      .take =
          [&](int64_t r, int32_t id) {
            if (session_.is_end(id)) {
              reason = FinishReason::Eos;
              return true;
            }
            result_.tokens.push_back(id);
            history_.push_back(id);
            if (speculating()) speculator().push(id);
            if (params_.on_token) params_.on_token(id);
            emit(stops_.feed(detok_.push(uint32_t(id))));
            if (stops_.stopped()) {
              reason = FinishReason::Stop;
              return true;
            }
            // Length: the reply's limit, or the context once the rows up to this one stay.
            return int64_t(result_.tokens.size()) == params_.max_tokens || base_ + r + 1 >= session_.n_ctx();
          },
  };
  if (window_.empty()) base_ = session_.state_.n_past - 1;
  const WindowRows v = verify_rows(window_, hooks);
  if (!window_.empty()) {
    const int64_t rows = int64_t(window_.size());
    if (v.kept < rows) session_.model_.rollback(session_.state_, speculator().journal(), v.kept);
    if (hidden_asked_)
      speculator().observe(base_, std::span(hidden_).first(size_t(v.kept * session_.model_.hidden_cols())));
    session_.tokens_.insert(session_.tokens_.end(), window_.begin(), window_.begin() + std::ptrdiff_t(v.kept));
    ++result_.telemetry.decode_steps;
    result_.telemetry.decode_tokens += v.kept;
    if (speculating()) {
      // Only a window of this run alone that paid no one-time cost times its rows.
      const bool timed = alone_ && !speculator().window_paid_one_time_costs();
      speculator().window_done(draft_, int(rows), int(v.kept), v.judged, v.accepted,
                               timed ? std::optional(seconds_between(window_start_, Clock::now()))
                                     : std::nullopt);
    }
  }
  if (v.done) return finish(reason);
  last_ = history_.back();
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
  if (speculating()) tm.spec = speculator().report().since(spec_start_);
}

void SequenceRun::fail(const std::string& error) {
  error_ = error;
  phase_ = Phase::Done;
  // A failed window may have advanced the state partway (as Session::generate, start afresh).
  session_.reset();
}

}  // namespace strata::decode
