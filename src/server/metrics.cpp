#include "server/metrics.h"

#include <cmath>
#include <cstdio>

#include "util/error.h"

namespace strata::server {

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::count_generation(const decode::Telemetry& t, const std::string& finish) {
  std::lock_guard lock(mutex_);
  ++finishes_[finish];
  prompt_tokens_ += uint64_t(t.prompt_tokens + t.reused_tokens);
  prefilled_tokens_ += uint64_t(t.prompt_tokens);
  reused_tokens_ += uint64_t(t.reused_tokens);
  completion_tokens_ += uint64_t(t.generated_tokens);
  prefill_seconds_ += t.prefill_seconds;
  decode_seconds_ += t.decode_seconds;
  if (auto v = t.prefill_tok_per_s()) last_prefill_tok_s_ = v;
  if (auto v = t.decode_tok_per_s()) last_decode_tok_s_ = v;
  if (t.cache_hit_rate) last_cache_hit_rate_ = t.cache_hit_rate;
  if (t.spec) spec_ = spec_ ? accumulate(*spec_, *t.spec) : *t.spec;
}

void Metrics::count_rejection() {
  std::lock_guard lock(mutex_);
  ++rejected_;
}

namespace {

// Counts exactly (a byte counter passes 10^9 soon), other values to 9 significant digits.
std::string number(double v) {
  char buf[64];
  const bool count = v == std::floor(v) && std::fabs(v) < 0x1p53;
  std::snprintf(buf, sizeof buf, count ? "%.0f" : "%.9g", v);
  return buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void sample(std::string& out, const char* name, double v, const std::string& labels = {}) {
  out += cat(name, labels.empty() ? "" : "{" + labels + "}", " ", number(v), "\n");
}

void metric(std::string& out, const char* name, const char* type, const char* help, double v) {
  header(out, name, type, help);
  sample(out, name, v);
}

// Speculation's exports (docs/SPECULATION.md, "Telemetry").
void render_spec(std::string& out, const spec::Report& r) {
  metric(out, "strata_spec_windows_total", "counter", "Decode windows run with speculation on.", double(r.windows));
  metric(out, "strata_spec_drafted_windows_total", "counter", "Decode windows that carried drafts.",
         double(r.drafted_windows));
  metric(out, "strata_spec_draft_tokens_total", "counter", "Drafted tokens verified.", double(r.drafted));
  metric(out, "strata_spec_accepted_tokens_total", "counter", "Drafted tokens accepted.", double(r.accepted));
  metric(out, "strata_spec_tokens_per_window", "gauge", "Tokens a decode window yields on average (1 + accepted drafts).",
         r.mean_tokens_per_window());
  metric(out, "strata_spec_accepted_per_drafted_window", "gauge", "Mean accepted drafts per drafted window.",
         r.mean_accepted_per_window());
  if (r.t1) metric(out, "strata_spec_t1_seconds", "gauge", "SpecGate's T(1): wall time of a one-row window (EMA).", *r.t1);
  header(out, "strata_spec_window_time_ratio", "gauge", "SpecGate's T(n)/T(1) for the measured row counts n.");
  for (size_t i = 0; i < r.t_ratio.size(); ++i)
    if (r.t_ratio[i] > 0) sample(out, "strata_spec_window_time_ratio", r.t_ratio[i], cat("rows=\"", i + 2, "\""));
  header(out, "strata_spec_acceptance", "gauge", "Acceptance of drafts by position (given the ones before stood).");
  for (int j = 1; j <= spec::kMaxDepth; ++j) {
    int64_t judged = 0;
    for (const auto& s : r.judged) judged += s[size_t(j)];
    if (judged > 0) sample(out, "strata_spec_acceptance", r.acceptance(j), cat("position=\"", j, "\""));
  }
  metric(out, "strata_spec_probe_windows_total", "counter",
         "Drafted windows SpecGate ran deeper than its pick, to keep its estimates alive.", double(r.probes));
  metric(out, "strata_spec_draft_seconds_total", "counter",
         "Time in the MTP head's drafting windows (catch-up and chained steps).", r.draft_seconds);
  metric(out, "strata_spec_rollback_seconds_total", "counter",
         "Time taking the journal's copies and rolling rejected rows back.",
         r.snapshot_seconds + r.rollback_seconds);
}

// The streaming expert cache since start-up (docs/EXPERT_CACHE.md).
void render_expert_cache(std::string& out, const experts::CacheStats& c) {
  metric(out, "strata_expert_cache_hits_total", "counter", "Routed expert lookups found resident.",
         double(c.hits));
  metric(out, "strata_expert_cache_misses_total", "counter", "Routed expert lookups read urgently.",
         double(c.misses));
  metric(out, "strata_expert_cache_read_bytes_total", "counter",
         "Expert record bytes read from the pack (misses and read-ahead).", double(c.bytes_read));
  metric(out, "strata_expert_cache_read_seconds_total", "counter", "Reader time of those reads.",
         c.read_seconds);
  metric(out, "strata_expert_cache_stall_seconds_total", "counter",
         "Time the forward pass waited for experts.", c.stall_seconds);
  metric(out, "strata_expert_cache_evictions_total", "counter", "Experts evicted from the cache.",
         double(c.evictions));
  metric(out, "strata_expert_cache_h2d_bytes_total", "counter",
         "Expert bytes copied into device memory (0 when the cache is host memory).",
         double(c.h2d_bytes));
  metric(out, "strata_expert_cache_h2d_seconds_total", "counter",
         "Copy-engine time of those copies.", c.h2d_seconds);
  metric(out, "strata_expert_cache_host_hits_total", "counter",
         "Device cache misses the host tier held (copied without a read).", double(c.host_hits));
  metric(out, "strata_expert_cache_host_reads_total", "counter",
         "Records read from the pack into the host tier.", double(c.host_reads));
  metric(out, "strata_expert_cache_handshakes_total", "counter",
         "Per-layer handshakes of windows on a device (the routing read, the misses resolved).",
         double(c.handshakes));
  metric(out, "strata_expert_cache_handshake_seconds_total", "counter",
         "Device time those handshakes waited for the host's answer.", c.handshake_seconds);
}

}  // namespace

std::string Metrics::render(const LiveGauges& live) const {
  std::lock_guard lock(mutex_);
  std::string out;
  header(out, "strata_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, n] : requests_)
    sample(out, "strata_requests_total", double(n),
           cat("endpoint=\"", key.first, "\",status=\"", key.second, "\""));
  header(out, "strata_generations_total", "counter",
         "Generations by how they ended: stop, length, timeout (time limit or shutdown), cancelled (client gone), error.");
  for (const auto& [reason, n] : finishes_)
    sample(out, "strata_generations_total", double(n), cat("finish_reason=\"", reason, "\""));
  metric(out, "strata_rejected_total", "counter", "Requests refused with 429: the queue was full.",
         double(rejected_));
  metric(out, "strata_prompt_tokens_total", "counter",
         "Prompt tokens of finished generations, reused ones included.", double(prompt_tokens_));
  metric(out, "strata_prompt_tokens_prefilled_total", "counter",
         "Prompt tokens that ran through the model (the rest came from the prompt cache).",
         double(prefilled_tokens_));
  metric(out, "strata_prompt_tokens_cached_total", "counter",
         "Prompt tokens reused from the previous request's state (the prompt cache).",
         double(reused_tokens_));
  metric(out, "strata_completion_tokens_total", "counter", "Tokens generated.",
         double(completion_tokens_));
  metric(out, "strata_prefill_seconds_total", "counter", "Time spent prefilling prompts.",
         prefill_seconds_);
  metric(out, "strata_decode_seconds_total", "counter", "Time spent generating tokens.",
         decode_seconds_);
  if (last_prefill_tok_s_)
    metric(out, "strata_prefill_tokens_per_second", "gauge",
           "Prefill speed of the last generation that prefilled.", *last_prefill_tok_s_);
  if (last_decode_tok_s_)
    metric(out, "strata_decode_tokens_per_second", "gauge",
           "Decode speed of the last generation that decoded.", *last_decode_tok_s_);
  if (last_cache_hit_rate_)
    metric(out, "strata_expert_cache_hit_ratio", "gauge",
           "Expert cache hit rate of the last generation (0..1).", *last_cache_hit_rate_);
  if (live.expert_cache) render_expert_cache(out, *live.expert_cache);
  if (spec_) render_spec(out, *spec_);
  metric(out, "strata_queue_depth", "gauge", "Requests waiting behind the running generations.",
         double(live.queue_depth));
  metric(out, "strata_queue_capacity", "gauge", "Requests that may wait (--queue).",
         double(live.queue_capacity));
  metric(out, "strata_generation_running", "gauge", "Generations running now.", double(live.running));
  metric(out, "strata_parallel_sequences", "gauge", "Sequences that may share a window (--parallel).",
         double(live.parallel));
  metric(out, "strata_warmup_windows_total", "counter",
         "Warm-up windows run when a request arrived after idle (--warmup-after).", double(live.warmup_windows));
  metric(out, "strata_warmup_seconds_total", "counter", "Time those warm-up windows took.", live.warmup_seconds);
  header(out, "strata_sequence_tokens", "gauge", "Tokens a running generation has made so far, by sequence.");
  for (const auto& s : live.sequences)
    sample(out, "strata_sequence_tokens", double(s.tokens), cat("sequence=\"", s.sequence, "\""));
  header(out, "strata_sequence_decode_tokens_per_second", "gauge",
         "Decode speed of a running generation (its first token to its latest), by sequence.");
  for (const auto& s : live.sequences)
    if (s.decode_tok_per_s)
      sample(out, "strata_sequence_decode_tokens_per_second", *s.decode_tok_per_s, cat("sequence=\"", s.sequence, "\""));
  return out;
}

}  // namespace strata::server
