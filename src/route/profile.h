// Expert profile: per (layer, expert) how often a calibration run routed to it, hence a ranking per
// layer; and blend(), the start-up fill order from a profile and the usage history (docs/DESIGN.md:
// up to 0.7 history once the history holds 1k+ tokens). Format in docs/ROUTING.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "route/usage_history.h"

namespace strata::route {

class TraceReader;

class ExpertProfile {
 public:
  ExpertProfile(int n_layers, int n_experts, std::string model);

  void observe(int layer, std::span<const int32_t> experts);
  void add_tokens(int64_t tokens) { tokens_ += tokens; }
  // Rows [first_row, first_row + rows) of a trace.
  static ExpertProfile from_trace(const TraceReader& trace, int64_t first_row, int64_t rows);

  // Expert ids of `layer`, most routed first (ties to the lower id).
  std::vector<int32_t> ranking(int layer) const;
  std::span<const uint64_t> layer_counts(int layer) const {
    return {counts_.data() + size_t(layer) * size_t(n_experts_), size_t(n_experts_)};
  }
  int n_layers() const { return n_layers_; }
  int n_experts() const { return n_experts_; }
  int64_t tokens() const { return tokens_; }
  const std::string& model() const { return model_; }

  // Atomic replace; load validates magic, version, sizes and checksum (strata::Error otherwise).
  void save(const std::string& path) const;
  static ExpertProfile load(const std::string& path);
  static ExpertProfile parse(std::span<const uint8_t> bytes, const std::string& source);
  void expect_shape(int n_layers, int n_experts, const std::string& source) const;

 private:
  int n_layers_;
  int n_experts_;
  int64_t tokens_ = 0;
  std::string model_;
  std::vector<uint64_t> counts_;
};

// The history's weight in the blend: 0.7 * min(1, tokens / 1000), a linear ramp while the history
// is young.
double history_weight(int64_t history_tokens);

// Per layer, every expert id best first by
//   w * history_share(e) + (1 - w) * profile_share(e),   w = history_weight(history_tokens),
// where a share is the expert's fraction of its layer's (decayed) routes; ties go to the lower id.
// A layer with no profile routes uses the history alone and vice versa. Throws strata::Error when
// the shapes differ.
std::vector<std::vector<int32_t>> blend(const ExpertProfile& profile, const UsageHistory& history,
                                        int64_t history_tokens);

}  // namespace strata::route
