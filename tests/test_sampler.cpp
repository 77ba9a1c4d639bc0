#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/sampling_weight.h"
#include "decode/sampler.h"
#include "decode/stop.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::decode {
namespace {

std::vector<float> ramp(int n) {
  std::vector<float> l(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) l[size_t(i)] = float(i) * 0.1f;
  return l;
}

TEST(Sampler, GreedyTakesArgmaxLowestIdOnTies) {
  Sampler s({}, 5);
  const std::vector<float> logits = {1, 3, 3, -1, 2};
  EXPECT_EQ(s.sample(logits, {}), 1);
  EXPECT_EQ(argmax(logits), 1);
}

TEST(Sampler, GreedyIgnoresNaN) {
  Sampler s({}, 3);
  const std::vector<float> logits = {NAN, 0.5f, 0.25f};
  EXPECT_EQ(s.sample(logits, {}), 1);
  const std::vector<float> all_nan = {NAN, NAN, NAN};
  EXPECT_THROW(s.sample(all_nan, {}), Error);
}

// The backends' argmax op (what greedy decoding reads instead of logits) is the greedy sampler's
// choice on any row, NaNs and ties included, and its probability the row's softmax at that token.
TEST(Sampler, BackendArgmaxIsTheGreedyChoice) {
  backend::CpuBackend be(1);
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rng rng(seed);
    const int64_t V = 1 + int64_t(rng.below(300));
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& l : logits) l = float(int(rng.below(7))) - 3.0f;  // few values: many ties
    for (int64_t i = 0; i < V; i += 1 + int64_t(rng.below(5)))
      if (rng.below(3) == 0) logits[size_t(i)] = NAN;
    logits[size_t(rng.below(uint32_t(V)))] = 0.5f;  // at least one real value
    backend::Tensor x = be.alloc(1, V), prob = be.alloc(1, 1);
    be.upload(logits.data(), x);
    const backend::Ids index = be.alloc_ids(1, 1);
    be.argmax(x, index, prob);
    int32_t got = 0;
    be.download_ids(index, &got);
    Sampler s({}, V);
    ASSERT_EQ(got, s.sample(logits, {})) << "seed " << seed;
    double sum = 0;
    for (float l : logits)
      if (!std::isnan(l)) sum += std::exp(double(l) - double(logits[size_t(got)]));
    float p = 0;
    be.download(prob, &p);
    EXPECT_NEAR(p, 1.0 / sum, 1e-6);
  }
}

// Top-k sampling from the backends' top_k op's candidates (what sampled decoding reads instead of
// logits) picks the token sampling the whole row picks, for any top-p, min-p, temperature and
// position, on rows with ties, NaNs, signed zeros and infinities.
TEST(Sampler, BackendTopKCandidatesSampleAsTheWholeRow) {
  backend::CpuBackend be(1);
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Rng rng(seed);
    const int64_t V = 1 + int64_t(rng.below(400));
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& l : logits) l = float(int(rng.below(9))) * 0.5f - 2.0f;  // few values: many ties
    for (int64_t i = 0; i < V; i += 1 + int64_t(rng.below(5))) {
      const uint32_t kind = rng.below(8);
      if (kind == 0) logits[size_t(i)] = NAN;
      if (kind == 1) logits[size_t(i)] = -0.0f;
      if (kind == 2) logits[size_t(i)] = -INFINITY;
    }
    if (rng.below(4) == 0) logits[size_t(rng.below(uint32_t(V)))] = INFINITY;
    logits[size_t(rng.below(uint32_t(V)))] = 0.5f;  // at least one real value
    SamplingParams p;
    p.temperature = 0.25f + float(rng.below(8)) * 0.25f;
    p.top_k = 1 + int32_t(rng.below(uint32_t(V + 5)));  // past V too: every value a candidate
    p.top_p = rng.below(2) ? 1.0f : 0.3f + float(rng.below(7)) * 0.1f;
    p.min_p = rng.below(2) ? 0.0f : 0.05f * float(rng.below(5));
    p.seed = seed;
    ASSERT_EQ(p.device_candidates(), p.top_k);
    backend::Tensor x = be.alloc(1, V), values = be.alloc(1, p.top_k);
    be.upload(logits.data(), x);
    const backend::Ids index = be.alloc_ids(1, p.top_k);
    be.top_k(x, index, values);
    std::vector<int32_t> columns(static_cast<size_t>(p.top_k));
    std::vector<float> top(columns.size());
    be.download_ids(index, columns.data());
    be.download(values, top.data());
    Sampler whole(p, V), candidates(p, V);
    for (uint64_t position = 0; position < 8; ++position)
      ASSERT_EQ(candidates.sample_candidates_at(columns, top, NAN, position), whole.sample_at(logits, {}, position))
          << "seed " << seed << " position " << position;
  }
}

