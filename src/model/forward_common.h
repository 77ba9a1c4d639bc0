// What the architectures' forward passes share: the window in flight (backend, weights, state,
// positions, temporaries), the table of layer functions, and the blocks several architectures
// use (RMSNorm over the hidden size, the routed + shared expert MoE).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "experts/expert_source.h"
#include "model/config.h"
#include "model/journal.h"
#include "model/model.h"
#include "model/route_control.h"
#include "model/state.h"
#include "model/weights.h"

namespace strata::model {

// Backend tensors that live until clear() (called after every layer, so a long prefill holds
// one layer's temporaries, not all of them) or destruction.
class Scratch {
 public:
  explicit Scratch(backend::Backend& be) : be_(be) {}
  ~Scratch() { clear(); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Tensor operator()(int64_t rows, int64_t cols);
  backend::Ids ids(int64_t rows, int64_t cols);
  // ids [rows, cols] holding `host`.
  backend::Ids ids(std::span<const int32_t> host, int64_t rows, int64_t cols);
  void clear();

 private:
  backend::Backend& be_;
  std::vector<Tensor> owned_;
  std::vector<backend::Ids> owned_ids_;
};

// One sequence's rows in a window that holds several (Model::forward_batch): rows
// [first, first + rows) belong to `state`.
struct WindowSequence {
  int64_t first = 0, rows = 0;
  State* state = nullptr;
};

// One window in flight: what a layer function reads and writes. With several sequences,
// `state` is the first one's: the sequences' states are reached only through per_sequence(),
// sequence_states() and sequence_caches().
struct Window {
  backend::Backend& be;
  const ModelConfig& c;
  const Weights& w;
  experts::ExpertSource& experts;
  State& state;
  std::vector<int32_t> pos;  // the rows' positions on the host: n_past, n_past + 1, ...
  std::span<const int32_t> tokens;  // the rows' token ids on the host (PLE hashes them)
  int64_t T;
  bool renormalize_topk;  // router: renormalise the top-k weights to sum 1
  const DumpFn& dump_fn;
  Scratch tmp;
  RouteControl* route = nullptr;  // trace, recording, cache-conditional routing; null: exact
  backend::Ids positions = {};  // pos in backend memory, [T, 1], uploaded once per window
  Journal* journal = nullptr;     // a speculative window: what a rollback needs (journal.h)
  std::vector<WindowSequence> sequences{};  // empty: one sequence, `state`
  // qwen4exp: per PLE table, the rows' n-gram ids in backend memory, head-major [ple_heads(), T]
  // (per sequence, in window order: a sequence's rows are [ple_heads(), rows] of its own), hashed
  // and uploaded before layer 0 (ple_start_window): the reads of every PLE layer's rows go out
  // before the first runs, and a replayed window has every input before its walk.
  std::vector<backend::Ids> ple_ids{};
  PleCounters* ple_counters = nullptr;  // the model's; null: not counted
  // [T, n_embd], lasting the window (qwen3next): where a layer's last residual add also writes the
  // next layer's input norm of the hidden state (add_mul_sigmoid_residual_rms_norm), which layer
  // `input_norm_layer` then takes instead of norming it again. No rows: every layer norms its own.
  Tensor input_norm = {};
  int64_t input_norm_layer = -1;
  // qwen4exp's QSA: per row, the first position of the key block the row completes and that
  // block's index, or -1 for a row completing none ([T, 1] each), uploaded before layer 0
  // (qsa_start_window), the same for every QSA layer.
  backend::Ids qsa_block_starts = {}, qsa_blocks = {};

