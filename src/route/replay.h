// Closed-loop replay of a routing trace through simulated per-layer expert caches (`strata
// replay`): for each budget and policy the hit rate, misses and bytes read per token, and for
// cache-conditional routing (which changes the routes, which changes the cache: hence closed loop)
// its telemetry and the routed relative MSE. Deterministic: no clocks, no threads.
//
// The trace's first warmup rows stand for earlier sessions: they build the usage history (and the
// expert profile unless one is given); the policies are measured on the remaining rows, one token
// per window (decode). Policies, per budget of `slots` experts per layer:
//   lru      cold start, plain LRU
//   pinned   the profile's top pin_fraction * slots pinned, the other slots LRU filled from the
//            profile's next entries
//   blend    LRU filled at start from blend(profile, history)
//   ccr M=m  blend, plus cache-conditional routing (r_prot, lambda, ROUTE_M = m) over the trace's
//            router candidates
// Routed relative MSE (ccr rows): every (layer, expert) gets a fixed random output vector v (dim
// mse_dim, normal entries from mse_seed); per (row, layer) the routed output is sum_j w_j v_{e_j}.
// rel_mse = sum ||y_ccr - y_exact||^2 / sum ||y_exact||^2 over all measured rows and layers, where
// y_exact routes the same candidates with cache-conditional routing off.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "route/profile.h"
#include "route/trace.h"
#include "route/usage_history.h"

namespace strata::route {

struct ReplayOptions {
  std::vector<int> slots = {32, 64, 128};  // per layer
  uint64_t expert_bytes = 0;               // one expert record; 0 = bytes per token not reported
  int64_t warmup_rows = -1;                // -1 = min(1024, rows / 4)
  double half_life = 4096.0;               // of the history built from the warm-up rows
  double pin_fraction = 0.5;
  std::vector<int> ccr_m = {16, 24, 32};
  int r_prot = 3;
  float lambda = 0.85f;
  int64_t head_tokens = 64;  // also report the hit rate of the first this many measured tokens (start-up)
  int mse_dim = 64;
  uint64_t mse_seed = 1;
};

struct ReplayResult {
  std::string policy;
  int slots = 0;
  int route_m = 0;  // ccr rows only
  double hit_rate = 0.0;
  double head_hit_rate = 0.0;
  double misses_per_token = 0.0;
  double bytes_per_token = 0.0;
  // ccr rows only
  double substitution_rate = 0.0;
  double agreement = 1.0;
  double kl = 0.0;
  double rel_mse = 0.0;
};

struct ReplayReport {
  std::string model;
  int n_layers = 0, n_experts = 0, top_k = 0, top_m = 0;
  int64_t warmup_rows = 0, measured_rows = 0;
  std::string profile_source, history_source;
  uint64_t expert_bytes = 0;
  std::vector<ReplayResult> results;
  std::string note;  // e.g. why ccr rows are missing
};

// profile / history may be null (then built from the warm-up rows). Throws strata::Error on bad
// options (slots below top_k or above n_experts, ROUTE_M beyond the trace's candidates, ...).
ReplayReport replay(const TraceReader& trace, const ReplayOptions& options, const ExpertProfile* profile,
                    const UsageHistory* history);

std::string format_table(const ReplayReport& report);
nlohmann::json to_json(const ReplayReport& report);

// Cold per-layer LRU hit rate over the whole trace at each slot count (strata trace stats).
std::vector<double> trace_lru_hit_rates(const TraceReader& trace, const std::vector<int>& slots);

}  // namespace strata::route
