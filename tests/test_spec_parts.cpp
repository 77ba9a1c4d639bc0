// Speculative decoding's host-side parts: the suffix drafter against a brute-force search,
// SpecGate's choices on scripted window times and acceptance, the position-keyed sampler, and
// typical acceptance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "decode/generate.h"
#include "decode/sampler.h"
#include "server/metrics.h"
#include "spec/gate_simulation.h"
#include "spec/spec_gate.h"
#include "spec/speculator.h"
#include "spec/suffix_drafter.h"
#include "spec/verify.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::spec {
namespace {

// The longest suffix of s that also ends earlier, its first earlier end, by brute force.
std::vector<int32_t> brute_force_proposal(const std::vector<int32_t>& s, int64_t min_match, int64_t k) {
  const int64_t n = int64_t(s.size());
  for (int64_t len = n - 1; len >= min_match; --len) {
    for (int64_t end = len - 1; end < n - 1; ++end) {
      bool same = true;
      for (int64_t i = 0; i < len && same; ++i) same = s[size_t(end - i)] == s[size_t(n - 1 - i)];
      if (same) {
        const int64_t stop = std::min(n, end + 1 + k);
        return {s.begin() + end + 1, s.begin() + stop};
      }
    }
  }
  return {};
}

TEST(SuffixDrafter, ProposesWhatFollowedTheLongestEarlierMatch) {
  SuffixDrafter d(2);
  d.append(std::vector<int32_t>{1, 2, 3, 4, 5, 9, 2, 3});
  EXPECT_EQ(d.match_length(), 2);
  EXPECT_EQ(d.propose(3), (std::vector<int32_t>{4, 5, 9}));
  d.append(4);  // "2 3 4" now matches at the start
  EXPECT_EQ(d.match_length(), 3);
  EXPECT_EQ(d.propose(8), (std::vector<int32_t>{5, 9, 2, 3, 4}));
  d.append(7);  // nothing ends in "4 7" before
  EXPECT_TRUE(d.propose(4).empty());
  d.reset();
  EXPECT_TRUE(d.propose(4).empty());
}

TEST(SuffixDrafter, SingleTokenMatchesNeedMinMatchOne) {
  SuffixDrafter two(2), one(1);
  for (int32_t t : {5, 6, 7, 5}) {
    two.append(t);
    one.append(t);
  }
  EXPECT_TRUE(two.propose(2).empty());
  EXPECT_EQ(one.propose(2), (std::vector<int32_t>{6, 7}));
}

TEST(SuffixDrafter, EqualsBruteForceOnRandomSequences) {
  Rng rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const uint32_t alphabet = 2 + rng.below(5);
    SuffixDrafter d(2);
    std::vector<int32_t> s;
    for (int i = 0; i < 120; ++i) {
      const int32_t t = int32_t(rng.below(alphabet));
      s.push_back(t);
      d.append(t);
      ASSERT_EQ(d.propose(5), brute_force_proposal(s, 2, 5)) << "trial " << trial << " length " << s.size();
    }
  }
}

// Scripts T(n) = t1 * ratio(n) (T(1) timed the 3 times the gate wants before drafting) and a
// fixed acceptance per position into a gate.
void script(SpecGate& g, double t1, const std::vector<double>& ratio, double acceptance, int windows) {
  for (int i = 0; i < 3; ++i) g.window_done(1, t1);
  for (size_t n = 2; n <= ratio.size() + 1; ++n) g.window_done(int(n), t1 * ratio[n - 2]);
  Rng rng(3);
  for (int w = 0; w < windows; ++w) {
    int accepted = 0;
    while (accepted < 4 && rng.uniform() < acceptance) ++accepted;
    g.verified(Source::Suffix, 4, accepted);
  }
}

TEST(SpecGate, PlainUntilT1IsMeasured) {
  SpecGate g({});
  const Pick p = g.pick(Source::Suffix, 4);
  EXPECT_EQ(p.depth, 0);
  EXPECT_FALSE(g.window_seconds(1).has_value());
  // Three timings: one noisy T(1) could make every window look cheap.
  for (int i = 0; i < 64; ++i) g.verified(Source::Suffix, 1, 1);
  for (int i = 0; i < 8; ++i) g.window_done(2, 0.011);
  g.window_done(1, 0.010);
  g.window_done(1, 0.010);
  EXPECT_EQ(g.pick(Source::Suffix, 4).depth, 0);
  g.window_done(1, 0.010);
  EXPECT_GT(g.pick(Source::Suffix, 4).depth, 0);
}

