#include "route/ccr.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/error.h"

namespace strata::route {

namespace {

void check_params(int top_k, int n_candidates, const CcrParams& p, const char* op) {
  if (top_k < 1 || top_k > n_candidates)
    fail(op, ": top_k ", top_k, " is outside 1..", n_candidates);
  if (!p.enabled) return;
  if (p.r_prot < 0) fail(op, ": r_prot ", p.r_prot, " is negative");
  if (p.m < top_k || p.m > n_candidates)
    fail(op, ": ROUTE_M ", p.m, " is outside top_k ", top_k, "..", n_candidates, " (candidates available)");
  if (!std::isfinite(p.lambda) || p.lambda < 0.0f) fail(op, ": lambda ", p.lambda, " is not a finite value >= 0");
}

// The shared selection over the true top-M, given in true rank order with their logits and
// probabilities. `m` is the candidate count actually used (top_k when off).
RowRouting select(std::span<const int32_t> ids, std::span<const float> z, std::span<const float> p, int top_k,
                  bool renormalize, const CcrParams& params, std::span<const uint8_t> resident,
                  const char* op) {
  RowRouting out;
  std::vector<int> chosen(static_cast<size_t>(top_k));  // true ranks
  std::iota(chosen.begin(), chosen.end(), 0);
  if (params.enabled) {
    const int m = params.m;
    const int protect = std::min(params.r_prot, top_k);
    std::vector<uint8_t> bonus(size_t(m), 0);
    for (int r = protect; r < m; ++r) {
      const int32_t e = ids[size_t(r)];
      if (size_t(e) >= resident.size())
        fail(op, ": residency covers ", resident.size(), " experts, candidate ", e, " is beyond it");
      bonus[size_t(r)] = resident[size_t(e)] != 0;
    }
    std::vector<int> open(static_cast<size_t>(m - protect));
    std::iota(open.begin(), open.end(), protect);
    const auto score = [&](int r) { return double(z[size_t(r)]) + (bonus[size_t(r)] ? double(params.lambda) : 0.0); };
    std::stable_sort(open.begin(), open.end(), [&](int a, int b) { return score(a) > score(b); });
    std::sort(open.begin(), open.begin() + (top_k - protect));
    std::copy(open.begin(), open.begin() + (top_k - protect), chosen.begin() + protect);

    // KL(P || Q) over the top-M: Q's log-normalizer shifts by log(sum P e^(lambda b)).
    double shift = 0.0, p_sum = 0.0;
    bool any_bonus = false;
    for (int r = 0; r < m; ++r) {
      const double pr = std::exp(double(z[size_t(r)]) - double(z[0]));
      p_sum += pr;
      shift += pr * (bonus[size_t(r)] ? std::exp(double(params.lambda)) : 1.0);
      any_bonus |= bonus[size_t(r)] != 0;
    }
    if (any_bonus && params.lambda > 0.0f) {
      const double log_ratio = std::log(shift / p_sum);  // log E_P[e^(lambda b)]
      double kl = 0.0;
      for (int r = 0; r < m; ++r) {
        const double pr = std::exp(double(z[size_t(r)]) - double(z[0])) / p_sum;
        kl += pr * (log_ratio - (bonus[size_t(r)] ? double(params.lambda) : 0.0));
      }
      out.kl = std::max(0.0, kl);
    }
  }
  out.experts.resize(size_t(top_k));
  out.weights.resize(size_t(top_k));
  float sum = 0.0f;
  for (int j = 0; j < top_k; ++j) sum += p[size_t(chosen[size_t(j)])];
  for (int j = 0; j < top_k; ++j) {
    const int r = chosen[size_t(j)];
    out.experts[size_t(j)] = ids[size_t(r)];
    out.weights[size_t(j)] = renormalize ? p[size_t(r)] / sum : p[size_t(r)];
    out.kept += r < top_k ? 1 : 0;
  }
  out.substituted = out.kept != top_k;
  return out;
}

}  // namespace

RowRouting route_row(std::span<const float> logits, int top_k, bool renormalize, const CcrParams& params,
                     std::span<const uint8_t> resident) {
  constexpr const char* op = "cache-conditional routing";
  const int n = int(logits.size());
  check_params(top_k, n, params, op);
  if (params.enabled && int(resident.size()) != n)
    fail(op, ": residency covers ", resident.size(), " experts, the router has ", n);
  // The probabilities and ranking exactly as cpu::route_softmax_topk computes them.
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<float> p_all(static_cast<size_t>(n));
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    p_all[size_t(i)] = std::exp(logits[size_t(i)] - mx);
    sum += p_all[size_t(i)];
  }
  for (int i = 0; i < n; ++i) p_all[size_t(i)] = p_all[size_t(i)] / sum;
  const int m = params.enabled ? params.m : top_k;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + m, ids.end(), [&](int32_t a, int32_t b) {
    return p_all[size_t(a)] > p_all[size_t(b)] || (p_all[size_t(a)] == p_all[size_t(b)] && a < b);
  });
  ids.resize(size_t(m));
  std::vector<float> z(static_cast<size_t>(m)), p(static_cast<size_t>(m));
  for (int r = 0; r < m; ++r) {
    z[size_t(r)] = logits[size_t(ids[size_t(r)])];
    p[size_t(r)] = p_all[size_t(ids[size_t(r)])];
  }
  return select(ids, z, p, top_k, renormalize, params, resident, op);
}

RowRouting route_row_top_m(std::span<const int32_t> ids, std::span<const float> logits, float lse, int top_k,
                           bool renormalize, const CcrParams& params, std::span<const uint8_t> resident) {
  constexpr const char* op = "cache-conditional routing (top-M)";
  if (ids.size() != logits.size()) fail(op, ": ", ids.size(), " candidate ids but ", logits.size(), " logits");
  check_params(top_k, int(ids.size()), params, op);
  const size_t m = size_t(params.enabled ? params.m : top_k);
  std::vector<float> p(m);
  for (size_t r = 0; r < m; ++r) p[r] = std::exp(logits[r] - lse);
  return select(ids.first(m), logits.first(m), p, top_k, renormalize, params, resident, op);
}

backend::Routing route_window(const float* logits, int64_t rows, int64_t n, int64_t stride, int top_k,
                              bool renormalize, const CcrParams& params, std::span<const uint8_t> resident,
                              CcrStats* stats) {
  backend::Routing out;
  out.top_k = top_k;
  out.experts.reserve(size_t(rows * top_k));
  out.weights.reserve(size_t(rows * top_k));
  for (int64_t r = 0; r < rows; ++r) {
    const RowRouting row =
        route_row({logits + r * stride, size_t(n)}, top_k, renormalize, params, resident);
    out.experts.insert(out.experts.end(), row.experts.begin(), row.experts.end());
    out.weights.insert(out.weights.end(), row.weights.begin(), row.weights.end());
    if (stats) stats->add(row);
  }
  return out;
}

}  // namespace strata::route
