#include "model/forward_common.h"

#include <algorithm>
#include <optional>

#include "util/error.h"

namespace strata::model {

Tensor Scratch::operator()(int64_t rows, int64_t cols) {
  owned_.push_back(be_.alloc(rows, cols));
  return owned_.back();
}

backend::Ids Scratch::ids(int64_t rows, int64_t cols) {
  owned_ids_.push_back(be_.alloc_ids(rows, cols));
  return owned_ids_.back();
}

backend::Ids Scratch::ids(std::span<const int32_t> host, int64_t rows, int64_t cols) {
  owned_ids_.push_back(backend::make_ids(be_, host, rows, cols));
  return owned_ids_.back();
}

void Scratch::clear() {
  for (const Tensor& t : owned_) be_.release(t);
  for (const backend::Ids& t : owned_ids_) be_.release_ids(t);
  owned_.clear();
  owned_ids_.clear();
}

void Window::dump(const char* name, int64_t il, const Tensor& t) {
  if (!dump_fn) return;
  std::vector<float> rows(size_t(t.rows * t.cols));
  be.download(t, rows.data());
  dump_fn(il < 0 ? std::string(name) : cat(name, "-", il), rows, t.cols);
}

namespace {

// Sequence s's part of each PLE table's ids: its own [ple_heads(), rows] block.
std::vector<backend::Ids> sequence_ple_ids(const Window& w, const WindowSequence& s) {
  std::vector<backend::Ids> out;
  for (const backend::Ids& ids : w.ple_ids) out.push_back({ids.data + s.first * ids.rows, ids.rows, s.rows});
  return out;
}

// Sequence s's own window: its rows, positions, state, PLE ids and QSA blocks, as if it were alone.
Window sequence_window(Window& w, const WindowSequence& s) {
  static const DumpFn kNoDump;  // a sequence's own rows are not dumped
  return Window{w.be, w.c, w.w, w.experts, *s.state,
                std::vector<int32_t>(w.pos.begin() + s.first, w.pos.begin() + s.first + s.rows),
                w.tokens.subspan(size_t(s.first), size_t(s.rows)), s.rows, w.renormalize_topk, kNoDump,
                Scratch(w.be), w.route, w.positions.rows_view(s.first, s.rows), nullptr, {},
                sequence_ple_ids(w, s), w.ple_counters, {}, -1,
                w.qsa_block_starts.rows_view(s.first, s.rows), w.qsa_blocks.rows_view(s.first, s.rows)};
}

}  // namespace

Tensor per_sequence(Window& w, const Tensor& x, const SequencePart& part) {
  if (w.sequences.size() <= 1) return part(w, x);
  Tensor out;
  for (const WindowSequence& s : w.sequences) {
    Window seq = sequence_window(w, s);
    const Tensor r = part(seq, x.rows_view(s.first, s.rows));
    if (!out.data) out = w.tmp(w.T, r.cols);
    w.be.copy(r, out.rows_view(s.first, s.rows));
  }
  return out;
}

std::vector<backend::SequenceState> sequence_states(const Window& w, int64_t il, Tensor LayerState::*member) {
  if (w.sequences.size() <= 1) return {{0, w.T, w.state.layers[size_t(il)].*member}};
  std::vector<backend::SequenceState> out;
  for (const WindowSequence& s : w.sequences) out.push_back({s.first, s.rows, s.state->layers[size_t(il)].*member});
  return out;
}

std::vector<backend::SequenceCache> sequence_caches(const Window& w, int64_t il) {
  const auto cache = [il](const State& s) -> const LayerState& { return s.layers[size_t(il)]; };
  if (w.sequences.size() <= 1) return {{0, w.T, cache(w.state).k_cache, cache(w.state).v_cache}};
  std::vector<backend::SequenceCache> out;
  for (const WindowSequence& s : w.sequences)
    out.push_back({s.first, s.rows, cache(*s.state).k_cache, cache(*s.state).v_cache});
  return out;
}

LayerFn layer_function(Arch arch) {
  switch (arch) {
    case Arch::Qwen3Moe: return qwen3moe_layer;
    case Arch::Qwen3Next:
    case Arch::Qwen35Moe: return qwen3next_layer;
    case Arch::Qwen4Exp: return qwen4exp_layer;
  }
  fail("internal error: no layer function for architecture ", int(arch));
}

Tensor norm(Window& w, const Tensor& x, const backend::Weight& g) {
  Tensor y = w.tmp(x.rows, x.cols);
  w.be.rms_norm(x, &g, x.cols, float(w.c.rms_eps), y);
  return y;
}

Tensor add_norm(Window& w, Tensor x, const Tensor& delta, const backend::Weight& g) {
  Tensor y = w.tmp(x.rows, x.cols);
  w.be.add_rms_norm(x, delta, g, float(w.c.rms_eps), y);
  return y;
}

namespace {

// Read-ahead: layer il + 1's router applied to layer il's MoE input is a cheap guess at the
// experts the next layer will route to, so their reads can start while this layer computes.
void guess_next_layer(Window& w, int64_t il, const Tensor& x) {
  if (!w.experts.wants_read_ahead() || il + 1 >= w.c.n_layer) return;
  const LayerWeights& next = w.w.layers[size_t(il + 1)];
  if (!present(next.ffn_gate_inp)) return;
  Tensor logits = w.tmp(w.T, w.c.n_expert);
  w.be.matmul(next.ffn_gate_inp, x, logits);
  backend::Ids ids = w.tmp.ids(w.T, w.c.n_expert_used);
  Tensor weights = w.tmp(w.T, w.c.n_expert_used);
  w.be.route_softmax_topk(logits, false, ids, weights);
  w.experts.read_ahead(int(il + 1), backend::download_routing(w.be, ids, weights));
}

// The routed experts: y = sum over rank j of weights[r, j] * FFN_{ids[r, j]}(x[r]). When every
// expert is resident the routing stays in backend memory; otherwise the expert cache learns the
// ids, fetches what is missing and hands the experts over in one or several groups, computed
// into per-pair outputs combined afterwards (bitwise the one-step result).
void routed_experts(Window& w, int64_t il, const Tensor& x, const backend::Ids& ids,
                    const Tensor& weights, const backend::Routing* host, Tensor y) {
  backend::Backend& be = w.be;
  const std::span<const backend::ExpertWeights> resident = w.experts.all_resident(int(il));
  if (!resident.empty() && !w.experts.wants_read_ahead()) {
    be.moe_experts(x, ids, weights, resident, y);
    return;
  }
  const backend::Routing routing = host ? *host : backend::download_routing(be, ids, weights);
  Tensor pair_out;
  bool first = true;
  w.experts.layer(int(il), routing, [&](const experts::ExpertGroup& g) {
    if (first) guess_next_layer(w, il, x);
    first = false;
    if (g.whole) {
      be.moe_experts(x, ids, weights, g.weights, y);
      return;
    }
    if (!pair_out.data) pair_out = w.tmp(w.T * routing.top_k, w.c.n_embd);
    std::vector<int64_t> pairs;
    for (size_t p = 0; p < routing.experts.size(); ++p)
      if (std::binary_search(g.ids.begin(), g.ids.end(), routing.experts[p]))
        pairs.push_back(int64_t(p));
    be.moe_expert_outputs(x, ids, pairs, g.weights, pair_out);
  });
  if (pair_out.data) be.moe_combine(weights, pair_out, y);
}

// shared_expert_output = self.shared_expert(hidden_states)
Tensor shared_expert_output(Window& w, const LayerWeights& L, const Tensor& x) {
  Tensor gate = w.tmp(w.T, w.c.n_ff_shexp), up = w.tmp(w.T, w.c.n_ff_shexp);
  const backend::Weight* ws[] = {&L.ffn_gate_shexp, &L.ffn_up_shexp};
  Tensor ys[] = {gate, up};
  w.be.matmuls(ws, x, ys);
  w.be.swiglu(gate, up, gate);  // act_fn(gate_proj(x)) * up_proj(x)
  Tensor shared = w.tmp(w.T, w.c.n_embd);
  w.be.matmul(L.ffn_down_shexp, gate, shared);  // down_proj(...)
  return shared;
}

}  // namespace

Tensor moe(Window& w, int64_t il, const Tensor& x, Tensor* residual) {
  const LayerWeights& L = w.w.layers[size_t(il)];
  backend::Backend& be = w.be;
  const bool shared_expert = present(L.ffn_gate_shexp);
  // The host sees the routing when a route control or the expert cache decides on it.
  const bool host_step =
      w.route || w.experts.all_resident(int(il)).empty() || w.experts.wants_read_ahead();
  // The shared expert needs no routing: a side branch beside the router and the routed experts,
  // except where the host takes a step (the step joins the branch, and reading the routing back
  // would wait for it); there it follows the routed experts.
  const bool beside = shared_expert && !host_step;
  Tensor shared;
  if (beside) {
    be.begin_side_branch();
    shared = shared_expert_output(w, L, x);
    be.end_side_branch();
  }
  Tensor logits = w.tmp(w.T, w.c.n_expert);
  Tensor shared_gate = shared_expert ? w.tmp(w.T, 1) : Tensor{};
  // router_logits = F.linear(hidden_states, self.weight), and the shared expert's gate logit
  // self.shared_expert_gate(hidden_states) with it (the same x: one launch where it can be)
  if (shared_expert) {
    const backend::Weight* ws[] = {&L.ffn_gate_inp, &L.ffn_gate_inp_shexp};
    Tensor ys[] = {logits, shared_gate};
    be.matmuls(ws, x, ys);
  } else {
    be.matmul(L.ffn_gate_inp, x, logits);
  }
  // softmax, topk, and `router_top_value /= sum` when norm_topk_prob
  backend::Ids ids = w.tmp.ids(w.T, w.c.n_expert_used);
  Tensor weights = w.tmp(w.T, w.c.n_expert_used);
  be.route_softmax_topk(logits, w.renormalize_topk, ids, weights);
  Tensor y = w.tmp(w.T, w.c.n_embd);  // zeros
  {
    struct HostStep {
      backend::Backend& be;
      bool on;
      HostStep(backend::Backend& b, bool o) : be(b), on(o) {
        if (on) be.begin_host_step();
      }
      ~HostStep() {
        if (on) be.end_host_step();
      }
    } step(be, host_step);
    std::optional<backend::Routing> controlled;
    if (w.route) {
      controlled = w.route->route(be, w.experts, int(il), logits, ids, weights);
      backend::upload_routing(be, *controlled, ids, weights);
    }
    routed_experts(w, il, x, ids, weights, controlled ? &*controlled : nullptr, y);  // self.experts(...)
  }
  if (!shared_expert) {
    if (residual) be.add(*residual, y, *residual);
    return y;
  }
  if (beside)
    be.join_side_branch();
  else
    shared = shared_expert_output(w, L, x);
  // expert_output + F.sigmoid(shared_gate) * shared_expert_output; the residual add, and with it
  // the next layer's input_layernorm where the window has room for it
  if (residual && w.input_norm.rows > 0 && il + 1 < w.c.n_layer) {
    be.add_mul_sigmoid_residual_rms_norm(*residual, y, shared, shared_gate,
                                         w.w.layers[size_t(il + 1)].attn_norm,
                                         float(w.c.rms_eps), w.input_norm);
    w.input_norm_layer = il + 1;
  } else if (residual) {
    be.add_mul_sigmoid_residual(*residual, y, shared, shared_gate);
  } else {
    be.add_mul_sigmoid(y, shared, shared_gate);
  }
  return y;
}

}  // namespace strata::model