TEST(SpecGate, CheapWindowsAndHighAcceptancePickTheDeepest) {
  SpecGate g({.max_depth = 4});
  script(g, 0.010, {1.05, 1.10, 1.15, 1.20}, 0.9, 200);
  EXPECT_NEAR(g.acceptance(Source::Suffix, 1), 0.9, 0.15);
  EXPECT_EQ(g.pick(Source::Suffix, 4).depth, 4);
  EXPECT_EQ(g.pick(Source::Suffix, 2).depth, 2);  // no more than the drafter offers
  EXPECT_GT(g.value(Source::Suffix, 4), 2.0);
}

TEST(SpecGate, WindowsCostingTheirRowsTurnDraftingOff) {
  // Compute-bound: T(n) = n T(1). With a = 0.5, E(k) / cost(k) < 1 for every k.
  SpecGate g({.max_depth = 4});
  script(g, 0.010, {2.0, 3.0, 4.0, 5.0}, 0.5, 200);
  int drafted = 0, probes = 0;
  for (int i = 0; i < 256; ++i) {
    const Pick p = g.pick(Source::Suffix, 4);
    drafted += p.depth > 0;
    probes += p.probe;
    EXPECT_TRUE(p.depth == 0 || p.probe) << "pick " << i;
    EXPECT_LE(p.depth, 1) << "pick " << i;
  }
  // It still probes one deeper now and then, so the estimates can recover, but rarely: even at
  // the cheapest timed cost (T(2) = 2 T(1)) a draft at a = 0.5 cannot pay.
  EXPECT_EQ(drafted, probes);
  EXPECT_GE(probes, 2);
  EXPECT_LE(probes, 8);
}

// The drafts' own time is part of a window's cost: the MTP head drafts after the window (its
// catch-up rows, then a step per draft), which can make drafting that pays on the window's rows
// alone slower than plain decoding (12-layer cut on the CPU, docs/PERFORMANCE.md), and probing it
// rarer.
TEST(SpecGate, DraftingTimeCountsInTheCost) {
  SpecGate g({.max_depth = 2});
  for (int i = 0; i < 3; ++i) {
    g.window_done(1, 0.010);
    g.window_done(2, 0.015);
    g.window_done(3, 0.020);
  }
  for (int i = 0; i < 16; ++i) g.verified(Source::Mtp, 2, i % 7 == 0 ? 0 : 2);
  EXPECT_GT(g.best_value(Source::Mtp, 2), 1.1) << "on the window's rows alone drafting pays";
  for (int i = 0; i < 8; ++i) g.drafted(Source::Mtp, 2, 0.008, 0.004, 1);  // d = 4 ms, c = 4 ms a row
  EXPECT_LT(g.value(Source::Mtp, 1), 1.0);
  EXPECT_LT(g.value(Source::Mtp, 2), 1.0);
  EXPECT_EQ(g.best_value(Source::Mtp, 2), 1.0);
  // A probe of one draft would cost (T(2) + c a1 + d) / T(1) - 1 (about 1.24) T(1): at most 1% of
  // the time is every 124th pick or so.
  const double loss = (0.015 + 0.004 * g.acceptance(Source::Mtp, 1) + 0.004) / 0.010 - 1.0;
  const int period = int(std::ceil(loss / 0.01));
  EXPECT_GT(period, 110);
  int probes = 0;
  for (int i = 1; i <= 400; ++i) {
    const Pick p = g.pick(Source::Mtp, 2);
    EXPECT_TRUE(p.depth == 0 || p.probe) << "pick " << i;
    if (p.probe) {
      ++probes;
      EXPECT_EQ(i % period, 0) << "pick " << i;
    }
  }
  EXPECT_EQ(probes, 400 / period);
}

// The MTP head's catch-up is timed per row: one after the head sat idle (16 rows) is not what
// every drafted window pays, which is a row per token the window before it kept.
TEST(SpecGate, CatchUpIsTimedPerRow) {
  // Cheap windows, every draft accepted, then one draft whose catch-up took 16 ms over `rows`.
  auto gate_after_catch_up = [](int rows) {
    SpecGate g({.max_depth = 2});
    for (int i = 0; i < 3; ++i) {
      g.window_done(1, 0.010);
      g.window_done(2, 0.012);
      g.window_done(3, 0.014);
    }
    for (int i = 0; i < 16; ++i) g.verified(Source::Mtp, 2, 2);
    g.drafted(Source::Mtp, 2, 0.002, 0.016, rows);
    return g;
  };
  SpecGate g = gate_after_catch_up(16);  // 1 ms a row
  EXPECT_GT(g.best_value(Source::Mtp, 2), 1.5);
  EXPECT_EQ(g.pick(Source::Mtp, 2).depth, 2);
  // Charged whole to every window, those 16 ms would make drafting a loss: (14 + 16 + 2) / 10
  // against fewer than 3 tokens.
  EXPECT_EQ(gate_after_catch_up(1).best_value(Source::Mtp, 2), 1.0);
}

