// A loaded model: the GGUF mapping, its config, the trunk weights prepared by the backend, the
// routed experts behind an ExpertSource, and forward(), which pushes one window of T rows through
// every layer in one pass (docs/DESIGN.md, "The decode window"). Prefill is the same call with a large
// T; a T-row window gives bitwise the logits of T one-row windows (docs/DESIGN.md, "Determinism").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "experts/expert_source.h"
#include "model/config.h"
#include "model/state.h"
#include "model/weights.h"

namespace strata::gguf {
class Reader;
}

namespace strata::model {

enum class LogitsMode { Last, All };

// The ids an MTP head drafts from: [0, head) and [tail_first, n_vocab), two row ranges of the LM
// head (docs/SPECULATION.md, "Draft vocabulary"). head 0 is the whole vocabulary.
struct DraftVocab {
  int64_t head = 0;
  int64_t tail_first = 0;

  bool whole() const { return head == 0; }
  // How many ids it holds in a vocabulary of n_vocab.
  int64_t size(int64_t n_vocab) const { return whole() ? n_vocab : head + (n_vocab - tail_first); }
  bool contains(int32_t id) const { return whole() || id < head || id >= tail_first; }
  // The id of column `column` of the draft logits.
  int32_t id(int32_t column) const {
    return whole() || column < head ? column : int32_t(tail_first + (column - head));
  }
};

// Receives named intermediate activations ("attn_norm-3", "final_norm"; docs/MODELS.md lists
// them) as [T, cols] host rows while a window runs.
using DumpFn =
    std::function<void(const std::string& name, const std::vector<float>& rows, int64_t cols)>;

class RouteControl;
class Journal;

// qwen4exp's PLE row reads so far (strata bench reports them per token).
struct PleCounters {
  uint64_t rows = 0;           // n-gram table rows the PLE layers gathered
  double issue_seconds = 0;    // issuing their reads before layer 0 (Backend::prefetch_rows)
  double gather_seconds = 0;   // the PLE layers' gathers: on the CPU, the wait for rows not yet read
};

// A window's top-k candidates per logits row, in the sampler's order, and where asked each row's
// softmax sum; or, for plain temperature sampling, each row's drawn token.
struct TopLogits {
  int32_t k = 0;                  // candidates per row, 1..Backend::kMaxTopK
  float sum_temperature = 0.0f;   // > 0: the rows' sums at it too (Backend::sampling_sums)
  // > 0 (k 0): each row's token drawn in the window at this temperature with uniforms[row]
  // (Backend::draw), into columns[row]; -1 when every logit is NaN.
  float draw_temperature = 0.0f;
  std::vector<float> uniforms;    // [rows] for a draw, set before the window
  std::vector<int32_t> columns;   // [rows * k]; -1 past a row's non-NaN logits
  std::vector<float> logits;      // [rows * k]
  std::vector<float> sums;        // [rows] where sum_temperature > 0
};

// What a forward() may do besides the logits.
struct ForwardExtras {
  // Records what rolling the window back needs (journal.h); Model::rollback undoes rows.
  Journal* journal = nullptr;
  // Receives every row's last hidden state, [T, hidden_cols()], as the MTP head reads it:
  // the output norm's result (qwen3next family), or qwen4exp's hc_count residual streams
  // before the final mixer.
  std::vector<float>* hidden = nullptr;
  // Receives each logits row's greedy choice instead of the rows (forward() then returns none):
  // the backend picks (Backend::argmax; -1 when every logit is NaN), and a token per row comes
  // back, not n_vocab floats.
  std::vector<int32_t>* greedy = nullptr;
  // Receives each logits row's top_k->k largest logits (and sums) instead of the rows
  // (Backend::top_k, sampling_sums), what top-k and top-p sampling read
  // (decode::Sampler::sample_candidates_at), or each row's plain temperature draw
  // (Backend::draw). Not with `greedy`.
  TopLogits* top_k = nullptr;
};

class Model {
 public:
  // Maps and validates the file (architecture, hyperparameters, every tensor against the
  // architecture's list) and prepares its weights. Throws strata::Error naming the file and
  // the problem.
  // The routed experts come from the file's stacks or stream from the .experts pack, as
  // `experts` and experts::open_expert_source decide.
  static std::unique_ptr<Model> load(const std::string& path, backend::Backend& backend,
                                     const experts::SourceOptions& experts = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const gguf::Reader& reader() const { return *reader_; }
  backend::Backend& backend() const { return backend_; }

  // A fresh state with room for n_ctx positions.
  State new_state(int64_t n_ctx) const { return State(backend_, config_, n_ctx); }

  // Runs tokens at positions state.n_past.. and advances state.n_past. Returns fp32 logits,
  // [T, n_vocab] (All) or [1, n_vocab] of the last row (Last). Throws strata::Error for an empty
  // window, a token outside the vocabulary or a window past the state's context.
  std::vector<float> forward(std::span<const int32_t> tokens, State& state, LogitsMode mode,
                             const ForwardExtras& extras = {});

  // Undoes the last window's rows past its first `keep` (it ran with `journal`): the state then
  // holds exactly what a window of those `keep` rows would have left, bitwise, and a routing
  // trace being replayed rewinds with it. Throws strata::Error for a mismatched journal.
  void rollback(State& state, Journal& journal, int64_t keep);

  // Columns of ForwardExtras::hidden.
  int64_t hidden_cols() const;

  // The MTP head (mtp.cpp; docs/SPECULATION.md, "The MTP head"): the block after the trunk with
  // its own KV cache (an MTP state). Row t joins hidden[t] (the hidden state of position
  // state.n_past + t, as ForwardExtras::hidden gives it, or a previous head step's *hidden_out
  // row) with tokens[t], the token that followed that position, and predicts the token after
  // tokens[t]. Returns logits [T or 1, n_vocab]; *hidden_out receives every row's output hidden
  // state [T, hidden_cols()] for a chained next step; with `greedy`, each logits row's greedy
  // choice comes back instead of the logits (as ForwardExtras::greedy), and with `probs` its
  // softmax probability. Throws strata::Error when the model has no MTP block, for a bad hidden
  // size or a window past the state's context.
  //
  // With a draft vocabulary (`vocab` not whole), the head scores only those ids, which must come
  // with `greedy` and LogitsMode::Last: drafts need the best id, not the distribution, and the
  // LM head is most of a draft's cost (docs/SPECULATION.md, "Draft vocabulary"). `probs` is then
  // the softmax over those ids, an upper bound on the whole head's.
  bool has_mtp() const { return config_.n_mtp > 0; }
  State new_mtp_state(int64_t n_ctx) const { return State(backend_, config_, n_ctx, State::Kind::Mtp); }
  std::vector<float> mtp_forward(std::span<const int32_t> tokens, std::span<const float> hidden,
                                 State& state, LogitsMode mode, std::vector<float>* hidden_out,
                                 std::vector<int32_t>* greedy = nullptr,
                                 std::vector<float>* probs = nullptr, DraftVocab vocab = {});

  // One sequence's part of a shared window. With `greedy` or `top` (at most one), the sequence's
  // rows are chosen in the window as forward()'s extras do, and its logits do not come back.
  // `journal` and `hidden` are forward()'s extras of those names, for a window that holds this
  // sequence alone (a speculative window, or rows the MTP head reads).
  struct SequenceRows {
    std::span<const int32_t> tokens;
    State* state = nullptr;
    LogitsMode mode = LogitsMode::Last;
    std::vector<int32_t>* greedy = nullptr;
    TopLogits* top = nullptr;
    Journal* journal = nullptr;
    std::vector<float>* hidden = nullptr;
  };
  // Several sequences (distinct states) in one window: their rows go through every layer
  // together, so the experts a window routes to are fetched once for all of them, while
  // attention, the DeltaNet and PLE run on each sequence's rows with its own state. Each
  // sequence's logits (or choices) equal what forward() gives it alone, bitwise. Throws like
  // forward(), naming the sequence, for a state given twice, and for a journal asked of a window
  // of several sequences. `hidden` gets every row of that sequence, as forward() gives it.
  std::vector<std::vector<float>> forward_batch(std::span<const SequenceRows> sequences);

  // qwen4exp: whether a window issues the reads of its PLE rows before layer 0 (true, the
  // default) or leaves each PLE layer to fault its rows in one after another (false: what the
  // early issue saves is measured against it). Changes no result.
  void set_ple_prefetch(bool on) { ple_prefetch_ = on; }
  const PleCounters& ple_counters() const { return ple_counters_; }

  // Called with every named activation of later forward() calls; empty = none (the default).
  void set_dump(DumpFn dump) { dump_ = std::move(dump); }

  // Replaces the routed-expert source.
  void set_expert_source(std::unique_ptr<experts::ExpertSource> source,
                         std::string description) {
    experts_ = std::move(source);
    experts_description_ = std::move(description);
  }
  experts::ExpertSource& expert_source() const { return *experts_; }
  // "mapped from the GGUF" or "streamed from PACK, budget ...".
  const std::string& experts_description() const { return experts_description_; }
  // The expert cache's counters; empty when the experts are mapped.
  std::optional<experts::CacheStats> expert_stats() const { return experts_->stats(); }

  // Routing controls (route_control.h) used by later forward() calls; null: exact routing.
  void set_route_control(std::unique_ptr<RouteControl> control);
  RouteControl* route_control() const { return route_.get(); }
  bool renormalize_topk() const { return renormalize_topk_; }

 private:
  Model(std::unique_ptr<gguf::Reader> reader, backend::Backend& backend);
  // Rows [first, first + n) of the LM head.
  backend::Weight lm_head_rows(int64_t first, int64_t n) const;

  std::unique_ptr<gguf::Reader> reader_;
  backend::Backend& backend_;
  ModelConfig config_;
  Weights weights_;
  std::unique_ptr<experts::ExpertSource> experts_;
  std::string experts_description_;
  bool renormalize_topk_ = true;
  bool ple_prefetch_ = true;
  PleCounters ple_counters_;
  DumpFn dump_;
  std::unique_ptr<RouteControl> route_;
};

}  // namespace strata::model
