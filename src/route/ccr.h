// Cache-conditional routing (MoCE, docs/DESIGN.md "Expert arena, tiers and I/O"): an opt-in quality knob
// that lets experts already in the cache win close calls. For one row of router logits:
//   - the true ranking is by softmax probability, ties to the lower id (as cpu::route_softmax_topk);
//   - ranks 0..r_prot-1 are kept exactly;
//   - the remaining top_k - r_prot places go to the best of true ranks r_prot..M-1 by the score
//     z + lambda * resident(e): resident experts get a logit bonus, but only inside the true top-M,
//     so an expert the router ranks below M can never be pulled in;
//   - the chosen experts are listed in true rank order and keep their true probabilities as
//     weights (renormalized over the chosen set when the model renormalizes), so the bonus changes
//     which experts run, never how much they count.
// With params.enabled == false the result is bitwise the plain top-k routing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace strata::route {

struct CcrStats;

struct CcrParams {
  bool enabled = false;
  int r_prot = 3;        // ranks below this are never replaced
  float lambda = 0.85f;  // logit bonus for resident experts
  int m = 16;            // ROUTE_M: only the true top-M may be substituted in
};

struct RowRouting {
  std::vector<int32_t> experts;  // top_k, in true rank order
  std::vector<float> weights;    // top_k
  bool substituted = false;      // the chosen set differs from the true top-k
  int kept = 0;                  // how many of the true top-k were chosen
  // KL(P || Q) over the true top-M candidates, P = softmax(z), Q = softmax(z + lambda * bonus)
  // where bonus marks the resident candidates at ranks >= r_prot: how far the bonus bent the
  // router's distribution (0 when off or no candidate got a bonus).
  double kl = 0.0;
};

// Full router logits of one row (n = logits.size() experts); resident[e] != 0 marks a cached
// expert (ignored when off; may be empty then). Throws strata::Error on bad arguments.
RowRouting route_row(std::span<const float> logits, int top_k, bool renormalize, const CcrParams& params,
                     std::span<const uint8_t> resident);

// The same from a routing trace's top-M candidates (ids sorted by logit, descending) and the row's
// log-sum-exp over all logits: probabilities are exp(z - lse). Requires params.m <= ids.size()
// when enabled.
RowRouting route_row_top_m(std::span<const int32_t> ids, std::span<const float> logits, float lse, int top_k,
                           bool renormalize, const CcrParams& params, std::span<const uint8_t> resident);

// A window of `rows` rows of n logits (row r at logits + r * stride) routed row by row as route_row
// does, against one residency snapshot (the cache as the window's handshake sees it), as the
// backend's Routing; each row is added to `stats` when given. This is the engine's entry point:
// with params.enabled == false it equals cpu::route_softmax_topk bitwise.
backend::Routing route_window(const float* logits, int64_t rows, int64_t n, int64_t stride, int top_k,
                              bool renormalize, const CcrParams& params, std::span<const uint8_t> resident,
                              CcrStats* stats = nullptr);

// Running telemetry over routed rows: substitution rate (rows whose set changed), agreement
// (fraction of the true top-k kept) and mean KL.
struct CcrStats {
  int64_t rows = 0;
  int64_t substituted = 0;
  int64_t kept = 0;
  int64_t routed = 0;
  double kl_sum = 0.0;

  void add(const RowRouting& r) {
    ++rows;
    substituted += r.substituted ? 1 : 0;
    kept += r.kept;
    routed += int64_t(r.experts.size());
    kl_sum += r.kl;
  }
  double substitution_rate() const { return rows ? double(substituted) / double(rows) : 0.0; }
  double agreement() const { return routed ? double(kept) / double(routed) : 1.0; }
  double mean_kl() const { return rows ? kl_sum / double(rows) : 0.0; }
};

}  // namespace strata::route
