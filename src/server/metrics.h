// Server counters and gauges in the Prometheus text exposition format (version 0.0.4). All
// methods are thread-safe; docs/SERVER.md lists every metric.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "decode/generate.h"
#include "experts/expert_source.h"

namespace strata::server {

// A running generation: which of the --parallel sequences runs it and how far it is.
struct SequenceGauge {
  size_t sequence = 0;
  int64_t tokens = 0;                     // generated so far
  std::optional<double> decode_tok_per_s;  // from its first token to its latest
};

// What the metrics read from elsewhere at scrape time.
struct LiveGauges {
  size_t queue_depth = 0;
  size_t queue_capacity = 0;
  size_t running = 0;   // generations running now
  size_t parallel = 1;  // --parallel
  std::vector<SequenceGauge> sequences;  // the running generations
  std::optional<experts::CacheStats> expert_cache;  // the streaming expert cache's counters, if any
  uint64_t warmup_windows = 0;  // warm-up windows run after idle (--warmup-after)
  double warmup_seconds = 0;    // their time
};

class Metrics {
 public:
  // One answered HTTP request; `endpoint` is a route ("/v1/chat/completions") or "other".
  void count_request(const std::string& endpoint, int status);
  // One finished generation: its token counts, speeds and the expert cache's hit rate.
  // `finish` is the OpenAI finish reason or "cancelled".
  void count_generation(const decode::Telemetry& t, const std::string& finish);
  void count_rejection();  // a 429: the queue was full

  std::string render(const LiveGauges& live) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finishes_;
  uint64_t rejected_ = 0;
  uint64_t prompt_tokens_ = 0;    // whole prompts, reused part included
  uint64_t prefilled_tokens_ = 0; // the part that ran through the model
  uint64_t reused_tokens_ = 0;
  uint64_t completion_tokens_ = 0;
  double prefill_seconds_ = 0;
  double decode_seconds_ = 0;
  std::optional<double> last_prefill_tok_s_, last_decode_tok_s_, last_cache_hit_rate_;
  std::optional<spec::Report> spec_;  // speculation summed over generations (gauges: the last)
};

}  // namespace strata::server
