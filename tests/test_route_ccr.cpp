// Cache-conditional routing: off is bitwise the plain top-k; protected ranks never change; only the
// true top-M can be substituted in; weights are the true probabilities renormalized over the chosen
// set; the KL and telemetry match direct computations on a hand example.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/ops_moe.h"
#include "route/ccr.h"
#include "route/trace.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::route {
namespace {

std::vector<float> random_logits(Rng& rng, int n, float scale) {
  std::vector<float> z(static_cast<size_t>(n));
  for (float& v : z) v = scale * rng.normal();
  return z;
}

std::vector<uint8_t> random_residency(Rng& rng, int n, float share) {
  std::vector<uint8_t> r(static_cast<size_t>(n));
  for (auto& v : r) v = rng.uniform() < share;
  return r;
}

// True ranks of the experts by probability (as the plain router orders them).
std::vector<int> true_rank(const std::vector<float>& z) {
  const RowRouting all = route_row(z, int(z.size()), false, CcrParams{}, {});
  std::vector<int> rank(z.size());
  for (size_t j = 0; j < all.experts.size(); ++j) rank[size_t(all.experts[j])] = int(j);
  return rank;
}

TEST(RouteCcr, OffIsBitwiseThePlainTopK) {
  Rng rng(7);
  constexpr int n = 64, k = 8, rows = 50;
  for (bool renorm : {true, false}) {
    std::vector<float> logits;
    for (int r = 0; r < rows; ++r) {
      auto z = random_logits(rng, n, 1.5f);
      if (r % 5 == 0) z[3] = z[9];  // a tie, broken to the lower id
      logits.insert(logits.end(), z.begin(), z.end());
    }
    const backend::Tensor t{logits.data(), rows, n, n};
    const auto plain = cpu::route_softmax_topk(t, k, renorm);
    CcrStats stats;
    const auto window = route_window(logits.data(), rows, n, n, k, renorm, CcrParams{}, {}, &stats);
    EXPECT_EQ(window.top_k, k);
    ASSERT_EQ(window.experts, plain.experts);
    ASSERT_EQ(0, std::memcmp(window.weights.data(), plain.weights.data(), plain.weights.size() * sizeof(float)));
    EXPECT_EQ(stats.rows, rows);
    EXPECT_EQ(stats.substitution_rate(), 0.0);
    for (int r = 0; r < rows; ++r) {
      const std::span<const float> row(logits.data() + r * n, n);
      // Off, and on with no resident expert: both exactly the plain routing.
      for (const auto& [params, res] : {std::pair{CcrParams{}, std::vector<uint8_t>{}},
                                        std::pair{CcrParams{true, 3, 0.85f, 16}, std::vector<uint8_t>(n, 0)}}) {
        const RowRouting got = route_row(row, k, renorm, params, res);
        ASSERT_EQ(0, std::memcmp(got.experts.data(), plain.experts.data() + r * k, k * sizeof(int32_t)));
        ASSERT_EQ(0, std::memcmp(got.weights.data(), plain.weights.data() + r * k, k * sizeof(float)));
        EXPECT_FALSE(got.substituted);
        EXPECT_EQ(got.kept, k);
        EXPECT_EQ(got.kl, 0.0);
      }
    }
  }
}

TEST(RouteCcr, ProtectedRanksKeptOnlyTopMSubstitutedWeightsRenormalized) {
  Rng rng(11);
  constexpr int n = 128, k = 10;
  int substitutions = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const auto z = random_logits(rng, n, 0.4f);
    const auto resident = random_residency(rng, n, 0.3f);
    const CcrParams params{true, 1 + trial % 4, 0.85f, k + trial % 20};
    const RowRouting got = route_row(z, k, true, params, resident);
    const auto rank = true_rank(z);
    ASSERT_EQ(got.experts.size(), size_t(k));
    for (int j = 0; j < params.r_prot; ++j) EXPECT_EQ(rank[size_t(got.experts[size_t(j)])], j);
    double sum = 0.0, denom = 0.0;
    for (int j = 0; j < k; ++j) {
      const int32_t e = got.experts[size_t(j)];
      EXPECT_LT(rank[size_t(e)], params.m) << "only the true top-M may be chosen";
      if (j > 0) {
        EXPECT_LT(rank[size_t(got.experts[size_t(j - 1)])], rank[size_t(e)]) << "true rank order";
      }
      if (rank[size_t(e)] >= k) {
        EXPECT_TRUE(resident[size_t(e)]) << "a substitute is resident";
      }
      sum += got.weights[size_t(j)];
      denom += std::exp(double(z[size_t(e)]));
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
    for (int j = 0; j < k; ++j)
      EXPECT_NEAR(got.weights[size_t(j)], std::exp(double(z[size_t(got.experts[size_t(j)])])) / denom, 1e-5);
    substitutions += got.substituted;
  }
  EXPECT_GT(substitutions, 50);  // the property checks above did see substitutions
}

TEST(RouteCcr, HandExample) {
  // Ranks: 0:e0 3.0, 1:e1 2.0, 2:e2 1.9, 3:e3 1.5, 4:e4 1.4, 5:e5 0. Residents e3 and e4.
  const std::vector<float> z = {3.0f, 2.0f, 1.9f, 1.5f, 1.4f, 0.0f};
  const std::vector<uint8_t> resident = {0, 0, 0, 1, 1, 0};
  const CcrParams params{true, 1, 0.85f, 4};
  const RowRouting got = route_row(z, 3, true, params, resident);
  // e3 (1.5 + 0.85 = 2.35) beats e1 (2.0) and e2 (1.9); e4 is resident but ranks outside the top-4.
  EXPECT_EQ(got.experts, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_TRUE(got.substituted);
  EXPECT_EQ(got.kept, 2);
  const double s = std::exp(3.0) + std::exp(2.0) + std::exp(1.5);
  EXPECT_NEAR(got.weights[2], std::exp(1.5) / s, 1e-6);
  // KL(P || Q) over the top-4, Q with the bonus on e3.
  double p[4], q[4], ps = 0, qs = 0;
  for (int i = 0; i < 4; ++i) {
    p[i] = std::exp(double(z[size_t(i)]));
    q[i] = p[i] * (i == 3 ? std::exp(double(0.85f)) : 1.0);
    ps += p[i];
    qs += q[i];
  }
  double kl = 0;
  for (int i = 0; i < 4; ++i) kl += p[i] / ps * std::log((p[i] / ps) / (q[i] / qs));
  EXPECT_NEAR(got.kl, kl, 1e-9);
  // The same row through its top-M candidates gives the same choice.
  const auto top = router_top_m(z.data(), 1, 6, 6, 5);
  const RowRouting via = route_row_top_m(top.ids, top.logits, top.lse[0], 3, true, params, resident);
  EXPECT_EQ(via.experts, got.experts);
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(via.weights[size_t(j)], got.weights[size_t(j)], 1e-6);
  EXPECT_NEAR(via.kl, got.kl, 1e-9);
  // r_prot 3 protects all three places: nothing changes.
  const RowRouting prot = route_row(z, 3, true, CcrParams{true, 3, 0.85f, 4}, resident);
  EXPECT_EQ(prot.experts, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(prot.substituted);

  CcrStats stats;
  stats.add(got);
  stats.add(prot);
  EXPECT_DOUBLE_EQ(stats.substitution_rate(), 0.5);
  EXPECT_DOUBLE_EQ(stats.agreement(), 5.0 / 6.0);
  EXPECT_NEAR(prot.kl, got.kl, 1e-12);  // the bonus bent the distribution the same way
  EXPECT_NEAR(stats.mean_kl(), (got.kl + prot.kl) / 2, 1e-12);
}

TEST(RouteCcr, TopMFormMatchesFullLogits) {
  Rng rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const auto z = random_logits(rng, 96, 0.5f);
    const auto resident = random_residency(rng, 96, 0.4f);
    const auto top = router_top_m(z.data(), 1, 96, 96, 24);
    for (const CcrParams& params : {CcrParams{}, CcrParams{true, 3, 0.85f, 16}, CcrParams{true, 2, 0.5f, 24}}) {
      const RowRouting full = route_row(z, 8, false, params, resident);
      const RowRouting part = route_row_top_m(top.ids, top.logits, top.lse[0], 8, false, params, resident);
      ASSERT_EQ(full.experts, part.experts);
      for (int j = 0; j < 8; ++j) EXPECT_NEAR(full.weights[size_t(j)], part.weights[size_t(j)], 1e-6);
    }
  }
}

TEST(RouteCcr, RejectsBadParameters) {
  const std::vector<float> z(16, 0.0f);
  const std::vector<uint8_t> res(16, 0);
  const auto error_of = [&](const CcrParams& p, int k, std::span<const uint8_t> r) {
    try {
      route_row(z, k, true, p, r);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of(CcrParams{true, 3, 0.85f, 4}, 8, res).find("ROUTE_M 4"), std::string::npos);
  EXPECT_NE(error_of(CcrParams{true, 3, 0.85f, 17}, 8, res).find("ROUTE_M 17"), std::string::npos);
  EXPECT_NE(error_of(CcrParams{true, 3, -1.0f, 8}, 8, res).find("lambda"), std::string::npos);
  EXPECT_NE(error_of(CcrParams{}, 0, {}).find("top_k 0"), std::string::npos);
  EXPECT_NE(error_of(CcrParams{true, 3, 0.85f, 8}, 8, std::span(res).first(4)).find("residency covers 4"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::route
