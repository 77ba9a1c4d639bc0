// What a sequence carries between windows: the KV cache of every attention layer, the conv and
// recurrent (delta rule) state of every Gated DeltaNet layer, qwen4exp's PLE token history and
// conv inputs and QSA index keys, and how many positions are done.
// All of it lives in backend memory. A copy is a snapshot: speculative decoding rolls a rejected
// draft back by restoring one (docs/DESIGN.md, "Speculative decoding").
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace strata::model {

using backend::Tensor;

struct LayerState {
  Tensor k_cache, v_cache;  // attention: [n_ctx, n_head_kv * head_dim] each
  Tensor conv;              // DeltaNet: [ssm_conv - 1, conv_dim], the previous inputs, oldest first
  Tensor ssm;               // DeltaNet: [Gv * S, S], head h's S[i][j] at row h*S + i
  // qwen4exp PLE layer: the dilated conv's previous inputs, [(ple_conv - 1) * ngram, hc_dim],
  // oldest first.
  Tensor ple_conv;
  // qwen4exp QSA layer: the indexer's raw key of every position, [n_ctx, idx_head_dim], and the
  // scored key of every complete block (mean of its raw keys, k_norm, rope at its first
  // position), [n_ctx / idx_block, idx_head_dim].
  Tensor idx_k, idx_blocks;
};

class State {
 public:
  // Trunk: every trunk block. Mtp: the MTP head's blocks only (layers has n_blocks() entries,
  // the trunk's left empty), its own KV cache.
  enum class Kind { Trunk, Mtp };
  // Room for n_ctx positions (at most config.n_ctx); throws strata::Error otherwise.
  State(backend::Backend& backend, const ModelConfig& config, int64_t n_ctx, Kind kind = Kind::Trunk);
  ~State();
  State(const State& other);
  State& operator=(const State& other);  // same model and n_ctx only (throws otherwise)

  // Back to an empty sequence: zero states and caches, n_past 0.
  void reset();

  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past = 0;
  std::vector<LayerState> layers;  // one per trunk block (Mtp: per block, trunk ones empty)
  // qwen4exp PLE: the last ngram_size - 1 tokens, oldest first (eos before the first token, as
  // the reference pads its history).
  std::vector<int32_t> ple_history;

 private:
  void release_all();
  void copy_state(const LayerState& src, LayerState& dst, int64_t n_past, bool allocate);
  backend::Backend* backend_;
  int64_t n_ctx_;
  int32_t ple_eos_ = 0;  // what reset() refills ple_history with
};

}  // namespace strata::model
