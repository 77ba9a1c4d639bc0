// Speculative decoding's side of a generation session: the drafters, SpecGate and the rollback
// journal. The session's decode loop (decode/generate.cpp) asks it for the next window's drafts,
// runs the window, verifies the drafts itself (exact acceptance: a draft stands iff it is the
// token the target chooses at its position) and reports back what was kept
// (docs/SPECULATION.md).
#pragma once

#include <array>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/journal.h"
#include "model/model.h"
#include "spec/mtp_drafter.h"
#include "spec/spec_gate.h"
#include "spec/suffix_drafter.h"

namespace strata::spec {

enum class Mode { Off, Mtp, Suffix, Auto };
// "off", "mtp", "suffix", "auto"; throws strata::Error naming --spec otherwise.
Mode parse_mode(const std::string& text);
const char* mode_name(Mode m);

struct Options {
  Mode mode = Mode::Off;
  std::optional<int> depth;  // --spec-depth: fixed drafts per window (0: never draft)
  int max_depth = 4;         // the gate's limit
  // Typical acceptance (opt-in, NOT exact): a draft stands when the target gives it at least
  // min(typical_epsilon, typical_delta * exp(-entropy)) probability.
  bool typical = false;
  float typical_epsilon = 0.3f, typical_delta = 0.09f;
  // Benchmark knob for MTP on random weights: the MTP drafter proposes the token the target will
  // choose with this probability, a random other token otherwise (0: off, the head's own drafts).
  double mtp_acceptance_knob = 0;
  uint64_t knob_seed = 1;
  // --draft-vocab: the MTP head scores ids [0, draft_vocab) and the special tokens at the end of
  // the vocabulary only (spec::draft_vocab); 0 scores every id; unset: default_draft_vocab().
  std::optional<int64_t> draft_vocab;
};

// What speculation did over some windows, for telemetry, bench JSON and /metrics.
struct Report {
  Mode mode = Mode::Off;
  int64_t windows = 0;          // verification + plain windows run while decoding
  int64_t drafted_windows = 0;  // windows that carried drafts
  int64_t drafted = 0, accepted = 0;  // draft tokens verified / accepted
  int64_t tokens = 0;           // tokens the windows yielded (kept rows)
  std::array<int64_t, kSources> source_windows{};
  std::array<std::array<int64_t, kMaxDepth + 1>, kSources> judged{}, hits{};  // per position
  std::optional<double> t1;     // T(1), seconds (the gate's EMA)
  std::vector<double> t_ratio;  // T(n)/T(1), n = 2..: measured ones only (0 = unmeasured)
  double snapshot_seconds = 0, rollback_seconds = 0;
  double draft_seconds = 0;  // the MTP head's windows (catch-up and chained steps)
  int64_t rollbacks = 0;
  int64_t probes = 0;  // drafted windows the gate chose deeper than its pick, to keep estimates alive
  bool typical = false;
  // The gate's own view when the report was taken (gauges): its acceptance estimate a_j by
  // source and position 1..kMaxDepth, and the E(k)/cost(k) of its best depth per source (1: not
  // drafting). They say why it drafts as it does, where the measured acceptance alone cannot.
  std::array<std::array<double, kMaxDepth + 1>, kSources> estimated{};
  std::array<double, kSources> best_value{};

  double mean_accepted_per_window() const;   // accepted drafts per drafted window
  double mean_tokens_per_window() const;     // kept rows per window
  double acceptance(int position) const;     // pooled over sources, position 1..
  Report since(const Report& before) const;  // counters minus `before` (gauges stay)
};

// a's counters plus b's, b's gauges (T(1), T(n)/T(1)).
Report accumulate(const Report& a, const Report& b);

// "spec auto: T1 41.2 ms, T2/T1 1.31 T3/T1 1.55 | acc 0.82 0.70 0.51 | 2.13 tok/window | ..."
std::string format_report(const Report& r);

class Speculator {
 public:
  // n_ctx: the session's context (the MTP head's cache gets as much); vocab: the ids the MTP head
  // drafts from (draft_vocab() of options.draft_vocab).
  Speculator(model::Model& model, const Options& options, int64_t n_ctx, model::DraftVocab vocab = {});
  ~Speculator();

  const Options& options() const { return o_; }
  bool enabled() const { return o_.mode != Mode::Off; }

  // A generate() call starts: `history` is every token before the first one to be decoded.
  void start(std::span<const int32_t> history);
  // The drafts (possibly none) for a window starting with `pending`, the last token of
  // `history`; at most `limit`. `forced_next` is what a forced-continuation benchmark will choose
  // next (the acceptance knob reads it; empty otherwise).
  struct Draft {
    Source source = Source::Suffix;
    std::vector<int32_t> tokens;
    std::vector<float> probs;
  };
  Draft plan(std::span<const int32_t> history, int limit, std::span<const int32_t> forced_next = {});
  // Bracket a window for its timing: one that warmed the backend's recording or grew the
  // journal's copies paid a one-time cost (the first drafted window of a CPU run took twice a
  // later one's time, 56 ms of it the journal's first copies), and window_done() is given no
  // time for it. Read only while speculating.
  void window_starts();
  bool window_paid_one_time_costs() const;
  // The window ran in `seconds` (forward plus rollback; none when its time is a one-time cost,
  // window_paid_one_time_costs()): `rows` rows of which the first `kept` stay; of its
  // drafts, `judged` were compared with the target's choice and the first `accepted` of those
  // stood (a generation that ends mid-window judges fewer than it drafted).
  void window_done(const Draft& draft, int rows, int kept, int judged, int accepted,
                   std::optional<double> seconds);
  // A token entered the history (prompt tokens go through start()).
  void push(int32_t token) { suffix_.append(token); }
  // The MTP head drafts from the trunk's hidden states: forwards should fill
  // ForwardExtras::hidden and pass the rows that stand to observe().
  bool wants_hidden() const { return mtp_ != nullptr; }
  // The trunk's hidden states of positions first.. (kept rows only).
  void observe(int64_t first, std::span<const float> hidden);

  // Replaces the drafters by `fn` (history, limit) -> drafts, verified like any other source
  // (counted as suffix drafts). The equivalence tests use it to force rejections at every
  // position; a draft model could plug in here.
  using DraftFn = std::function<std::vector<int32_t>(std::span<const int32_t> history, int limit)>;
  void set_external_drafter(DraftFn fn) { external_ = std::move(fn); }

  model::Journal& journal() { return journal_; }
  Report report() const;
  SpecGate& gate() { return gate_; }

 private:
  model::Model& model_;
  Options o_;
  SpecGate gate_;
  SuffixDrafter suffix_;
  std::unique_ptr<MtpDrafter> mtp_;
  model::DraftVocab draft_vocab_;
  model::Journal journal_;
  uint64_t warming_at_start_ = 0, layout_at_start_ = 0;  // window_starts()
  // The gate's pick for source s with `available` drafts, its probes counted.
  Pick counted_pick(Source s, int available);

  Report counts_;
  uint64_t knob_draws_ = 0;
  DraftFn external_;
};

}  // namespace strata::spec
