#include "decode/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "decode/row_choice.h"
#include "decode/stop.h"
#include "decode/verify_rows.h"
#include "tokenizer/detokenize.h"
#include "util/error.h"

namespace strata::decode {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string number_or_dash(const std::optional<double>& v, const char* format) {
  if (!v) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, *v);
  return buf;
}

}  // namespace

void fill_cache_telemetry(Telemetry& tm, const experts::CacheStats& d) {
  if (d.hits + d.misses > 0) tm.cache_hit_rate = d.hit_rate();
  if (tm.decode_seconds > 0) tm.ssd_gb_per_s = double(d.bytes_read) / tm.decode_seconds / 1e9;
  if (tm.decode_tokens > 0) tm.stall_ms_per_token = d.stall_seconds * 1e3 / double(tm.decode_tokens);
  if (d.h2d_bytes > 0 && d.h2d_seconds > 0)
    tm.h2d_gb_per_s = double(d.h2d_bytes) / d.h2d_seconds / 1e9;
  if (d.host_hits + d.host_reads > 0) tm.host_hit_rate = d.host_hit_rate();
  if (d.handshakes > 0) tm.handshake_us = d.handshake_us();
}

void GenerateParams::validate() const {
  sampling.validate();
  if (max_tokens < 0) fail("max_tokens: ", max_tokens, " is negative");
  if (batch < 1) fail("batch: ", batch, " must be at least 1");
  for (const auto& s : stop)
    if (s.empty()) fail("stop: an empty stop string would end every generation at once");
}

std::optional<double> Telemetry::prefill_tok_per_s() const {
  if (prompt_tokens == 0 || prefill_seconds <= 0) return std::nullopt;
  return double(prompt_tokens) / prefill_seconds;
}

std::optional<double> Telemetry::decode_tok_per_s() const {
  if (decode_tokens == 0 || decode_seconds <= 0) return std::nullopt;
  return double(decode_tokens) / decode_seconds;
}

std::string format_telemetry(const Telemetry& t) {
  std::string reused = t.reused_tokens > 0 ? cat(", ", t.reused_tokens, " reused") : "";
  const auto hit_percent =
      t.cache_hit_rate ? std::optional<double>(*t.cache_hit_rate * 100.0) : std::nullopt;
  return cat("prompt ", t.prompt_tokens, " tok", reused, ", prefill ",
             number_or_dash(t.prefill_tok_per_s(), "%.1f"), " tok/s | ", t.generated_tokens,
             " tok, decode ", number_or_dash(t.decode_tok_per_s(), "%.1f"), " tok/s | cache hit ",
             number_or_dash(hit_percent, "%.1f%%"), " | ssd ",
             number_or_dash(t.ssd_gb_per_s, "%.2f"), " GB/s | stall ",
             number_or_dash(t.stall_ms_per_token, "%.1f"), " ms/tok",
             t.h2d_gb_per_s ? " | h2d " + number_or_dash(t.h2d_gb_per_s, "%.1f") + " GB/s"
                            : std::string(),
             t.host_hit_rate
                 ? " | host tier " + number_or_dash(*t.host_hit_rate * 100.0, "%.1f%%") + " of misses"
                 : std::string(),
             t.handshake_us ? " | handshake " + number_or_dash(t.handshake_us, "%.1f") + " us"
                            : std::string(),
             t.spec ? " | " + spec::format_report(*t.spec) : std::string());
}

Session::Session(model::Model& model, const tokenizer::Tokenizer& tokenizer,
                 const SessionOptions& options)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      state_(model.new_state(options.n_ctx)),
      speculator_(model, options.spec, options.n_ctx,
                  spec::draft_vocab(model, tokenizer.vocab(), options.spec.draft_vocab)) {
  // Qwen's generation configs end on both <|im_end|> and <|endoftext|>, whichever the vocab's
  // eos is; a raw prompt may well be continued with the document end.
  const auto& vocab = tokenizer.vocab();
  for (const auto& id : {vocab.eos, vocab.find("<|im_end|>"), vocab.find("<|endoftext|>")})
    if (id && !is_end(int32_t(*id))) end_ids_.push_back(int32_t(*id));
}

