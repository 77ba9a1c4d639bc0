// What a sequence carries between windows: the KV cache of every attention layer, the conv and
// recurrent (delta rule) state of every Gated DeltaNet layer, and how many positions are done.
// All of it lives in backend memory. A copy is a snapshot: speculative decoding rolls a rejected
// draft back by restoring one (DESIGN.md, "Speculative decoding").
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
};

class State {
 public:
  // Room for n_ctx positions (at most config.n_ctx); throws strata::Error otherwise.
  State(backend::Backend& backend, const ModelConfig& config, int64_t n_ctx);
  ~State();
  State(const State& other);
  State& operator=(const State& other);  // same model and n_ctx only (throws otherwise)

  // Back to an empty sequence: zero states and caches, n_past 0.
  void reset();

  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past = 0;
  std::vector<LayerState> layers;  // one per trunk block

 private:
  void release_all();
  void copy_state(const LayerState& src, LayerState& dst, int64_t n_past, bool allocate);
  backend::Backend* backend_;
  int64_t n_ctx_;
};

}  // namespace strata::model
