// strata replay on tiny hand-made traces whose numbers are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <cmath>

#include "gguf_test_util.h"
#include "route/replay.h"
#include "route/trace.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::route {
namespace {

using gguf::testing::TempDir;

// One layer, 4 experts, top-1; row i routes experts[i] with weight 1 (candidates: that expert,
// then `runner[i]`, logits 1.0 and `second[i]`, log-sum-exp 2).
TraceReader tiny_trace(const std::string& path, const std::vector<int>& experts, const std::vector<int>& runner = {},
                       const std::vector<float>& second = {}) {
  TraceHeader h;
  h.n_layers = 1;
  h.n_experts = 4;
  h.top_k = 1;
  h.top_m = runner.empty() ? 0 : 2;
  h.model = "tiny";
  TraceWriter w(path, h);
  for (size_t i = 0; i < experts.size(); ++i) {
    backend::Routing r;
    r.top_k = 1;
    r.experts = {experts[i]};
    r.weights = {1.0f};
    RouterTopM t;
    t.m = 2;
    if (!runner.empty()) {
      t.ids = {experts[i], runner[i]};
      t.logits = {1.0f, second[i]};
      t.lse = {2.0f};
    }
    w.append(0, r, runner.empty() ? nullptr : &t);
  }
  w.close();
  return TraceReader::open(path);
}

const ReplayResult& row(const ReplayReport& r, const std::string& policy) {
  for (const auto& x : r.results)
    if (x.policy == policy) return x;
  throw std::runtime_error("no row " + policy);
}

TEST(RouteReplay, HandComputedPolicies) {
  TempDir dir;
  // Warm-up rows 3, 3 (profile and history: expert 3 first, then ids 0, 1, 2), then measured
  // 0 1 0 2 0 1 with 2 slots.
  const auto t = tiny_trace(dir.file("t"), {3, 3, 0, 1, 0, 2, 0, 1});
  ReplayOptions o;
  o.slots = {2};
  o.warmup_rows = 2;
  o.head_tokens = 2;
  o.expert_bytes = 1000;
  const auto rep = replay(t, o, nullptr, nullptr);
  EXPECT_EQ(rep.measured_rows, 6);
  EXPECT_EQ(rep.results.size(), 3u);  // no candidates: no ccr rows
  EXPECT_FALSE(rep.note.empty());
  // lru, cold: 0 miss, 1 miss, 0 hit, 2 miss (evicts 1), 0 hit, 1 miss.
  const auto& lru = row(rep, "lru");
  EXPECT_DOUBLE_EQ(lru.hit_rate, 2.0 / 6);
  EXPECT_DOUBLE_EQ(lru.head_hit_rate, 0.0);
  EXPECT_DOUBLE_EQ(lru.misses_per_token, 4.0 / 6);
  EXPECT_DOUBLE_EQ(lru.bytes_per_token, 4000.0 / 6);
  // pinned: half of 2 slots pins expert 3, the other slot starts with 0: 0 hit, then every
  // other access misses in the single LRU slot.
  const auto& pinned = row(rep, "pinned");
  EXPECT_DOUBLE_EQ(pinned.hit_rate, 1.0 / 6);
  EXPECT_DOUBLE_EQ(pinned.head_hit_rate, 0.5);
  // blend: filled with 3 (most recent) and 0: 0 hit, 1 miss (evicts 3), 0 hit, 2 miss (evicts 1),
  // 0 hit, 1 miss.
  const auto& blend = row(rep, "blend");
  EXPECT_DOUBLE_EQ(blend.hit_rate, 3.0 / 6);
  EXPECT_DOUBLE_EQ(blend.head_hit_rate, 0.5);
  EXPECT_DOUBLE_EQ(blend.misses_per_token, 3.0 / 6);
  // Deterministic, and the table / JSON carry the same numbers.
  EXPECT_EQ(to_json(replay(t, o, nullptr, nullptr)).dump(), to_json(rep).dump());
  EXPECT_NE(format_table(rep).find("blend"), std::string::npos);
  EXPECT_DOUBLE_EQ(to_json(rep)["results"][0]["hit_rate"].get<double>(), 2.0 / 6);
}

TEST(RouteReplay, HandComputedCacheConditionalRouting) {
  TempDir dir;
  // No warm-up: the fill order is the ids, so the single slot starts with expert 0.
  //   row 0: candidates 1 (z 1.0), 0 (z 0.5): 0 is resident, 0.5 + 0.85 > 1.0: route 0, a hit.
  //   row 1: candidates 2 (1.0), 3 (0.0): no resident candidate: route 2, a miss (evicts 0).
  //   row 2: candidates 1 (1.0), 2 (0.6): 2 is resident, 1.45 > 1.0: route 2, a hit.
  const auto t = tiny_trace(dir.file("t"), {1, 2, 1}, {0, 3, 2}, {0.5f, 0.0f, 0.6f});
  ReplayOptions o;
  o.slots = {1};
  o.warmup_rows = 0;
  o.ccr_m = {2};
  o.r_prot = 0;
  o.mse_dim = 8;
  const auto rep = replay(t, o, nullptr, nullptr);
  const auto& ccr = row(rep, "ccr M=2");
  EXPECT_EQ(ccr.route_m, 2);
  EXPECT_DOUBLE_EQ(ccr.hit_rate, 2.0 / 3);
  EXPECT_DOUBLE_EQ(ccr.misses_per_token, 1.0 / 3);
  EXPECT_DOUBLE_EQ(ccr.substitution_rate, 2.0 / 3);
  EXPECT_DOUBLE_EQ(ccr.agreement, 1.0 / 3);
  // KL(P || Q) of rows 0 and 2 (bonus on the runner-up), row 1 none.
  const auto kl = [](double gap) {
    const double p1 = 1 / (1 + std::exp(-gap)), p2 = 1 - p1;
    const double q1 = 1 / (1 + std::exp(-gap + 0.85)), q2 = 1 - q1;
    return p1 * std::log(p1 / q1) + p2 * std::log(p2 / q2);
  };
  EXPECT_NEAR(ccr.kl, (kl(0.5) + kl(0.4)) / 3, 1e-6);
  // relMSE: top-1 renormalized weights are 1, so the error is |v_sub - v_true|^2 over rows 0 and 2
  // against |v_true|^2 over all rows; v is drawn layer, expert, dimension order from mse_seed.
  Rng rng(o.mse_seed);
  std::vector<std::vector<double>> v(4, std::vector<double>(8));
  for (auto& e : v)
    for (double& x : e) x = rng.normal();
  double err = 0, ref = 0;
  for (auto [truth, sub] : {std::pair{1, 0}, std::pair{2, 2}, std::pair{1, 2}})
    for (int i = 0; i < 8; ++i) {
      err += (v[size_t(sub)][size_t(i)] - v[size_t(truth)][size_t(i)]) * (v[size_t(sub)][size_t(i)] - v[size_t(truth)][size_t(i)]);
      ref += v[size_t(truth)][size_t(i)] * v[size_t(truth)][size_t(i)];
    }
  EXPECT_NEAR(ccr.rel_mse, err / ref, 1e-6);
  // lru on the recorded routes 1 2 1 with one slot: all misses.
  EXPECT_DOUBLE_EQ(row(rep, "lru").hit_rate, 0.0);
}

TEST(RouteReplay, RejectsBadOptions) {
  TempDir dir;
  const auto t = tiny_trace(dir.file("t"), {1, 2, 1}, {0, 3, 2}, {0.5f, 0.0f, 0.6f});
  const auto error_of = [&](const ReplayOptions& o) {
    try {
      replay(t, o, nullptr, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  ReplayOptions o;
  o.slots = {5};
  EXPECT_NE(error_of(o).find("5 slots"), std::string::npos);
  o.slots = {2};
  o.ccr_m = {3};
  EXPECT_NE(error_of(o).find("ROUTE_M 3"), std::string::npos);
  o.ccr_m = {2};
  o.warmup_rows = 3;
  EXPECT_NE(error_of(o).find("none of the trace's 3 rows"), std::string::npos);
}

}  // namespace
}  // namespace strata::route