TEST(SpecGate, DepthFollowsTheCostCurve) {
  // T(2) is cheap, deeper windows are expensive (an expert union past the cache): depth 1.
  SpecGate g({.max_depth = 4});
  script(g, 0.010, {1.1, 2.8, 3.9, 5.0}, 0.7, 200);
  int ones = 0;
  for (int i = 0; i < 15; ++i) ones += g.pick(Source::Suffix, 4).depth == 1;
  EXPECT_GE(ones, 11);  // the rest are probes at depth 2
  EXPECT_GT(g.value(Source::Suffix, 1), g.value(Source::Suffix, 2));
}

TEST(SpecGate, MeasuredTimesMoveThePick) {
  SpecGate g({.max_depth = 3});
  script(g, 0.010, {1.1, 1.2, 1.3}, 0.8, 200);
  EXPECT_EQ(g.pick(Source::Suffix, 3).depth, 3);
  // The SSD starts stalling on wider windows: T(4) and T(3) grow, and the EMA (memory 8) follows.
  for (int i = 0; i < 16; ++i) {
    g.window_done(4, 0.060);
    g.window_done(3, 0.045);
  }
  EXPECT_NEAR(*g.window_seconds(4), 0.060, 0.003);
  EXPECT_LT(g.pick(Source::Suffix, 3).depth, 3);
}

TEST(SpecGate, ForcesAPlainStepAfter64DraftedWindows) {
  SpecGate g({.max_depth = 2});
  script(g, 0.010, {1.01, 1.02}, 0.95, 100);
  int first_plain = -1;
  for (int i = 0; i < 80 && first_plain < 0; ++i)
    if (g.pick(Source::Suffix, 2).forced_plain) first_plain = i;
  EXPECT_EQ(first_plain, 64);
}

TEST(SpecGate, FixedDepthAndTrimWithDrafterProbabilities) {
  SpecGate fixed({.fixed_depth = 3});
  EXPECT_EQ(fixed.pick(Source::Mtp, 5).depth, 3);
  EXPECT_EQ(fixed.pick(Source::Mtp, 2).depth, 2);
  SpecGate g({.max_depth = 4});
  script(g, 0.010, {1.2, 1.4, 1.6, 1.8}, 0.8, 0);
  // Calibration: the drafter said 0.8 and every draft stood, so its probabilities scale up.
  for (int i = 0; i < 32; ++i) g.verified(Source::Mtp, 4, 4, std::vector<float>{0.8f, 0.8f, 0.8f, 0.8f});
  const std::vector<float> confident{0.95f, 0.9f, 0.9f, 0.9f}, losing{0.95f, 0.05f, 0.05f, 0.05f};
  EXPECT_EQ(g.trim(Source::Mtp, confident), 4);
  EXPECT_EQ(g.trim(Source::Mtp, losing), 1);
}

// What the 48-layer 80B shape streamed on the CPU measured (docs/PERFORMANCE.md): a second row
// doubles the window (new experts), a third adds little. Fitted on T(2) alone, T(3) looks like 3
// T(1) and depth 2 (E = 2.63) like a loss; the probes must reach depth 2 to find it pays.
TEST(SpecGate, ProbesReachAnUnmeasuredDepthPastACostlyOne) {
  SpecGate g({.max_depth = 3});
  for (int i = 0; i < 3; ++i) g.window_done(1, 0.120);
  for (int i = 0; i < 3; ++i) g.window_done(2, 0.240);
  for (int i = 0; i < 64; ++i) g.verified(Source::Mtp, 3, i % 8 == 7 ? 0 : 3);  // a1 ~ 0.85, then 1
  EXPECT_LT(g.value(Source::Mtp, 1), 1.0);
  EXPECT_LT(g.value(Source::Mtp, 2), 1.0);  // extrapolated: T(3) ~ 3 T(1)
  int probe_depth = 0;
  for (int i = 0; i < 8 && probe_depth == 0; ++i) {
    const Pick p = g.pick(Source::Mtp, 3);
    if (p.probe) probe_depth = p.depth;
  }
  EXPECT_EQ(probe_depth, 2);
  for (int i = 0; i < 3; ++i) g.window_done(3, 0.266);
  EXPECT_GT(g.value(Source::Mtp, 2), 1.0);
  int twos = 0;
  for (int i = 0; i < 15; ++i) twos += g.pick(Source::Mtp, 3).depth == 2;
  EXPECT_GE(twos, 11);  // the rest probe depth 3, still unmeasured
}

