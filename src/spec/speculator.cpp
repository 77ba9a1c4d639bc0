#include "spec/speculator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "util/error.h"
#include "util/rng.h"

namespace strata::spec {

Mode parse_mode(const std::string& text) {
  if (text == "off") return Mode::Off;
  if (text == "mtp") return Mode::Mtp;
  if (text == "suffix") return Mode::Suffix;
  if (text == "auto") return Mode::Auto;
  fail("--spec: '", text, "' is not one of off, mtp, suffix, auto");
}

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Off: return "off";
    case Mode::Mtp: return "mtp";
    case Mode::Suffix: return "suffix";
    case Mode::Auto: return "auto";
  }
  return "?";
}

double Report::mean_accepted_per_window() const {
  return drafted_windows > 0 ? double(accepted) / double(drafted_windows) : 0.0;
}

double Report::mean_tokens_per_window() const {
  return windows > 0 ? double(tokens) / double(windows) : 0.0;
}

double Report::acceptance(int position) const {
  int64_t j = 0, h = 0;
  for (int s = 0; s < kSources; ++s) {
    j += judged[size_t(s)][size_t(position)];
    h += hits[size_t(s)][size_t(position)];
  }
  return j > 0 ? double(h) / double(j) : 0.0;
}

namespace {

// r's counters += sign * b's counters; gauges untouched.
void add_counters(Report& r, const Report& b, int64_t sign) {
  r.windows += sign * b.windows;
  r.drafted_windows += sign * b.drafted_windows;
  r.drafted += sign * b.drafted;
  r.accepted += sign * b.accepted;
  r.tokens += sign * b.tokens;
  for (int s = 0; s < kSources; ++s) {
    r.source_windows[size_t(s)] += sign * b.source_windows[size_t(s)];
    for (int j = 0; j <= kMaxDepth; ++j) {
      r.judged[size_t(s)][size_t(j)] += sign * b.judged[size_t(s)][size_t(j)];
      r.hits[size_t(s)][size_t(j)] += sign * b.hits[size_t(s)][size_t(j)];
    }
  }
  r.snapshot_seconds += double(sign) * b.snapshot_seconds;
  r.rollback_seconds += double(sign) * b.rollback_seconds;
  r.draft_seconds += double(sign) * b.draft_seconds;
  r.rollbacks += sign * b.rollbacks;
  r.probes += sign * b.probes;
}

}  // namespace

Report accumulate(const Report& a, const Report& b) {
  Report r = b;
  add_counters(r, a, 1);
  return r;
}

Report Report::since(const Report& b) const {
  Report r = *this;
  add_counters(r, b, -1);
  return r;
}

std::string format_report(const Report& r) {
  std::string out = cat("spec ", mode_name(r.mode), r.typical ? " (typical acceptance, not exact)" : "");
  if (r.mode == Mode::Off) return out;
  char buf[64];
  if (r.t1) {
    std::snprintf(buf, sizeof buf, ": T1 %.1f ms", *r.t1 * 1e3);
    out += buf;
    for (size_t i = 0; i < r.t_ratio.size(); ++i)
      if (r.t_ratio[i] > 0) {
        std::snprintf(buf, sizeof buf, " T%zu/T1 %.2f", i + 2, r.t_ratio[i]);
        out += buf;
      }
  } else {
    out += ": T1 -";
  }
  out += " | acc";
  int shown = 0;
  for (int j = 1; j <= kMaxDepth; ++j) {
    int64_t judged = 0;
    for (int s = 0; s < kSources; ++s) judged += r.judged[size_t(s)][size_t(j)];
    if (judged == 0) break;
    std::snprintf(buf, sizeof buf, " %.2f", r.acceptance(j));
    out += buf;
    ++shown;
  }
  if (shown == 0) out += " -";
  std::snprintf(buf, sizeof buf, " | %.2f tok/window, %.2f accepted/drafted window", r.mean_tokens_per_window(),
                r.mean_accepted_per_window());
  out += buf;
  out += cat(" | ", r.drafted_windows, "/", r.windows, " windows drafted (mtp ",
             r.source_windows[size_t(Source::Mtp)], ", suffix ", r.source_windows[size_t(Source::Suffix)], ")");
  std::snprintf(buf, sizeof buf, " | rollback %lld, %.2f ms/window", static_cast<long long>(r.rollbacks),
                r.drafted_windows > 0 ? (r.snapshot_seconds + r.rollback_seconds) * 1e3 / double(r.drafted_windows) : 0.0);
  out += buf;
  if (r.source_windows[size_t(Source::Mtp)] > 0) {
    std::snprintf(buf, sizeof buf, " | mtp draft %.2f ms/window",
                  r.draft_seconds * 1e3 / double(r.source_windows[size_t(Source::Mtp)]));
    out += buf;
  }
  return out;
}