// Top-p and min-p without top-k from the backends' top_k op's kMaxNucleus candidates and their
// sampling_sums op's row sum pick the token sampling the whole row picks, on rows wider than the
// candidates, flat ones included (the nucleus cut to kMaxNucleus tokens), with NaNs, ties and
// infinities.
TEST(Sampler, BackendCandidatesAndRowSumSampleAsTheWholeRow) {
  backend::CpuBackend be(1);
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    Rng rng(seed);
    const int64_t V = 1 + int64_t(rng.below(seed % 3 ? 3000 : 300));
    std::vector<float> logits(static_cast<size_t>(V));
    const float spread = rng.below(2) ? 0.02f : 3.0f;  // nearly flat: nuclei past kMaxNucleus
    for (float& l : logits) l = rng.normal() * spread;
    for (int64_t i = 0; i < V; i += 1 + int64_t(rng.below(7))) {
      const uint32_t kind = rng.below(10);
      if (kind == 0) logits[size_t(i)] = NAN;
      if (kind == 1) logits[size_t(i)] = -0.0f;
      if (kind == 2) logits[size_t(i)] = -INFINITY;
      if (kind == 3) logits[size_t(i)] = 0.5f;  // ties
    }
    if (rng.below(6) == 0) logits[size_t(rng.below(uint32_t(V)))] = INFINITY;
    logits[size_t(rng.below(uint32_t(V)))] = 0.5f;  // at least one real value
    SamplingParams p;
    p.temperature = 0.25f + float(rng.below(8)) * 0.25f;
    p.top_p = rng.below(3) ? 0.3f + float(rng.below(7)) * 0.1f : 1.0f;
    p.min_p = p.top_p == 1.0f || rng.below(2) ? 0.05f * float(1 + rng.below(4)) : 0.0f;
    p.seed = seed;
    ASSERT_EQ(p.device_candidates(), kMaxNucleus);
    ASSERT_TRUE(p.device_row_sum());
    backend::Tensor x = be.alloc(1, V), values = be.alloc(1, kMaxNucleus), sum = be.alloc(1, 1);
    be.upload(logits.data(), x);
    const backend::Ids index = be.alloc_ids(1, kMaxNucleus);
    be.top_k(x, index, values);
    be.sampling_sums(x, p.temperature, sum);
    std::vector<int32_t> columns(static_cast<size_t>(kMaxNucleus));
    std::vector<float> top(columns.size());
    float row_sum = 0;
    be.download_ids(index, columns.data());
    be.download(values, top.data());
    be.download(sum, &row_sum);
    Sampler whole(p, V), candidates(p, V);
    for (uint64_t position = 0; position < 8; ++position)
      ASSERT_EQ(candidates.sample_candidates_at(columns, top, row_sum, position), whole.sample_at(logits, {}, position))
          << "seed " << seed << " position " << position;
  }
}

TEST(Sampler, DeviceCandidatesOnlyWhereTheyAreAllItReads) {
  SamplingParams p{.temperature = 0.7f, .top_k = 20, .top_p = 0.8f};
  EXPECT_EQ(p.device_candidates(), 20);
  EXPECT_FALSE(p.device_row_sum());
  const SamplingParams nucleus{.temperature = 0.7f, .top_p = 0.8f};  // no top-k: the best and the sum
  EXPECT_EQ(nucleus.device_candidates(), kMaxNucleus);
  EXPECT_TRUE(nucleus.device_row_sum());
  EXPECT_EQ((SamplingParams{.temperature = 0.7f, .min_p = 0.1f}).device_candidates(), kMaxNucleus);
  EXPECT_EQ((SamplingParams{.temperature = 0.7f}).device_candidates(), 0);                              // the whole row
  EXPECT_EQ((SamplingParams{.top_k = 20}).device_candidates(), 0);                                      // greedy
  EXPECT_EQ((SamplingParams{.temperature = 0.7f, .top_k = 20, .presence_penalty = 0.5f}).device_candidates(), 0);
  EXPECT_EQ((SamplingParams{.temperature = 0.7f, .top_k = int32_t(backend::Backend::kMaxTopK) + 1}).device_candidates(), 0);
  Sampler s(p, 100);
  const std::vector<int32_t> columns(19, 0);
  const std::vector<float> values(19, 0.0f);
  EXPECT_THROW(s.sample_candidates_at(columns, values, NAN, 0), Error);  // not top_k candidates
  const std::vector<int32_t> twenty(20, 0);
  const std::vector<float> twenty_values(20, 0.0f);
  EXPECT_THROW(s.sample_candidates_at(twenty, twenty_values, 1.0f, 0), Error);  // a sum top-k does not read
  Sampler without_sum(nucleus, 2000);
  const std::vector<int32_t> best(size_t(kMaxNucleus), 0);
  const std::vector<float> best_values(size_t(kMaxNucleus), 0.0f);
  EXPECT_THROW(without_sum.sample_candidates_at(best, best_values, NAN, 0), Error);
  Sampler whole(SamplingParams{.temperature = 0.7f}, 100);
  EXPECT_THROW(whole.sample_candidates_at(columns, values, NAN, 0), Error);
}