TEST(SpecGate, AutoModeTiesGoToTheLessMeasuredSource) {
  SpecGate g({.max_depth = 2});
  script(g, 0.010, {2.0, 3.0}, 0.3, 20);  // the suffix drafter: judged 20 times, does not pay
  EXPECT_EQ(g.best_value(Source::Suffix, 2), 1.0);
  EXPECT_EQ(g.best_value(Source::Mtp, 2), 1.0);  // the prior does not pay either
  EXPECT_EQ(g.choose(2, 2), Source::Mtp);         // never judged: it gets the window
  for (int i = 0; i < 40; ++i) g.verified(Source::Mtp, 2, 0);
  EXPECT_EQ(g.choose(2, 2), Source::Suffix);
  for (int i = 0; i < 40; ++i) g.verified(Source::Mtp, 2, 2);  // the head turns out to pay
  for (int i = 0; i < 8; ++i) g.window_done(3, 0.022);
  EXPECT_GT(g.best_value(Source::Mtp, 2), 1.0);
  EXPECT_EQ(g.choose(2, 2), Source::Mtp);
  EXPECT_EQ(g.choose(2, 0), Source::Mtp);
}

// One rejected first draft is one draw, not a rate of zero: drafting goes on where windows are
// cheap (before, the position's estimate read 0 and drafting stopped for 62 windows).
TEST(SpecGate, OneEarlyRejectionDoesNotStopDrafting) {
  SpecGate g({.max_depth = 4});
  script(g, 0.010, {1.1, 1.2, 1.3, 1.4}, 0.0, 0);
  g.verified(Source::Mtp, 1, 0);
  EXPECT_GT(g.acceptance(Source::Mtp, 1), 0.2);
  EXPECT_GT(g.pick(Source::Mtp, 4).depth, 0);
  // Many rejections are a rate: drafting stops.
  for (int i = 0; i < 16; ++i) g.verified(Source::Mtp, 1, 0);
  EXPECT_LT(g.acceptance(Source::Mtp, 1), 0.05);
  EXPECT_EQ(g.best_value(Source::Mtp, 4), 1.0);
}

// The rules on simulated sessions of 512 tokens (8 seeds each; the GPU runs were 512
// tokens), learning included: SpecGate within 5% of the best fixed depth, and never more than 2%
// below plain decoding where drafting cannot pay. The cost curves are the ones measured: the GPU
// flagship at a 24 GiB HBM cache (docs/PERFORMANCE.md: fixed depth 4 best, the gate was at
// 0.86-0.90 of it), the 80B shape streamed on the CPU, and the MTP head on random weights.
TEST(SpecGate, SimulatedSessionsLandNearTheBestFixedDepth) {
  struct Case {
    const char* name;
    SimulatedCosts costs;
    double least;  // auto / max(best fixed, plain)
  };
  const Case cases[] = {
      {"gpu flagship", {{1, 1.30, 1.45, 1.70, 1.85}, {.85, .85, .85, .85}, 0.089}, 0.95},
      {"cpu 80b streamed", {{1, 2.2, 2.4, 2.97, 3.64}, {.85, .85, .85, .85}, 0.05}, 0.95},
      {"falling acceptance", {{1, 1.1, 1.2, 1.3, 1.4}, {.9, .6, .4, .3}, 0.05}, 0.95},
      {"useless drafts", {{1, 1.16, 1.38, 1.39, 1.6}, {.03, .03, .03, .03}, 0.09}, 0.98},
      {"compute-bound", {{1, 2, 3, 4, 5}, {.6, .6, .6, .6}, 0.02}, 0.97},
  };
  for (const Case& c : cases) {
    const auto mean = [&](std::optional<int> fixed) {
      double sum = 0;
      for (uint64_t seed = 1; seed <= 8; ++seed) sum += simulate_session(c.costs, fixed, 512, seed).tokens_per_time;
      return sum / 8;
    };
    double best = 0;
    for (int k = 0; k <= 4; ++k) best = std::max(best, mean(k));
    EXPECT_GE(mean(std::nullopt) / best, c.least) << c.name;
  }
  EXPECT_THROW(simulate_session({{1, 2}, {.5, .5}, 0.1}, std::nullopt, 8, 1), Error);
}

