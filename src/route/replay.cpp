#include "route/replay.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "route/cache_policy.h"
#include "route/ccr.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::route {

namespace {

enum class Policy { Lru, Pinned, Blend, Ccr };

struct Run {
  explicit Run(Policy p, int m = 0) : policy(p), route_m(m) {}
  Policy policy;
  int route_m;
  std::vector<LayerCache> caches;
  int64_t hits = 0, routes = 0, head_hits = 0, head_routes = 0;
  CcrStats stats;
  double err_sq = 0.0, ref_sq = 0.0;
};

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::Lru: return "lru";
    case Policy::Pinned: return "pinned";
    case Policy::Blend: return "blend";
    case Policy::Ccr: return "ccr";
  }
  return "?";
}

void check_options(const TraceReader& trace, const ReplayOptions& o, int64_t warm) {
  const auto& h = trace.header();
  if (o.slots.empty()) fail("replay: no budgets given");
  for (int s : o.slots)
    if (s < h.top_k || s > h.n_experts)
      fail("replay: ", s, " slots per layer is outside top_k ", h.top_k, "..", h.n_experts, " (n_experts)");
  if (!(o.pin_fraction >= 0.0 && o.pin_fraction <= 1.0)) fail("replay: pin fraction ", o.pin_fraction, " is outside 0..1");
  if (!(o.half_life > 0.0)) fail("replay: history half-life ", o.half_life, " must be > 0");
  if (o.mse_dim < 1 || o.mse_dim > 4096) fail("replay: MSE dimension ", o.mse_dim, " is outside 1..4096");
  if (o.head_tokens < 0) fail("replay: head tokens ", o.head_tokens, " is negative");
  if (o.r_prot < 0) fail("replay: r_prot ", o.r_prot, " is negative");
  if (!(o.lambda >= 0.0f && std::isfinite(o.lambda))) fail("replay: lambda ", o.lambda, " must be finite and >= 0");
  if (warm < 0 || warm >= trace.rows())
    fail("replay: ", warm, " warm-up rows leave none of the trace's ", trace.rows(), " rows to measure");
  if (h.top_m > 0)
    for (int m : o.ccr_m)
      if (m < h.top_k || m > h.top_m)
        fail("replay: ROUTE_M ", m, " is outside top_k ", h.top_k, "..", h.top_m, " (the trace's candidates)");
}

// Adds sum_j w_j v_{e_j} of one routing into y (dimension d), scaled by sign.
void mix_into(std::vector<double>& y, const std::vector<float>& vectors, int layer, int n_experts, int d,
              const RowRouting& r, double sign) {
  for (size_t j = 0; j < r.experts.size(); ++j) {
    const float* v = vectors.data() + (size_t(layer) * size_t(n_experts) + size_t(r.experts[j])) * size_t(d);
    const double w = sign * double(r.weights[j]);
    for (int i = 0; i < d; ++i) y[size_t(i)] += w * double(v[i]);
  }
}

}  // namespace

