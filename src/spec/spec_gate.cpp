#include "spec/spec_gate.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace strata::spec {

namespace {
constexpr int64_t kAcceptanceMemory = 16;
// Verifications' worth of the prior in a source's pooled acceptance, and of the pooled rate in a
// position's estimate.
constexpr double kPriorWeight = 2;
constexpr int64_t kTimeMemory = 8;
constexpr int64_t kProbeEvery = 16, kProbeEveryUnmeasured = 4, kProbeEveryHopeless = 64, kWellMeasured = 3;
// The share of decode time that probes of windows which cannot pay may cost.
constexpr double kHopelessProbeShare = 0.01;
constexpr int kPlainAfter = 64;
}  // namespace

const char* source_name(Source s) { return s == Source::Mtp ? "mtp" : "suffix"; }

SpecGate::SpecGate(const GateOptions& options) : o_(options) {
  if (o_.max_depth < 0 || o_.max_depth > kMaxDepth)
    fail("spec: the depth limit ", o_.max_depth, " is outside 0..", kMaxDepth);
  if (o_.fixed_depth && (*o_.fixed_depth < 0 || *o_.fixed_depth > kMaxDepth))
    fail("--spec-depth: ", *o_.fixed_depth, " is outside 0..", kMaxDepth);
}

double SpecGate::rho() const { return rho_.count > 0 ? rho_.value : o_.prior_rho; }

std::optional<double> SpecGate::window_seconds(int rows) const {
  if (rows < 1 || rows > kMaxDepth + 1 || t_[1].count == 0) return std::nullopt;
  if (t_[size_t(rows)].count > 0) return t_[size_t(rows)].value;
  return t_[1].value * (1.0 + rho() * double(rows - 1));
}

double SpecGate::pooled_acceptance(Source s) const {
  double sum = 0, n = 0;
  for (int j = 1; j <= kMaxDepth; ++j) {
    const Ema& e = acc_[size_t(s)][size_t(j)];
    const double w = double(std::min(e.count, kAcceptanceMemory));
    sum += e.value * w;
    n += w;
  }
  return (sum + o_.prior_acceptance * kPriorWeight) / (n + kPriorWeight);
}

double SpecGate::acceptance(Source s, int j) const {
  // A position's few verifications are a noisy estimate: they count as what they are worth
  // against the source's pooled rate (kPriorWeight verifications' worth), so one early rejection
  // does not read as "never accepted" and turn drafting off for a long while, and a deep position
  // (judged only when the ones before it stood) does not swing the pick on a handful of draws.
  const Ema& e = acc_[size_t(s)][size_t(j)];
  const double w = double(std::min(e.count, kAcceptanceMemory));
  return (e.value * w + pooled_acceptance(s) * kPriorWeight) / (w + kPriorWeight);
}

int64_t SpecGate::judged(Source s, int j) const { return acc_[size_t(s)][size_t(j)].count; }

double SpecGate::a(Source s, int j, std::span<const float> probs) const {
  const double measured = acceptance(s, j);
  if (size_t(j) > probs.size()) return measured;
  const Ema& p = prob_[size_t(s)][size_t(j)];
  // The drafter's probability, calibrated by how its past probabilities at this position
  // turned into acceptances.
  const double scale = p.count > 0 && p.value > 0 ? measured / p.value : 1.0;
  return std::clamp(double(probs[size_t(j - 1)]) * scale, 0.0, 1.0);
}

double SpecGate::expected_tokens(Source s, int k, std::span<const float> probs) const {
  double expected = 1, run = 1;
  for (int j = 1; j <= k; ++j) expected += run *= a(s, j, probs);
  return expected;
}

double SpecGate::drafting_seconds(Source s, int k, std::span<const float> probs) const {
  const Ema& d = d_[size_t(s)];
  const Ema& c = c_[size_t(s)];
  const double catch_up = c.count > 0 ? c.value * (expected_tokens(s, k, probs) - 1.0) : 0.0;
  return catch_up + double(k) * (d.count > 0 ? d.value : 0.0);
}

double SpecGate::value(Source s, int k, std::span<const float> probs) const {
  if (k <= 0) return 1.0;
  const auto t1 = window_seconds(1), tk = window_seconds(k + 1);
  if (!t1 || *t1 <= 0) return 0.0;
  const double cost = (*tk + drafting_seconds(s, k, probs)) / *t1;
  return cost > 0 ? expected_tokens(s, k, probs) / cost : 0.0;
}

double SpecGate::optimistic_value(Source s, int k, std::span<const float> probs, bool drafting) const {
  if (k <= 0) return 1.0;
  const auto t1 = window_seconds(1);
  if (!t1 || *t1 <= 0) return 0.0;
  // A window costs at least what the widest timed window no wider than it cost.
  double floor = *t1;
  for (int n = 2; n <= std::min(k + 1, kMaxDepth + 1); ++n)
    if (t_[size_t(n)].count > 0) floor = std::max(floor, t_[size_t(n)].value);
  return expected_tokens(s, k, probs) / ((floor + (drafting ? drafting_seconds(s, k, probs) : 0.0)) / *t1);
}