TEST(SpecGate, RejectsBadDepths) {
  EXPECT_THROW(SpecGate({.max_depth = kMaxDepth + 1}), Error);
  EXPECT_THROW(SpecGate({.fixed_depth = -1}), Error);
}

TEST(PositionKeyedSampler, SameNumberForAPositionWhateverCameBefore) {
  decode::SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 9;
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(i % 7) * 0.3f;
  decode::Sampler a(p, 64), b(p, 64);
  std::vector<int32_t> first;
  for (uint64_t pos = 100; pos < 140; ++pos) first.push_back(a.sample_at(logits, {}, pos));
  for (int i = 0; i < 13; ++i) b.sample(logits, {});  // other draws in between change nothing
  for (uint64_t pos = 100; pos < 140; ++pos) EXPECT_EQ(b.sample_at(logits, {}, pos), first[pos - 100]);
  // and the numbers are not all the same
  std::vector<int32_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 5);
}

TEST(CounterUniform, UniformEnough) {
  double sum = 0;
  int below_tenth = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const float u = counter_uniform(42, uint64_t(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    below_tenth += u < 0.1f;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(double(below_tenth) / n, 0.1, 0.01);
  EXPECT_NE(counter_uniform(1, 5), counter_uniform(2, 5));
}

TEST(TypicalAcceptance, AcceptsLikelyDraftsOnly) {
  const std::vector<float> peaked = {10.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_TRUE(typical_accept(peaked, 0, 1.0f, 0.3f, 0.09f));
  EXPECT_FALSE(typical_accept(peaked, 1, 1.0f, 0.3f, 0.09f));
  // Flat: high entropy lowers the threshold to delta * exp(-H) = 0.09 / 4, below 1/4.
  const std::vector<float> flat = {1.0f, 1.0f, 1.0f, 1.0f};
  EXPECT_TRUE(typical_accept(flat, 3, 1.0f, 0.3f, 0.09f));
  EXPECT_FALSE(typical_accept(flat, 4, 1.0f, 0.3f, 0.09f));
}

TEST(SpecReport, SinceAccumulateAndPrometheusExport) {
  Report a;
  a.mode = Mode::Auto;
  a.windows = 10;
  a.drafted_windows = 4;
  a.drafted = 8;
  a.accepted = 5;
  a.tokens = 15;
  a.judged[1][1] = 4;
  a.hits[1][1] = 3;
  a.judged[1][2] = 3;
  a.hits[1][2] = 2;
  a.t1 = 0.02;
  a.t_ratio = {1.25};
  a.source_windows[size_t(Source::Mtp)] = 4;
  a.draft_seconds = 0.5;
  a.snapshot_seconds = 0.25;
  a.rollback_seconds = 0.5;
  a.probes = 3;
  Report b = accumulate(a, a);
  EXPECT_EQ(b.windows, 20);
  EXPECT_EQ(b.since(a).windows, 10);
  EXPECT_EQ(b.probes, 6);
  EXPECT_EQ(b.since(a).probes, 3);
  EXPECT_DOUBLE_EQ(b.draft_seconds, 1.0);
  EXPECT_DOUBLE_EQ(b.since(a).draft_seconds, 0.5);
  EXPECT_NE(format_report(a).find("| mtp draft 125.00 ms/window"), std::string::npos) << format_report(a);
  EXPECT_DOUBLE_EQ(b.acceptance(1), 0.75);
  EXPECT_DOUBLE_EQ(b.mean_tokens_per_window(), 1.5);
  EXPECT_DOUBLE_EQ(b.mean_accepted_per_window(), 1.25);

  server::Metrics m;
  decode::Telemetry t;
  t.spec = a;
  m.count_generation(t, "stop");
  m.count_generation(t, "stop");
  const std::string text = m.render({});
  for (const char* line : {"strata_spec_windows_total 20\n", "strata_spec_accepted_tokens_total 10\n",
                           "strata_spec_t1_seconds 0.02\n", "strata_spec_window_time_ratio{rows=\"2\"} 1.25\n",
                           "strata_spec_acceptance{position=\"1\"} 0.75\n",
                           "strata_spec_acceptance{position=\"2\"} 0.666666667\n",
                           "strata_spec_tokens_per_window 1.5\n", "strata_spec_probe_windows_total 6\n",
                           "strata_spec_draft_seconds_total 1\n", "strata_spec_rollback_seconds_total 1.5\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line;
}

}  // namespace
}  // namespace strata::spec