ReplayReport replay(const TraceReader& trace, const ReplayOptions& o, const ExpertProfile* given_profile,
                    const UsageHistory* given_history) {
  const auto& h = trace.header();
  const int64_t warm = o.warmup_rows < 0 ? std::min<int64_t>(1024, trace.rows() / 4) : o.warmup_rows;
  check_options(trace, o, warm);

  ReplayReport report;
  report.model = h.model;
  report.n_layers = h.n_layers;
  report.n_experts = h.n_experts;
  report.top_k = h.top_k;
  report.top_m = h.top_m;
  report.warmup_rows = warm;
  report.measured_rows = trace.rows() - warm;
  report.expert_bytes = o.expert_bytes;

  ExpertProfile profile = given_profile ? *given_profile : ExpertProfile::from_trace(trace, 0, warm);
  report.profile_source = given_profile ? cat("file (", profile.tokens(), " tokens)")
                                        : cat("trace rows [0, ", warm, ") (", warm, " tokens)");
  profile.expect_shape(h.n_layers, h.n_experts, "replay");
  UsageHistory history = given_history ? *given_history : UsageHistory(h.n_layers, h.n_experts, o.half_life, h.model);
  history.expect_shape(h.n_layers, h.n_experts, "replay");
  if (!given_history)
    for (int64_t r = 0; r < warm; ++r) {
      for (int l = 0; l < h.n_layers; ++l) history.observe(l, trace.experts(r, l));
      history.advance(1);
    }
  report.history_source = cat(given_history ? std::string("file") : cat("trace rows [0, ", warm, ")"), " (", history.tokens(),
                              " tokens, half-life ", history.half_life(), ", weight ",
                              history_weight(history.tokens()), ")");
  const auto fill = blend(profile, history, history.tokens());
  std::vector<std::vector<int32_t>> ranking;
  for (int l = 0; l < h.n_layers; ++l) ranking.push_back(profile.ranking(l));

  const bool with_ccr = h.top_m > 0 && !o.ccr_m.empty();
  if (!with_ccr && !o.ccr_m.empty()) report.note = "the trace has no router candidates: no ccr rows";
  std::vector<float> vectors;
  if (with_ccr) {
    Rng rng(o.mse_seed);
    vectors.resize(size_t(h.n_layers) * size_t(h.n_experts) * size_t(o.mse_dim));
    for (float& v : vectors) v = rng.normal();
  }

  for (int slots : o.slots) {
    std::vector<Run> runs;
    for (Policy p : {Policy::Lru, Policy::Pinned, Policy::Blend}) runs.emplace_back(p);
    if (with_ccr)
      for (int m : o.ccr_m) runs.emplace_back(Policy::Ccr, m);
    for (Run& run : runs)
      for (int l = 0; l < h.n_layers; ++l) {
        LayerCache cache(h.n_experts, slots);
        if (run.policy == Policy::Pinned) {
          const auto& rank = ranking[size_t(l)];
          const int want = int(o.pin_fraction * slots);
          cache.pin(std::span(rank).first(size_t(std::min<int>(want, h.n_experts))), h.top_k);
          cache.fill(rank);
        } else if (run.policy != Policy::Lru) {
          cache.fill(fill[size_t(l)]);
        }
        run.caches.push_back(std::move(cache));
      }

    std::vector<double> y(static_cast<size_t>(o.mse_dim));
    for (int64_t r = warm; r < trace.rows(); ++r) {
      const bool head = r - warm < o.head_tokens;
      for (int l = 0; l < h.n_layers; ++l) {
        RowRouting exact;
        if (with_ccr)
          exact = route_row_top_m(trace.candidates(r, l), trace.logits(r, l), trace.lse(r, l), h.top_k,
                                  h.renormalized, CcrParams{}, {});
        for (Run& run : runs) {
          LayerCache& cache = run.caches[size_t(l)];
          int hits;
          if (run.policy == Policy::Ccr) {
            const CcrParams params{true, o.r_prot, o.lambda, run.route_m};
            const RowRouting routed = route_row_top_m(trace.candidates(r, l), trace.logits(r, l), trace.lse(r, l),
                                                      h.top_k, h.renormalized, params, cache.residency());
            run.stats.add(routed);
            std::fill(y.begin(), y.end(), 0.0);
            mix_into(y, vectors, l, h.n_experts, o.mse_dim, exact, 1.0);
            for (double v : y) run.ref_sq += v * v;
            mix_into(y, vectors, l, h.n_experts, o.mse_dim, routed, -1.0);
            for (double v : y) run.err_sq += v * v;
            hits = cache.access(routed.experts);
          } else {
            hits = cache.access(trace.experts(r, l));
          }
          run.hits += hits;
          run.routes += h.top_k;
          if (head) {
            run.head_hits += hits;
            run.head_routes += h.top_k;
          }
        }
      }
    }
    for (const Run& run : runs) {
      ReplayResult res;
      res.policy = run.policy == Policy::Ccr ? cat("ccr M=", run.route_m) : policy_name(run.policy);
      res.slots = slots;
      res.route_m = run.route_m;
      res.hit_rate = double(run.hits) / double(run.routes);
      res.head_hit_rate = run.head_routes ? double(run.head_hits) / double(run.head_routes) : 0.0;
      res.misses_per_token = double(run.routes - run.hits) / double(report.measured_rows);
      res.bytes_per_token = res.misses_per_token * double(o.expert_bytes);
      if (run.policy == Policy::Ccr) {
        res.substitution_rate = run.stats.substitution_rate();
        res.agreement = run.stats.agreement();
        res.kl = run.stats.mean_kl();
        res.rel_mse = run.ref_sq > 0.0 ? run.err_sq / run.ref_sq : 0.0;
      }
      report.results.push_back(res);
    }
  }
  return report;
}

