// Usage history: per (layer, expert) a count of routes that decays with a half-life in tokens, so
// the start-up fill follows what this user actually runs (docs/DESIGN.md, "Expert arena,
// tiers and I/O": the start-up fill blends the profile with the usage history). It survives restarts as a small file next to the pack
// (format in docs/ROUTING.md), written atomically.
//
// Engine use: after each window, observe() every layer's routed experts of the window's rows, then
// advance(rows). A PeriodicSaver decides when to write; save() again at exit.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace strata::route {

class UsageHistory {
 public:
  // half_life_tokens > 0: a route seen that many tokens ago counts half as much as a new one.
  UsageHistory(int n_layers, int n_experts, double half_life_tokens, std::string model);

  // One route per expert listed (ids must be in range).
  void observe(int layer, std::span<const int32_t> experts);
  // `tokens` tokens went by: every count decays by 0.5^(tokens / half_life).
  void advance(int64_t tokens);

  double count(int layer, int expert) const { return counts_[size_t(layer) * size_t(n_experts_) + size_t(expert)]; }
  std::span<const double> layer_counts(int layer) const {
    return {counts_.data() + size_t(layer) * size_t(n_experts_), size_t(n_experts_)};
  }
  int n_layers() const { return n_layers_; }
  int n_experts() const { return n_experts_; }
  double half_life() const { return half_life_; }
  // Tokens observed over the history's whole life (not decayed): the blend's confidence.
  int64_t tokens() const { return tokens_; }
  const std::string& model() const { return model_; }
  // Changed since the last save() or load().
  bool dirty() const { return dirty_; }

  // Atomic replace (temp file + fsync + rename); throws strata::Error naming the path.
  void save(const std::string& path);
  // Validates magic, version, sizes, values and checksum; throws strata::Error naming the problem.
  static UsageHistory load(const std::string& path);
  static UsageHistory parse(std::span<const uint8_t> bytes, const std::string& source);
  // Throws unless the history belongs to a model of this shape.
  void expect_shape(int n_layers, int n_experts, const std::string& source) const;

 private:
  int n_layers_;
  int n_experts_;
  double half_life_;
  int64_t tokens_ = 0;
  std::string model_;
  std::vector<double> counts_;
  bool dirty_ = false;
};

// Writes the history every `every_windows` windows in which it changed (the engine calls tick()
// after each window, or while idle), so a crash loses at most that much.
class PeriodicSaver {
 public:
  PeriodicSaver(std::string path, int64_t every_windows);
  // Returns true when it saved.
  bool tick(UsageHistory& history);

 private:
  std::string path_;
  int64_t every_;
  int64_t since_save_ = 0;
};

}  // namespace strata::route