bool Session::is_end(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

void Session::reset() {
  state_.reset();
  tokens_.clear();
  snapshot_.reset();
  snapshot_len_ = 0;
}

int64_t Session::reusable(std::span<const int32_t> prompt) const {
  if (prompt.empty()) return 0;
  // At least the prompt's last token must run: its logits pick the first new token.
  const size_t limit = std::min(prompt.size() - 1, tokens_.size());
  size_t common = 0;
  while (common < limit && tokens_[common] == prompt[common]) ++common;
  if (common == tokens_.size()) return int64_t(common);
  // The DeltaNet layers carry a recurrent state that cannot be unwound position by position, so
  // a divergence goes back to the snapshot (or the start), not to the exact common prefix.
  return snapshot_ && size_t(snapshot_len_) <= common ? snapshot_len_ : 0;
}

int64_t Session::reuse_prefix(std::span<const int32_t> prompt) {
  const int64_t n = reusable(prompt);
  if (n == int64_t(tokens_.size())) return n;
  if (n > 0) {
    state_ = *snapshot_;
    tokens_.resize(size_t(n));
    return n;
  }
  reset();
  return 0;
}

int64_t Session::snapshot_position(const GenerateParams& params, int64_t reused, int64_t n) const {
  if (!options_.snapshot_prompt) return -1;
  if (params.snapshot_at > reused && params.snapshot_at <= n) return params.snapshot_at;
  const bool held = params.snapshot_at >= 0 && params.snapshot_at <= reused && snapshot_ && snapshot_len_ <= reused;
  return held ? -1 : n;
}

void Session::keep_snapshot() {
  if (snapshot_)
    *snapshot_ = state_;
  else
    snapshot_.emplace(state_);
  snapshot_len_ = int64_t(tokens_.size());
}

GenerateResult Session::generate(std::span<const int32_t> prompt, const GenerateParams& params,
                                 const PieceFn& on_piece) {
  params.validate();
  if (prompt.empty()) fail("generate: the prompt is empty");
  if (int64_t(prompt.size()) > n_ctx())
    fail("the prompt has ", prompt.size(), " tokens, more than the context of ", n_ctx());
  try {
    return run(prompt, params, on_piece);
  } catch (...) {
    // A window that threw (an expert record that could not be read) may have advanced the
    // recurrent state of the layers before the failure, so the state no longer matches tokens_:
    // drop it, and the next call prefills from the start.
    reset();
    throw;
  }
}

GenerateResult Session::run(std::span<const int32_t> prompt, const GenerateParams& params,
                            const PieceFn& on_piece) {
  GenerateResult result;
  Telemetry& tm = result.telemetry;
  const int64_t reused = reuse_prefix(prompt);
  tm.reused_tokens = reused;
  tm.prompt_tokens = int64_t(prompt.size()) - reused;

  const auto prefill_start = Clock::now();
  std::vector<float> logits;
  RowChoice choice(params.sampling, !params.logits_filter && !speculator_.options().typical);
  // The MTP head reads the trunk's hidden state of every position.
  std::vector<float> hidden;
  std::vector<float>* hidden_ptr = speculator_.wants_hidden() ? &hidden : nullptr;
  const auto stop_requested = [&] { return params.should_stop && params.should_stop(); };
  const int64_t n = int64_t(prompt.size());
  // A window ends where the state is copied; windows of any size give the same state, so this
  // changes no result.
  const int64_t keep = snapshot_position(params, reused, n);
  for (int64_t first = reused; first < n;) {
    if (stop_requested()) {
      result.finish = FinishReason::Cancelled;
      tm.prefill_seconds = seconds_since(prefill_start);
      return result;
    }
    int64_t count = std::min(params.batch, n - first);
    if (keep > first && keep < first + count) count = keep - first;
    const auto window = prompt.subspan(size_t(first), size_t(count));
    choice.at_positions(uint64_t(first + count), 1);  // the last prompt window's row: position n
    logits = model_.forward(window, state_, model::LogitsMode::Last,
                            {.hidden = hidden_ptr, .greedy = choice.greedy(), .top_k = choice.top()});
    if (hidden_ptr) speculator_.observe(first, hidden);
    tokens_.insert(tokens_.end(), window.begin(), window.end());
    first += count;
    if (first == keep) keep_snapshot();
  }
  tm.prefill_seconds = seconds_since(prefill_start);

  const auto decode_start = Clock::now();
  const auto cache_start = model_.expert_stats();
  const spec::Report spec_start = speculator_.report();
  const int64_t n_vocab = model_.config().n_vocab;
  Sampler sampler(params.sampling, n_vocab);
  tokenizer::StreamDecoder detok(tokenizer_);
  StopMatcher stops(params.stop);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  speculator_.start(history);
  const auto emit = [&](const std::string& text) {
    if (text.empty()) return;
    result.text += text;
    if (on_piece) on_piece(text);
  };
  // The token for the next position from the last window's row r: the sampler's choice keyed by
  // the position (so drafted and plain windows draw the same numbers), or the forced text's token.
  const auto choose = [&](int64_t r) {
    const int32_t id = choice.choose(sampler, logits, r, history, history.size(), params.logits_filter);
    if (!params.forced.empty()) return params.forced[result.tokens.size()];
    return id;
  };
  // A forced continuation ends with its text.
  const size_t limit = params.forced.empty() ? size_t(params.max_tokens)
                                             : std::min(size_t(params.max_tokens), params.forced.size());
  // Takes a chosen token into the output; true when the generation ends with it.
  const auto take = [&](int32_t id) {
    if (is_end(id)) {
      result.finish = FinishReason::Eos;
      return true;
    }
    result.tokens.push_back(id);
    history.push_back(id);
    speculator_.push(id);
    if (params.on_token) params.on_token(id);
    emit(stops.feed(detok.push(uint32_t(id))));
    if (stops.stopped()) {
      result.finish = FinishReason::Stop;
      return true;
    }
    return result.tokens.size() >= limit;
  };

  // Each pass verifies the rows of the last window (the prefill's last row first, verify_rows),
  // and the state is rolled back to the rows that stand.
  std::vector<int32_t> window;  // the last window's tokens: pending token, then drafts
  spec::Speculator::Draft draft;
  int64_t rows = 1;
  int64_t base = state_.n_past - 1;  // positions before the window's first row
  auto window_start = Clock::now();
  speculator_.window_starts();
  bool done = result.tokens.size() >= limit;
  while (!done) {
    const WindowRows v = verify_rows(
        window, {.cancelled =
                     [&] {
                       if (!stop_requested()) return false;
                       result.finish = FinishReason::Cancelled;
                       return true;
                     },
                 .choose = choose,
                 .typical = typical_rule(speculator_.options(), logits, n_vocab, params.sampling.temperature),
                 .take = [&](int64_t r, int32_t id) { return take(id) || base + r + 2 > n_ctx(); }});
    const int64_t kept = v.kept;
    done = v.done;
    if (!window.empty()) {
      if (kept < rows) model_.rollback(state_, speculator_.journal(), kept);
      if (hidden_ptr)
        speculator_.observe(base, std::span(hidden).first(size_t(kept * model_.hidden_cols())));
      tokens_.insert(tokens_.end(), window.begin(), window.begin() + std::ptrdiff_t(kept));
      tm.decode_tokens += kept;
      speculator_.window_done(draft, int(rows), int(kept), v.judged, v.accepted,
                              speculator_.window_paid_one_time_costs()
                                  ? std::nullopt
                                  : std::optional(seconds_since(window_start)));
    }
    if (done) break;
    // The next window: the last chosen token, then the drafts that fit the output and context.
    const int64_t room = std::min(int64_t(limit - result.tokens.size()) - 1, n_ctx() - state_.n_past - 1);
    const auto forced_next = params.forced.empty()
                                 ? std::span<const int32_t>()
                                 : std::span(params.forced).subspan(result.tokens.size());
    draft = speculator_.plan(history, int(std::min<int64_t>(room, spec::kMaxDepth)), forced_next);
    window.assign(1, history.back());
    window.insert(window.end(), draft.tokens.begin(), draft.tokens.end());
    rows = int64_t(window.size());
    base = state_.n_past;
    speculator_.window_starts();
    window_start = Clock::now();
    choice.at_positions(history.size(), rows);  // row r chooses the token after history + r
    logits = model_.forward(window, state_, rows > 1 ? model::LogitsMode::All : model::LogitsMode::Last,
                            {.journal = rows > 1 ? &speculator_.journal() : nullptr,
                             .hidden = hidden_ptr,
                             .greedy = choice.greedy(),
                             .top_k = choice.top()});
    ++tm.decode_steps;
  }
  if (!stops.stopped()) {
    emit(stops.feed(detok.flush()));
    if (stops.stopped())
      result.finish = FinishReason::Stop;
    else
      emit(stops.flush());
  }
  if (stops.stopped()) result.stop_sequence = stops.matched();
  tm.decode_seconds = seconds_since(decode_start);
  tm.generated_tokens = int64_t(result.tokens.size());
  if (cache_start) fill_cache_telemetry(tm, model_.expert_stats()->since(*cache_start));
  if (speculator_.enabled()) tm.spec = speculator_.report().since(spec_start);
  return result;
}

}  // namespace strata::decode