// The sampler's own exp (the same operations in CUDA kernels) against the C library's.
TEST(Sampler, SamplingExpIsCloseToExp) {
  for (float x = -86.0f; x <= 0.0f; x += 0.0137f) {
    const double want = std::exp(double(x));
    EXPECT_NEAR(backend::sampling_exp(x), want, want * 3e-7) << x;
  }
  EXPECT_EQ(backend::sampling_exp(0.0f), 1.0f);
  EXPECT_EQ(backend::sampling_exp(-0.0f), 1.0f);
  EXPECT_EQ(backend::sampling_exp(-87.0f), 0.0f);
  EXPECT_EQ(backend::sampling_exp(-INFINITY), 0.0f);
  EXPECT_EQ(backend::sampling_weight(INFINITY, INFINITY, 0.7f), 1.0f);
  EXPECT_EQ(backend::sampling_weight(3.0f, INFINITY, 0.7f), 0.0f);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p, 3);
  // Token 0 (logit 3) halves to 1.5 < 2, so token 1 wins; token 2 (negative) is pushed further.
  const std::vector<float> logits = {3.0f, 2.0f, -1.0f};
  const std::vector<int32_t> history = {0, 2};
  EXPECT_EQ(s.sample(logits, history), 1);
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountOccurrences) {
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  Sampler s(p, 2);
  const std::vector<float> logits = {1.0f, 0.2f};
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0}), 0);     // 1.0 - 0.5 = 0.5 > 0.2
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, 0}), 1);  // 1.0 - 1.0 = 0.0 < 0.2
  SamplingParams q;
  q.presence_penalty = 0.9f;
  Sampler t(q, 2);
  EXPECT_EQ(t.sample(logits, std::vector<int32_t>{0, 0, 0}), 1);  // once: 0.1 < 0.2
}

TEST(Sampler, PenaltyWindowLimitsHistory) {
  SamplingParams p;
  p.presence_penalty = 2.0f;
  p.penalty_last_n = 1;
  Sampler s(p, 2);
  const std::vector<float> logits = {1.0f, 0.5f};
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, 1}), 0);  // token 0 is outside the window
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p, 50), b(p, 50);
  const auto logits = ramp(50);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits, {}), b.sample(logits, {}));
}

TEST(Sampler, TopKRestrictsToBestK) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 3;
  p.seed = 7;
  Sampler s(p, 50);
  const auto logits = ramp(50);
  for (int i = 0; i < 500; ++i) EXPECT_GE(s.sample(logits, {}), 47);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.5f;
  p.seed = 3;
  Sampler s(p, 4);
  // Probabilities ~ {0.6, 0.3, 0.07, 0.03}: the nucleus for 0.5 is token 0 alone.
  const std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.07f),
                                     std::log(0.03f)};
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.sample(logits, {}), 0);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.4f;
  p.seed = 5;
  Sampler s(p, 3);
  // p = {5/9, 3/9, 1/9}: the floor 0.4 * 5/9 = 2/9 keeps tokens 0 and 1 and drops token 2.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.1f)};
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[s.sample(logits, {})];
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_GT(seen[0], seen[1]);
  EXPECT_GT(seen[1], 0);
}

TEST(Sampler, TemperatureSamplingFollowsDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 11;
  Sampler s(p, 2);
  const std::vector<float> logits = {std::log(0.75f), std::log(0.25f)};
  int zeros = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) zeros += s.sample(logits, {}) == 0;
  EXPECT_NEAR(double(zeros) / n, 0.75, 0.02);
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.min_p = 2.0f;
  EXPECT_THROW(Sampler(p, 10), Error);
  Sampler ok({}, 10);
  EXPECT_THROW(ok.sample(std::vector<float>(9), {}), Error);
}

TEST(StopMatcher, HoldsBackPossiblePrefixes) {
  StopMatcher m({"</s>", "STOP"});
  EXPECT_EQ(m.feed("hello <"), "hello ");
  EXPECT_EQ(m.feed("/"), "");
  EXPECT_EQ(m.feed("x"), "</x");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.feed(" ST"), " ");
  EXPECT_EQ(m.feed("OP and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(m.feed("ignored"), "");
}

TEST(StopMatcher, EarliestStopWinsAndFlushReturnsRest) {
  StopMatcher m({"bc", "abcd"});
  EXPECT_EQ(m.feed("xab"), "x");
  EXPECT_EQ(m.feed("cd"), "");  // "abcd" starts at 0, before "bc" at 1
  EXPECT_EQ(m.matched(), "abcd");
  StopMatcher n({"zz"});
  EXPECT_EQ(n.feed("abz"), "ab");
  EXPECT_EQ(n.flush(), "z");
  EXPECT_THROW(StopMatcher({""}), Error);
}

}  // namespace
}  // namespace strata::decode
