#include "model/forward_common.h"

#include "util/error.h"

namespace strata::model {

Tensor Scratch::operator()(int64_t rows, int64_t cols) {
  owned_.push_back(be_.alloc(rows, cols));
  return owned_.back();
}

void Scratch::clear() {
  for (const Tensor& t : owned_) be_.release(t);
  owned_.clear();
}

void Window::dump(const char* name, int64_t il, const Tensor& t) {
  if (!dump_fn) return;
  std::vector<float> rows(size_t(t.rows * t.cols));
  be.download(t, rows.data());
  dump_fn(il < 0 ? std::string(name) : cat(name, "-", il), rows, t.cols);
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

Tensor moe(Window& w, int64_t il, const Tensor& x) {
  const LayerWeights& L = w.w.layers[size_t(il)];
  backend::Backend& be = w.be;
  Tensor logits = w.tmp(w.T, w.c.n_expert);
  be.matmul(L.ffn_gate_inp, x, logits);  // router_logits = F.linear(hidden_states, self.weight)
  // softmax, topk, and `router_top_value /= sum` when norm_topk_prob
  const backend::Routing routing =
      be.route_softmax_topk(logits, w.c.n_expert_used, w.renormalize_topk);
  Tensor y = w.tmp(w.T, w.c.n_embd);                                 // zeros
  be.moe_experts(x, routing, w.experts.layer(int(il), routing), y);  // self.experts(...)
  if (!present(L.ffn_gate_shexp)) return y;
  // shared_expert_output = self.shared_expert(hidden_states)
  Tensor gate = w.tmp(w.T, w.c.n_ff_shexp), up = w.tmp(w.T, w.c.n_ff_shexp);
  be.matmul(L.ffn_gate_shexp, x, gate);
  be.matmul(L.ffn_up_shexp, x, up);
  be.swiglu(gate, up, gate);  // act_fn(gate_proj(x)) * up_proj(x)
  Tensor shared = w.tmp(w.T, w.c.n_embd);
  be.matmul(L.ffn_down_shexp, gate, shared);  // down_proj(...)
  // F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output
  Tensor shared_gate = w.tmp(w.T, 1);
  be.matmul(L.ffn_gate_inp_shexp, x, shared_gate);
  be.mul_sigmoid(shared, shared_gate, shared);
  be.add(y, shared, y);  // expert_output + shared_expert_output
  return y;
}

}  // namespace strata::model