int SpecGate::best(Source s, int available, std::span<const float> probs, double* value_out) const {
  int k_best = 0;
  double v_best = 1.0;
  for (int k = 1; k <= std::min(available, o_.max_depth); ++k) {
    const double v = value(s, k, probs);
    if (v > v_best) {
      v_best = v;
      k_best = k;
    }
  }
  if (value_out) *value_out = v_best;
  return k_best;
}

double SpecGate::best_value(Source s, int available) const {
  double v = 1.0;
  best(s, std::clamp(available, 0, kMaxDepth), {}, &v);
  return v;
}

Source SpecGate::choose(int mtp_available, int suffix_available) const {
  const double mtp = best_value(Source::Mtp, mtp_available), suffix = best_value(Source::Suffix, suffix_available);
  if (mtp != suffix) return mtp > suffix ? Source::Mtp : Source::Suffix;
  return judged(Source::Mtp, 1) <= judged(Source::Suffix, 1) ? Source::Mtp : Source::Suffix;
}

Pick SpecGate::pick(Source s, int available, std::span<const float> probs) {
  available = std::clamp(available, 0, kMaxDepth);
  Pick p;
  if (o_.fixed_depth) {
    p.depth = std::min(*o_.fixed_depth, available);
    p.value = value(s, p.depth, probs);
    return p;
  }
  if (available == 0 || o_.max_depth == 0) return p;
  ++picks_;
  // T(1) first, from a few windows: every value is weighed against it, and one noisy sample
  // can make drafting look free.
  if (t_[1].count < kWellMeasured || drafted_in_a_row_ >= kPlainAfter) {
    p.forced_plain = drafted_in_a_row_ >= kPlainAfter;
    drafted_in_a_row_ = 0;
    return p;
  }
  p.depth = best(s, available, probs, &p.value);
  const int deepest = std::min(available, o_.max_depth);
  // Probe the shallowest deeper window that is not yet well timed and could pay even at the
  // best cost the timings allow (its window's time is what the probe finds out); with none, one
  // past the pick, rarely where even that bound, with the drafts' measured time, says it cannot
  // pay (each such probe is a wasted window and its drafts).
  int deeper = 0;
  int64_t period = kProbeEveryUnmeasured;
  for (int k = p.depth + 1; k <= deepest && deeper == 0; ++k)
    if (t_[size_t(k + 1)].count < kWellMeasured && optimistic_value(s, k, probs) > 1.0) deeper = k;
  if (deeper == 0) {
    deeper = p.depth + 1;
    period = kProbeEvery;
    if (optimistic_value(s, deeper, probs, true) <= 1.0) {
      // At worst such a probe costs its window and drafts less the token it yields anyway.
      const auto t1 = window_seconds(1), t = window_seconds(deeper + 1);
      const double loss = t1 && t ? (*t + drafting_seconds(s, deeper, probs)) / *t1 - 1.0 : 1.0;
      period = std::max(kProbeEveryHopeless, int64_t(std::ceil(loss / kHopelessProbeShare)));
    }
  }
  if (deeper <= deepest && picks_ % period == 0) {
    p.depth = deeper;
    p.value = value(s, deeper, probs);
    p.probe = true;
  }
  drafted_in_a_row_ = p.depth > 0 ? drafted_in_a_row_ + 1 : 0;
  return p;
}

int SpecGate::trim(Source s, std::span<const float> probs) const {
  if (o_.fixed_depth) return std::min<int>(*o_.fixed_depth, int(probs.size()));
  return best(s, int(probs.size()), probs, nullptr);
}

void SpecGate::window_done(int rows, double seconds) {
  if (rows < 1 || rows > kMaxDepth + 1 || !(seconds >= 0)) return;
  t_[size_t(rows)].add(seconds, kTimeMemory);
  if (rows > 1 && t_[1].count > 0 && t_[1].value > 0)
    rho_.add(std::max(0.0, (t_[size_t(rows)].value / t_[1].value - 1.0) / double(rows - 1)), kTimeMemory);
}

void SpecGate::verified(Source s, int drafted, int accepted, std::span<const float> probs) {
  drafted = std::min(drafted, kMaxDepth);
  for (int j = 1; j <= std::min(drafted, accepted + 1); ++j) {
    acc_[size_t(s)][size_t(j)].add(j <= accepted ? 1.0 : 0.0, kAcceptanceMemory);
    if (size_t(j) <= probs.size()) prob_[size_t(s)][size_t(j)].add(probs[size_t(j - 1)], kAcceptanceMemory);
  }
}

void SpecGate::drafted(Source s, int tokens, double seconds, double catch_up_seconds,
                       int catch_up_rows) {
  if (tokens > 0 && seconds >= 0) d_[size_t(s)].add(seconds / double(tokens), kTimeMemory);
  if (tokens > 0 && catch_up_rows > 0 && catch_up_seconds >= 0)
    c_[size_t(s)].add(catch_up_seconds / double(catch_up_rows), kTimeMemory);
}

}  // namespace strata::spec