Speculator::Speculator(model::Model& model, const Options& options, int64_t n_ctx,
                       model::DraftVocab vocab)
    : model_(model),
      o_(options),
      gate_(GateOptions{.max_depth = options.max_depth, .fixed_depth = options.depth}),
      draft_vocab_(vocab),
      journal_(model.backend()) {
  if (o_.mode == Mode::Mtp && model.config().n_mtp == 0)
    fail("--spec mtp: the model has no MTP block (nextn_predict_layers is 0)");
  if (o_.mtp_acceptance_knob < 0 || o_.mtp_acceptance_knob > 1)
    fail("--mtp-acceptance: ", o_.mtp_acceptance_knob, " is outside [0, 1]");
  counts_.mode = o_.mode;
  counts_.typical = o_.typical;
  if ((o_.mode == Mode::Mtp || o_.mode == Mode::Auto) && model.has_mtp())
    mtp_ = std::make_unique<MtpDrafter>(model, n_ctx, vocab);
}

void Speculator::observe(int64_t first, std::span<const float> hidden) {
  if (mtp_) mtp_->observe(first, hidden);
}

Speculator::~Speculator() = default;

void Speculator::start(std::span<const int32_t> history) {
  suffix_.reset();
  suffix_.append(history);
}

Speculator::Draft Speculator::plan(std::span<const int32_t> history, int limit,
                                   std::span<const int32_t> forced_next) {
  using Clock = std::chrono::steady_clock;
  Draft d;
  limit = std::min(limit, kMaxDepth);
  if (!enabled() || limit <= 0) return d;
  if (external_) {
    std::vector<int32_t> proposal = external_(history, limit);
    if (int64_t(proposal.size()) > limit) proposal.resize(size_t(limit));
    proposal.resize(size_t(counted_pick(Source::Suffix, int(proposal.size())).depth));
    d.tokens = std::move(proposal);
    return d;
  }
  // The suffix drafter's proposal costs nothing to look at; the MTP head's costs a catch-up
  // window and a step per draft, so auto mode weighs the sources by SpecGate's estimates first.
  std::vector<int32_t> proposal;
  if (o_.mode == Mode::Suffix || o_.mode == Mode::Auto) proposal = suffix_.propose(limit);
  // (With no suffix proposal the MTP source's own pick decides, probes included, so a head that
  // stopped paying is still retried now and then.)
  const bool use_mtp = mtp_ && (o_.mode == Mode::Mtp || proposal.empty() ||
                                gate_.choose(limit, int(proposal.size())) == Source::Mtp);
  if (!use_mtp) {
    proposal.resize(size_t(counted_pick(Source::Suffix, int(proposal.size())).depth));
    d.tokens = std::move(proposal);
    return d;
  }
  d.source = Source::Mtp;
  const Pick pick = counted_pick(Source::Mtp, limit);
  const int k = pick.depth;
  if (k == 0) return d;
  const auto t0 = Clock::now();
  MtpDrafter::Drafts m = mtp_->draft(history, k);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  counts_.draft_seconds += seconds;
  // d: the time per drafted token; the catch-up rows (the head's cache brought up to the window,
  // one row per token since the head last drafted) are timed per row.
  gate_.drafted(Source::Mtp, int(m.tokens.size()), seconds - m.catch_up_seconds, m.catch_up_seconds,
                m.catch_up_rows);
  if (o_.mtp_acceptance_knob > 0 && !forced_next.empty()) {
    // Benchmark knob: the head's drafts replaced by the text's next tokens, each right with the
    // knob's probability given the ones before it were (its compute still ran above), and never
    // when the text's token is outside the head's draft vocabulary.
    const int64_t vocab = model_.config().n_vocab;
    bool right = true;
    for (size_t j = 0; j < m.tokens.size(); ++j) {
      const int32_t truth = j < forced_next.size() ? forced_next[j] : 0;
      right = right && counter_uniform(o_.knob_seed, knob_draws_++) < o_.mtp_acceptance_knob &&
              draft_vocab_.contains(truth);
      m.tokens[j] = right ? truth : int32_t((truth + 1 + int64_t(j)) % vocab);
      m.probs[j] = float(o_.mtp_acceptance_knob);
    }
  }
  // A probe keeps its depth: trimmed to the current best, it would never measure a deeper window.
  const size_t keep = pick.probe ? m.tokens.size() : size_t(gate_.trim(Source::Mtp, m.probs));
  m.tokens.resize(std::min(keep, m.tokens.size()));
  m.probs.resize(m.tokens.size());
  d.tokens = std::move(m.tokens);
  d.probs = std::move(m.probs);
  return d;
}