std::string format_table(const ReplayReport& r) {
  std::string out = cat("trace: ", r.model, "\n  ", r.n_layers, " layers x ", r.n_experts, " experts, top-", r.top_k,
                        ", router candidates top-", r.top_m, "; warm-up ", r.warmup_rows, " rows, measured ",
                        r.measured_rows, " rows (one token per window)\n  profile: ", r.profile_source,
                        "\n  history: ", r.history_source, "\n");
  if (!r.note.empty()) out += cat("  note: ", r.note, "\n");
  char line[256];
  std::snprintf(line, sizeof line, "%6s  %-9s %6s %6s %9s %9s %7s %7s %9s %9s\n", "slots", "policy", "hit%", "head%",
                "miss/tok", r.expert_bytes ? "MB/tok" : "-", "subst%", "agree%", "KL", "relMSE");
  out += line;
  for (const auto& x : r.results) {
    const bool ccr = x.route_m > 0;
    std::snprintf(line, sizeof line, "%6d  %-9s %6.1f %6.1f %9.2f ", x.slots, x.policy.c_str(), 100 * x.hit_rate,
                  100 * x.head_hit_rate, x.misses_per_token);
    out += line;
    if (r.expert_bytes)
      std::snprintf(line, sizeof line, "%9.2f ", x.bytes_per_token / 1e6);
    else
      std::snprintf(line, sizeof line, "%9s ", "-");
    out += line;
    if (ccr)
      std::snprintf(line, sizeof line, "%7.1f %7.1f %9.5f %9.5f\n", 100 * x.substitution_rate, 100 * x.agreement,
                    x.kl, x.rel_mse);
    else
      std::snprintf(line, sizeof line, "%7s %7s %9s %9s\n", "-", "-", "-", "-");
    out += line;
  }
  return out;
}

nlohmann::json to_json(const ReplayReport& r) {
  nlohmann::json j;
  j["model"] = r.model;
  j["n_layers"] = r.n_layers;
  j["n_experts"] = r.n_experts;
  j["top_k"] = r.top_k;
  j["top_m"] = r.top_m;
  j["warmup_rows"] = r.warmup_rows;
  j["measured_rows"] = r.measured_rows;
  j["profile"] = r.profile_source;
  j["history"] = r.history_source;
  j["expert_bytes"] = r.expert_bytes;
  if (!r.note.empty()) j["note"] = r.note;
  j["results"] = nlohmann::json::array();
  for (const auto& x : r.results) {
    nlohmann::json e{{"policy", x.policy},
                     {"slots", x.slots},
                     {"hit_rate", x.hit_rate},
                     {"head_hit_rate", x.head_hit_rate},
                     {"misses_per_token", x.misses_per_token}};
    if (r.expert_bytes) e["bytes_per_token"] = x.bytes_per_token;
    if (x.route_m > 0) {
      e["route_m"] = x.route_m;
      e["substitution_rate"] = x.substitution_rate;
      e["agreement"] = x.agreement;
      e["kl"] = x.kl;
      e["rel_mse"] = x.rel_mse;
    }
    j["results"].push_back(e);
  }
  return j;
}

std::vector<double> trace_lru_hit_rates(const TraceReader& trace, const std::vector<int>& slots) {
  const auto& h = trace.header();
  std::vector<double> rates;
  for (int s : slots) {
    if (s < h.top_k || s > h.n_experts) fail("trace stats: ", s, " slots is outside ", h.top_k, "..", h.n_experts);
    std::vector<LayerCache> caches;
    for (int l = 0; l < h.n_layers; ++l) caches.emplace_back(h.n_experts, s);
    int64_t hits = 0;
    for (int64_t r = 0; r < trace.rows(); ++r)
      for (int l = 0; l < h.n_layers; ++l) hits += caches[size_t(l)].access(trace.experts(r, l));
    rates.push_back(trace.rows() ? double(hits) / double(trace.rows() * h.n_layers * h.top_k) : 0.0);
  }
  return rates;
}

}  // namespace strata::route