  // Hands t to the dump callback as "name-il" (il < 0: "name"), when one is set.
  void dump(const char* name, int64_t il, const Tensor& t);
};

// One block of an architecture: x [T, n_embd] is the residual stream, updated in place.
using LayerFn = void (*)(Window& w, int64_t il, Tensor x);
void qwen3moe_layer(Window& w, int64_t il, Tensor x);   // qwen3moe.cpp
void qwen3next_layer(Window& w, int64_t il, Tensor x);  // qwen3next.cpp: qwen3next and qwen35moe
// qwen4exp.cpp: x is the hc_count residual streams, [T, hc_dim].
void qwen4exp_layer(Window& w, int64_t il, Tensor x);
// qwen4exp's final hyper-connection mixer: the four streams [rows, hc_dim] -> [rows, n_embd] for
// the LM head (it stands in for the output norm).
Tensor qwen4exp_output(Window& w, const Tensor& x);
// qwen4exp's MTP head around its block (qwen4exp.cpp): the input streams [T, hc_dim] into x from
// the next tokens' embeddings e [T, n] and the hidden streams [T, hc_dim], and the head's final
// mixer [rows, hc_dim] -> [rows, n].
void qwen4exp_mtp_input(Window& w, const LayerWeights& L, const Tensor& e, const Tensor& streams, Tensor x);
Tensor qwen4exp_mtp_output(Window& w, const LayerWeights& L, const Tensor& x);

// Runs `part` (whatever of a block reads or writes a sequence's state without a *_sequences op:
// qwen4exp's PLE and sparse attention) on each sequence's rows of x in a window of
// its own, as if that sequence were alone: a row's result never depends on the other rows.
// Returns the rows' results in window order, [T, cols]. With one sequence it is just part(w, x).
using SequencePart = std::function<Tensor(Window& sequence, const Tensor& rows)>;
Tensor per_sequence(Window& w, const Tensor& x, const SequencePart& part);

// Each sequence's rows of the window with its layer-il state `member` (the whole window and
// `state` for a window of one sequence), or with its layer-il KV cache: what the backend's
// *_sequences ops take. A block runs everything over the whole window (one matmul reads the
// weights once for every sequence's rows); only these ops see the sequences.
std::vector<backend::SequenceState> sequence_states(const Window& w, int64_t il, Tensor LayerState::*member);
std::vector<backend::SequenceCache> sequence_caches(const Window& w, int64_t il);

// The layer function of an architecture.
LayerFn layer_function(Arch arch);

// RMSNorm over the hidden size with gain g (F32 [n_embd]).
Tensor norm(Window& w, const Tensor& x, const backend::Weight& g);
// The residual stream's add and the norm after it: x += delta, then norm(x) (one backend op).
Tensor add_norm(Window& w, Tensor x, const Tensor& delta, const backend::Weight& g);

// Qwen3NextGatedDeltaNet (qwen3next.cpp; qwen4exp uses it too): x [T, n_embd] -> [T, n_embd].
// Runs per sequence itself where it must (the conv and the delta rule, which carry state).
Tensor gated_delta_net(Window& w, int64_t il, const Tensor& x);

// Qwen3Next-style gated attention up to the attention itself (qwen3next.cpp; QSA reuses it):
// q_proj split per head into query and gate, q/k RMSNorm, partial NeoX rope (gated_projections,
// no state touched), then gated_query writes the window's k and v to the layer's cache.
struct GatedQuery {
  Tensor q, gate, k, v;
};
GatedQuery gated_projections(Window& w, int64_t il, const Tensor& x);
GatedQuery gated_query(Window& w, int64_t il, const Tensor& x);
// attn_output * sigmoid(gate), then o_proj.
Tensor gated_output(Window& w, int64_t il, Tensor o, const Tensor& gate);

// SparseMoeBlock: softmax router, top-k experts from the ExpertSource, plus the shared expert
// scaled by sigmoid(shared_expert_gate(x)) when the layer has one. With a residual, the block's
// output is also added into it (residual + mlp(x)), in the op that adds the shared expert, which
// also writes the next layer's input norm into w.input_norm where it has rows.
Tensor moe(Window& w, int64_t il, const Tensor& x, Tensor* residual = nullptr);

}  // namespace strata::model
