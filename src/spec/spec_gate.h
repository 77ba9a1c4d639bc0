// SpecGate: how many drafted tokens the next decode window carries, chosen online from what
// windows actually cost and how often drafts are accepted (docs/DESIGN.md, "Speculative decoding").
// It only changes how many rows a window has, never a token.
//
// Per draft source and draft position j it keeps a_j = P(draft j accepted | drafts before it
// accepted) as an EMA over verifications (memory 16), shrunk towards the source's rate pooled over
// all positions (worth 2 verifications, itself shrunk towards the prior), so a position judged a
// few times is not read as its few draws; and per row count n the wall time T(n) of a window as
// an EMA (memory 8; unmeasured n are extrapolated from a fitted slope rho,
// T(n) ~ T(1) (1 + rho (n - 1))). Nothing is drafted before T(1) has 3 timings. For k drafts
//   E(k) = 1 + a1 + a1 a2 + ... + a1...ak     (tokens a window yields)
//   cost(k) = (T(k + 1) + c (E(k) - 1) + k d) / T(1)
//                                             (d: the source's drafting time per token, c: its
//                                              catch-up time per row)
// and the pick is k = argmax E(k) / cost(k), drafting only when that beats 1. (DESIGN.md's
// (k - 1) d assumes the first draft comes out of the verification window; here the MTP head runs
// after it, so every draft and the catch-up are paid apart. The catch-up is one head row per token
// the head has not seen, and a drafted window is followed by the E(k) tokens it kept, the first
// of which the next draft's own step takes: E(k) - 1 rows a window when drafting goes on. Timed
// per row, a catch-up after the head sat idle, up to 16 rows, is not charged to every window.)
// A probe now and
// then drafts deeper than the pick: every 4th pick the shallowest deeper window with fewer than 3
// timings that could pay at the best cost the timings allow (T(n) grows slower than a line on an
// expert-bound machine, so a slope fitted on T(2) alone would never let a deeper window be
// tried); else every 16th pick one past the pick, and where even that bound says it cannot pay,
// rarely enough that such probes cost at most 1% of the time (every 64th pick at least). After 64
// drafted windows in a row one plain window keeps T(1) measured. When the
// drafter reports its own probability p_j for a draft, a_j = p_j * (EMA of acceptance / EMA of
// p) at that position.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace strata::spec {

enum class Source : int { Mtp = 0, Suffix = 1 };
constexpr int kSources = 2;
constexpr int kMaxDepth = 8;  // drafts per window at most
const char* source_name(Source s);

// An EMA whose early values are plain means (weight grows to `memory`).
struct Ema {
  double value = 0;
  int64_t count = 0;
  void add(double x, int64_t memory) {
    ++count;
    value += (x - value) / double(std::min(count, memory));
  }
};

struct GateOptions {
  int max_depth = 4;              // the deepest window the gate may choose, in drafts
  std::optional<int> fixed_depth{};  // --spec-depth: always min(this, drafts offered)
  // Priors before anything is measured: acceptance per position and the slope rho.
  double prior_acceptance = 0.5;
  double prior_rho = 0.25;
};

struct Pick {
  int depth = 0;  // drafts for the next window; 0: a plain step
  double value = 1.0;  // E(k) / cost(k) of the pick
  bool probe = false;  // one deeper than the best, to keep estimates alive
  bool forced_plain = false;
};

class SpecGate {
 public:
  explicit SpecGate(const GateOptions& options);

  // The depth for source s, which can offer up to `available` drafts; `probs` are the drafter's
  // own probabilities for them when it has them (empty: unknown).
  Pick pick(Source s, int available, std::span<const float> probs = {});
  // The best depth <= drafts.size() once a drafter has produced its drafts with their
  // probabilities (no probing, no forced plain step): trims a chain that lost confidence.
  int trim(Source s, std::span<const float> probs) const;
  // The best E(k) / cost(k) source s could reach with `available` drafts (1 for none), without
  // counting a pick.
  double best_value(Source s, int available) const;
  // Auto mode's source for the next window: the one of higher best value; when they tie (neither
  // pays yet, both 1) the one with fewer verified first drafts, so both keep being probed and
  // measured (else a free suffix proposal would keep the MTP head from ever being tried).
  Source choose(int mtp_available, int suffix_available) const;
  // E(k) / cost(k) for source s (k = 0 gives 1).
  double value(Source s, int k, std::span<const float> probs = {}) const;
  // E(k) over the cost of the widest timed window of at most k + 1 rows, plus the drafts' own
  // time when `drafting`: what k drafts could be worth at best.
  double optimistic_value(Source s, int k, std::span<const float> probs = {}, bool drafting = false) const;

  // A window of `rows` rows took `seconds` (forward, plus rollback when it had drafts).
  void window_done(int rows, double seconds);
  // A verification judged `drafted` drafts of source s and accepted the first `accepted`.
  void verified(Source s, int drafted, int accepted, std::span<const float> probs = {});
  // Drafting `tokens` tokens from source s took `seconds`, besides `catch_up_seconds` for
  // `catch_up_rows` rows of bringing the drafter up to the window's position (the MTP head's
  // catch-up).
  void drafted(Source s, int tokens, double seconds, double catch_up_seconds = 0,
               int catch_up_rows = 0);

  // Measured or estimated T(rows) in seconds; empty before T(1) is measured.
  std::optional<double> window_seconds(int rows) const;
  bool measured(int rows) const { return rows >= 1 && rows <= kMaxDepth + 1 && t_[size_t(rows)].count > 0; }
  int64_t picks() const { return picks_; }
  double acceptance(Source s, int position) const;  // a_position, position 1..kMaxDepth
  int64_t judged(Source s, int position) const;
  double rho() const;

 private:
  double a(Source s, int j, std::span<const float> probs) const;
  // The acceptance over every position of source s, the prior counting as kPriorWeight draws.
  double pooled_acceptance(Source s) const;
  double expected_tokens(Source s, int k, std::span<const float> probs) const;  // E(k)
  double drafting_seconds(Source s, int k, std::span<const float> probs) const;  // c (E(k) - 1) + k d
  int best(Source s, int available, std::span<const float> probs, double* value) const;

  GateOptions o_;
  std::array<Ema, kMaxDepth + 2> t_{};  // T(n), n = 1..kMaxDepth + 1
  Ema rho_;
  std::array<std::array<Ema, kMaxDepth + 1>, kSources> acc_{}, prob_{};
  std::array<Ema, kSources> d_{}, c_{};
  int64_t picks_ = 0;
  int drafted_in_a_row_ = 0;
};

}  // namespace strata::spec
