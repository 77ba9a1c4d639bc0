// What a speculative verification window records so that the state can be brought back to any
// prefix of its rows afterwards (docs/DESIGN.md, "Speculative decoding": rejection rolls GDN, conv,
// PLE state and KV back to the accepted prefix).
//
// Only the recurrent states need it. KV caches, QSA index keys and block keys are indexed by
// position: rows past n_past are never read before a later window writes them again, so a
// rollback leaves them alone (docs/SPECULATION.md, "Rollback"). A recurrent op (the DeltaNet's
// causal conv and delta rule, qwen4exp's PLE conv) instead folds every row into one state, so the
// journal keeps a copy of that state from before the window and the op's inputs for the window's
// rows; a rollback to `keep` rows restores the copy and runs the op again on the first `keep`
// rows only. The backend processes a window's rows one after another (a T-row window equals T
// one-row windows bitwise), so the replayed state is bitwise the one plain decoding would hold.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace strata::model {

using backend::Tensor;
using backend::Weight;
class State;

class Journal {
 public:
  explicit Journal(backend::Backend& backend);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Model::forward: a window of `tokens` starts on `state`.
  void begin(const State& state, std::span<const int32_t> tokens);
  // Layer code, before a recurrent op advances `state` over the window's rows (the arguments are
  // the op's own).
  void conv(Tensor state, const Tensor& x, const Weight& w, int64_t dilation);
  void delta_rule(Tensor state, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                  const Tensor& beta, int64_t n_heads, backend::HeadRepeat repeat);

  // Brings `state` (the one begin() saw) to hold the window's first `keep` rows only,
  // 1 <= keep <= the window's rows. Throws strata::Error for another state or a bad keep.
  void rollback(State& state, int64_t keep);

  int64_t window_rows() const { return int64_t(tokens_.size()); }
  // Names where the journal's copies are, unique in the process (a journal that replaces another
  // at the same host address gets new numbers): a recorded window writes them at fixed addresses,
  // so its key includes this (window_scope.h, window_key).
  uint64_t layout() const { return layout_; }
  // Cumulative costs, for telemetry: copies taken before windows and rollbacks done.
  double snapshot_seconds() const { return snapshot_seconds_; }
  double rollback_seconds() const { return rollback_seconds_; }
  uint64_t snapshot_bytes() const { return snapshot_bytes_; }
  int64_t rollbacks() const { return rollbacks_; }

 private:
  enum class Op { Conv, DeltaRule };
  struct Entry {
    Op op = Op::Conv;
    Tensor state;     // the live state (a view of the State's tensor)
    Tensor snapshot;  // owned: the state before the window
    std::vector<Tensor> inputs;  // owned: the op's inputs, window rows first
    Weight w;
    int64_t dilation = 1, n_heads = 0;
    backend::HeadRepeat repeat = backend::HeadRepeat::Interleaved;
  };
  Entry& next_entry(Op op, Tensor state, std::span<const Tensor* const> inputs);
  void replay(Entry& e, int64_t keep);
  Tensor ensure(Tensor& t, int64_t rows, int64_t cols, int64_t room);

  backend::Backend& be_;
  std::vector<Entry> entries_;  // kept across windows: their buffers are reused
  size_t used_ = 0;             // entries recorded by the current window
  uint64_t layout_;
  const State* state_ = nullptr;
  int64_t n_past_ = 0;
  std::vector<int32_t> tokens_, ple_history_;
  double snapshot_seconds_ = 0, rollback_seconds_ = 0;
  uint64_t snapshot_bytes_ = 0;
  int64_t rollbacks_ = 0;
};

}  // namespace strata::model
