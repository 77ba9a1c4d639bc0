#include "route/profile.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string_view>

#include "route/binio.h"
#include "route/trace.h"
#include "util/error.h"

namespace strata::route {

namespace {

constexpr std::string_view kMagic = "STRPROFL";
constexpr uint32_t kVersion = 1;
constexpr const char* kKind = "expert profile";

// Ids sorted by score, best first, ties to the lower id.
template <typename Score>
std::vector<int32_t> order_by(int n, Score score) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return score(a) > score(b); });
  return ids;
}

}  // namespace

ExpertProfile::ExpertProfile(int n_layers, int n_experts, std::string model)
    : n_layers_(n_layers), n_experts_(n_experts), model_(std::move(model)) {
  if (n_layers < 1 || n_layers > 4096) fail("expert profile: n_layers ", n_layers, " is outside 1..4096");
  if (n_experts < 1 || n_experts > 65535) fail("expert profile: n_experts ", n_experts, " is outside 1..65535");
  counts_.assign(size_t(n_layers) * size_t(n_experts), 0);
}

void ExpertProfile::observe(int layer, std::span<const int32_t> experts) {
  if (layer < 0 || layer >= n_layers_) fail("expert profile: layer ", layer, " is outside 0..", n_layers_ - 1);
  for (int32_t e : experts) {
    if (e < 0 || e >= n_experts_) fail("expert profile: expert ", e, " is outside 0..", n_experts_ - 1);
    ++counts_[size_t(layer) * size_t(n_experts_) + size_t(e)];
  }
}

ExpertProfile ExpertProfile::from_trace(const TraceReader& trace, int64_t first_row, int64_t rows) {
  const auto& h = trace.header();
  if (first_row < 0 || rows < 0 || first_row + rows > trace.rows())
    fail("expert profile: rows ", first_row, "..", first_row + rows, " are outside the trace's ", trace.rows());
  ExpertProfile p(h.n_layers, h.n_experts, h.model);
  for (int64_t r = first_row; r < first_row + rows; ++r)
    for (int l = 0; l < h.n_layers; ++l) p.observe(l, trace.experts(r, l));
  p.add_tokens(rows);
  return p;
}

std::vector<int32_t> ExpertProfile::ranking(int layer) const {
  const auto c = layer_counts(layer);
  return order_by(n_experts_, [&](int32_t e) { return c[size_t(e)]; });
}

void ExpertProfile::save(const std::string& path) const {
  ByteWriter w;
  put_preamble(w, kMagic, kVersion);
  w.put(uint32_t(n_layers_));
  w.put(uint32_t(n_experts_));
  w.put(uint64_t(tokens_));
  w.put_string(model_);
  w.put_all(std::span<const uint64_t>(counts_));
  save_with_checksum(w, path, kKind);
}

ExpertProfile ExpertProfile::load(const std::string& path) {
  const auto bytes = read_whole_file(path, kKind);
  return parse(bytes, cat(kKind, " ", path));
}

ExpertProfile ExpertProfile::parse(std::span<const uint8_t> bytes, const std::string& source) {
  ByteReader in(bytes, source);
  expect_preamble(in, kMagic, kVersion, kKind);
  const auto [n_layers, n_experts] = get_shape(in);
  const auto tokens = in.get<uint64_t>("tokens");
  if (tokens > uint64_t(INT64_MAX)) in.fail_at("token count ", tokens, " is out of range");
  std::string model = in.get_string("model identity", 4096);
  const size_t want = size_t(n_layers) * size_t(n_experts) * sizeof(uint64_t) + sizeof(uint64_t);
  if (in.remaining() < want)
    in.fail_at("truncated: ", n_layers, " x ", n_experts, " counts and the checksum need ", want,
               " bytes but only ", in.remaining(), " remain");
  ExpertProfile p(n_layers, n_experts, std::move(model));
  p.tokens_ = int64_t(tokens);
  const auto raw = in.take(p.counts_.size() * sizeof(uint64_t), "counts");
  expect_final_checksum(in, bytes);
  std::memcpy(p.counts_.data(), raw.data(), raw.size());
  return p;
}

void ExpertProfile::expect_shape(int n_layers, int n_experts, const std::string& source) const {
  if (n_layers != n_layers_ || n_experts != n_experts_)
    fail(source, ": expert profile is for ", n_layers_, " layers x ", n_experts_, " experts, the model has ",
         n_layers, " x ", n_experts);
}

double history_weight(int64_t history_tokens) {
  if (history_tokens <= 0) return 0.0;
  return 0.7 * std::min(1.0, double(history_tokens) / 1000.0);
}

std::vector<std::vector<int32_t>> blend(const ExpertProfile& profile, const UsageHistory& history,
                                        int64_t history_tokens) {
  history.expect_shape(profile.n_layers(), profile.n_experts(), "blend");
  const int n = profile.n_experts();
  std::vector<std::vector<int32_t>> out;
  out.reserve(size_t(profile.n_layers()));
  for (int l = 0; l < profile.n_layers(); ++l) {
    const auto pc = profile.layer_counts(l);
    const auto hc = history.layer_counts(l);
    const double p_total = double(std::accumulate(pc.begin(), pc.end(), uint64_t(0)));
    const double h_total = std::accumulate(hc.begin(), hc.end(), 0.0);
    double w = history_weight(history_tokens);
    if (h_total <= 0.0) w = 0.0;
    if (p_total <= 0.0 && h_total > 0.0) w = 1.0;
    out.push_back(order_by(n, [&](int32_t e) {
      const double hs = h_total > 0.0 ? hc[size_t(e)] / h_total : 0.0;
      const double ps = p_total > 0.0 ? double(pc[size_t(e)]) / p_total : 0.0;
      return w * hs + (1.0 - w) * ps;
    }));
  }
  return out;
}

}  // namespace strata::route