Pick Speculator::counted_pick(Source s, int available) {
  const Pick pick = gate_.pick(s, available);
  if (pick.probe && pick.depth > 0) ++counts_.probes;
  return pick;
}

void Speculator::window_starts() {
  if (!enabled()) return;
  warming_at_start_ = model_.backend().counters().warming_windows;
  layout_at_start_ = journal_.layout();
}

bool Speculator::window_paid_one_time_costs() const {
  return enabled() && (model_.backend().counters().warming_windows != warming_at_start_ ||
                       journal_.layout() != layout_at_start_);
}

void Speculator::window_done(const Draft& draft, int rows, int kept, int judged, int accepted,
                             std::optional<double> seconds) {
  if (seconds) gate_.window_done(rows, *seconds);
  ++counts_.windows;
  counts_.tokens += kept;
  if (draft.tokens.empty()) return;
  gate_.verified(draft.source, judged, accepted, draft.probs);
  ++counts_.drafted_windows;
  ++counts_.source_windows[size_t(draft.source)];
  counts_.drafted += judged;
  counts_.accepted += accepted;
  for (int j = 1; j <= std::min(judged, accepted + 1); ++j) {
    ++counts_.judged[size_t(draft.source)][size_t(j)];
    if (j <= accepted) ++counts_.hits[size_t(draft.source)][size_t(j)];
  }
}

Report Speculator::report() const {
  Report r = counts_;
  r.t1 = gate_.window_seconds(1);
  for (int n = 2; n <= kMaxDepth + 1; ++n)
    r.t_ratio.push_back(r.t1 && gate_.measured(n) ? *gate_.window_seconds(n) / *r.t1 : 0.0);
  while (!r.t_ratio.empty() && r.t_ratio.back() == 0) r.t_ratio.pop_back();
  r.snapshot_seconds = journal_.snapshot_seconds();
  r.rollback_seconds = journal_.rollback_seconds();
  r.rollbacks = journal_.rollbacks();
  for (int s = 0; s < kSources; ++s) {
    for (int j = 1; j <= kMaxDepth; ++j) r.estimated[size_t(s)][size_t(j)] = gate_.acceptance(Source(s), j);
    r.best_value[size_t(s)] = gate_.best_value(Source(s), kMaxDepth);
  }
  return r;
}

}  // namespace strata::spec
