#include "route/usage_history.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "route/binio.h"
#include "util/error.h"

namespace strata::route {

namespace {

constexpr std::string_view kMagic = "STRUSAGE";
constexpr uint32_t kVersion = 1;
constexpr const char* kKind = "usage history";

void check_shape(int n_layers, int n_experts, const std::string& source) {
  if (n_layers < 1 || n_layers > 4096) fail(source, ": n_layers ", n_layers, " is outside 1..4096");
  if (n_experts < 1 || n_experts > 65535) fail(source, ": n_experts ", n_experts, " is outside 1..65535");
}

}  // namespace

UsageHistory::UsageHistory(int n_layers, int n_experts, double half_life_tokens, std::string model)
    : n_layers_(n_layers), n_experts_(n_experts), half_life_(half_life_tokens), model_(std::move(model)) {
  check_shape(n_layers, n_experts, "usage history");
  if (!std::isfinite(half_life_tokens) || half_life_tokens <= 0.0)
    fail("usage history: half-life ", half_life_tokens, " tokens must be a finite value > 0");
  counts_.assign(size_t(n_layers) * size_t(n_experts), 0.0);
}

void UsageHistory::observe(int layer, std::span<const int32_t> experts) {
  if (layer < 0 || layer >= n_layers_) fail("usage history: layer ", layer, " is outside 0..", n_layers_ - 1);
  for (int32_t e : experts) {
    if (e < 0 || e >= n_experts_) fail("usage history: expert ", e, " is outside 0..", n_experts_ - 1);
    counts_[size_t(layer) * size_t(n_experts_) + size_t(e)] += 1.0;
  }
  dirty_ = dirty_ || !experts.empty();
}

void UsageHistory::advance(int64_t tokens) {
  if (tokens < 0) fail("usage history: advancing by ", tokens, " tokens");
  if (tokens == 0) return;
  const double factor = std::exp2(-double(tokens) / half_life_);
  for (double& c : counts_) c *= factor;
  tokens_ += tokens;
  dirty_ = true;
}

void UsageHistory::save(const std::string& path) {
  ByteWriter w;
  put_preamble(w, kMagic, kVersion);
  w.put(uint32_t(n_layers_));
  w.put(uint32_t(n_experts_));
  w.put(half_life_);
  w.put(uint64_t(tokens_));
  w.put_string(model_);
  w.put_all(std::span<const double>(counts_));
  save_with_checksum(w, path, kKind);
  dirty_ = false;
}

UsageHistory UsageHistory::load(const std::string& path) {
  const auto bytes = read_whole_file(path, kKind);
  return parse(bytes, cat(kKind, " ", path));
}

UsageHistory UsageHistory::parse(std::span<const uint8_t> bytes, const std::string& source) {
  ByteReader in(bytes, source);
  expect_preamble(in, kMagic, kVersion, kKind);
  const auto [n_layers, n_experts] = get_shape(in);
  const auto half_life = in.get<double>("half_life");
  if (!std::isfinite(half_life) || half_life <= 0.0) in.fail_at("half-life ", half_life, " is not a finite value > 0");
  const auto tokens = in.get<uint64_t>("tokens");
  if (tokens > uint64_t(INT64_MAX)) in.fail_at("token count ", tokens, " is out of range");
  std::string model = in.get_string("model identity", 4096);
  const size_t want = size_t(n_layers) * size_t(n_experts) * sizeof(double) + sizeof(uint64_t);
  if (in.remaining() < want)
    in.fail_at("truncated: ", n_layers, " x ", n_experts, " counts and the checksum need ", want,
               " bytes but only ", in.remaining(), " remain");
  UsageHistory h(n_layers, n_experts, half_life, std::move(model));
  h.tokens_ = int64_t(tokens);
  const size_t n = h.counts_.size();
  const auto raw = in.take(n * sizeof(double), "counts");
  expect_final_checksum(in, bytes);
  std::memcpy(h.counts_.data(), raw.data(), raw.size());
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(h.counts_[i]) || h.counts_[i] < 0.0)
      fail(source, ": count of layer ", i / n_experts, " expert ", i % n_experts, " is ", h.counts_[i],
           " (must be a finite value >= 0)");
  return h;
}

void UsageHistory::expect_shape(int n_layers, int n_experts, const std::string& source) const {
  if (n_layers != n_layers_ || n_experts != n_experts_)
    fail(source, ": usage history is for ", n_layers_, " layers x ", n_experts_, " experts, the model has ",
         n_layers, " x ", n_experts);
}

PeriodicSaver::PeriodicSaver(std::string path, int64_t every_windows) : path_(std::move(path)), every_(every_windows) {
  if (every_windows < 1) fail("usage history ", path_, ": save interval ", every_windows, " windows must be >= 1");
}

bool PeriodicSaver::tick(UsageHistory& history) {
  if (++since_save_ < every_ || !history.dirty()) return false;
  history.save(path_);
  since_save_ = 0;
  return true;
}

}  // namespace strata::route
