// qwen3next and qwen35moe forward, following transformers' modeling_qwen3_next.py
// (Qwen3NextDecoderLayer); Qwen3.5-MoE differs only where the GGUF layout does
// (docs/MODELS.md):
// - the DeltaNet's beta/alpha come from one fused ssm_ba (qwen3next, per k head
//   [beta x r | alpha x r], r = Gv/Gk) or from ssm_beta and ssm_alpha (qwen35moe);
// - value heads: qwen3next keeps HF's order (v head j of k head g at g*r + j, so q/k heads are
//   repeated interleaved), llama.cpp's qwen35moe converter tiles them (slot j*Gk + g, so q/k
//   heads are repeated as a whole block r times).
// qwen4exp (qwen4exp.cpp) reuses the DeltaNet: qwen35moe's layout, and its output gate is
// sigmoid (output_gate_type) instead of silu.
// RMSNorm gains are stored as 1 + w (the reference's (1 + w)), ssm_norm as w, ssm_a = -exp(A_log).
#include <cmath>

#include "model/forward_common.h"

namespace strata::model {

namespace {

// Qwen3NextAttention.forward: gated attention, partial NeoX rope, over every sequence of the
// window at once: the cache write and the attention take each sequence's rows with its own cache.
Tensor gated_attention(Window& w, int64_t il, const Tensor& x) {
  const GatedQuery qg = gated_projections(w, il, x);
  const ModelConfig& c = w.c;
  const int64_t d = c.head_dim;
  const std::vector<backend::SequenceCache> caches = sequence_caches(w, il);
  w.be.kv_write_sequences(caches, qg.k, qg.v, w.positions);  // past_key_values.update
  Tensor o = w.tmp(w.T, c.n_head * d);
  w.be.attention_sequences(qg.q, caches, w.positions, c.n_head, c.n_head_kv, d,
                           1.0f / std::sqrt(float(d)), o);
  return gated_output(w, il, o, qg.gate);
}

// The DeltaNet's input projections of x, one matmuls call: qkv and z, then b and a ([T, Gv]
// each, in the value-head order of the file), or Qwen3-Next's in_proj_ba as one tensor (ba_groups
// groups of b then a, which fix_query_key_value_ordering splits).
struct Gates {
  Tensor b, a, ba;
  int64_t ba_groups = 0;
};

Gates input_projections(Window& w, const LayerWeights& L, const Tensor& x, Tensor qkv, Tensor z) {
  const int64_t gv = w.c.ssm_v_heads;
  // in_proj_qkvz -> mixed_qkv = cat(query, key, value) and z
  if (w.c.arch != Arch::Qwen3Next) {
    // in_proj_b(hidden_states), in_proj_a(hidden_states)
    const Gates g{w.tmp(w.T, gv), w.tmp(w.T, gv), {}, 0};
    const backend::Weight* ws[] = {&L.attn_qkv, &L.attn_gate, &L.ssm_beta, &L.ssm_alpha};
    Tensor ys[] = {qkv, z, g.b, g.a};
    w.be.matmuls(ws, x, ys);
    return g;
  }
  const Gates g{{}, {}, w.tmp(w.T, 2 * gv), w.c.ssm_groups};
  const backend::Weight* ws[] = {&L.attn_qkv, &L.attn_gate, &L.ssm_ba};
  Tensor ys[] = {qkv, z, g.ba};
  w.be.matmuls(ws, x, ys);  // ... and in_proj_ba(hidden_states)
  return g;
}

}  // namespace

GatedQuery gated_projections(Window& w, int64_t il, const Tensor& x) {
  const ModelConfig& c = w.c;
  const LayerWeights& L = w.w.layers[size_t(il)];
  backend::Backend& be = w.be;
  const int64_t h = c.n_head, g = c.n_head_kv, d = c.head_dim;
  const float eps = float(c.rms_eps);

  Tensor q_gate = w.tmp(w.T, 2 * h * d), k = w.tmp(w.T, g * d), v = w.tmp(w.T, g * d);
  const backend::Weight* ws[] = {&L.attn_q, &L.attn_k, &L.attn_v};
  Tensor ys[] = {q_gate, k, v};
  be.matmuls(ws, x, ys);  // q_proj, k_proj, v_proj (hidden_states)
  Tensor q = w.tmp(w.T, h * d), gate = w.tmp(w.T, h * d);
  const int64_t widths[] = {d, d};
  Tensor parts[] = {q, gate};
  be.split_groups(q_gate, h, widths, parts);  // torch.chunk(.view(..., head_dim * 2), 2, dim=-1)
  be.rms_norm(q, &L.attn_q_norm, d, eps, q);  // q_norm(query_states)
  be.rms_norm(k, &L.attn_k_norm, d, eps, k);  // k_norm(k_proj(hidden_states))
  be.rope_neox(q, w.positions, d, c.rope_dim, float(c.rope_theta));  // apply_rotary_pos_emb
  be.rope_neox(k, w.positions, d, c.rope_dim, float(c.rope_theta));
  return {q, gate, k, v};
}

GatedQuery gated_query(Window& w, int64_t il, const Tensor& x) {
  const GatedQuery qg = gated_projections(w, il, x);
  LayerState& st = w.state.layers[size_t(il)];
  w.be.kv_write(st.k_cache, st.v_cache, qg.k, qg.v, w.positions);  // past_key_values.update
  return qg;
}

Tensor gated_output(Window& w, int64_t il, Tensor o, const Tensor& gate) {
  w.be.mul_sigmoid(o, gate, o);  // attn_output * torch.sigmoid(gate)
  Tensor out = w.tmp(w.T, w.c.n_embd);
  w.be.matmul(w.w.layers[size_t(il)].attn_output, o, out);  // o_proj(attn_output)
  return out;
}

// Qwen3NextGatedDeltaNet.forward, over every sequence of the window at once: the conv and the
// delta rule take each sequence's rows with its own state.
Tensor gated_delta_net(Window& w, int64_t il, const Tensor& x) {
  const ModelConfig& c = w.c;
  const LayerWeights& L = w.w.layers[size_t(il)];
  backend::Backend& be = w.be;
  const int64_t s = c.ssm_state, gv = c.ssm_v_heads, vd = c.ssm_value_dim();

  Tensor qkv = w.tmp(w.T, c.ssm_conv_dim()), z = w.tmp(w.T, vd);
  const Gates gates = input_projections(w, L, x, qkv, z);
  const backend::HeadRepeat repeat =
      c.arch == Arch::Qwen3Next ? backend::HeadRepeat::Interleaved : backend::HeadRepeat::Tiled;
  const backend::OutputGate gate =
      c.arch == Arch::Qwen4Exp ? backend::OutputGate::Sigmoid : backend::OutputGate::Silu;
  const float q_scale = 1.0f / std::sqrt(float(s));
  Tensor core = w.tmp(w.T, vd);
  const auto conv_states = sequence_states(w, il, &LayerState::conv);
  const auto ssm_states = sequence_states(w, il, &LayerState::ssm);
  const backend::DeltaNetRecurrence r{qkv, conv_states, &L.ssm_conv1d, gates.b, gates.a,
                                      gates.ba, gates.ba_groups, &L.ssm_dt, &L.ssm_a, ssm_states,
                                      gv, s, repeat, 1e-6f, q_scale, &L.ssm_norm,
                                      float(c.rms_eps), z, gate};
  // The conv, the gates, the l2 norms, the delta rule and the gated norm (backend.h,
  // DeltaNetRecurrence). A window of one sequence may be speculative: its journal keeps what a
  // rollback needs, and a dump wants the conv and the core; both watch the ops one by one.
  // Otherwise the recurrence is one op (the same bits), which a backend may run as one launch.
  if (!w.journal && !w.dump_fn) {
    be.delta_net_recurrence(r, core);
  } else {
    LayerState& st = w.state.layers[size_t(il)];
    if (w.journal) w.journal->conv(st.conv, qkv, L.ssm_conv1d, 1);
    backend::DeltaNetTaps taps;
    taps.after_conv = [&](const Tensor& conv) { w.dump("gdn_conv", il, conv); };
    taps.before_rule = [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                           const Tensor& beta) {
      if (w.journal) w.journal->delta_rule(st.ssm, q, k, v, g, beta, gv, repeat);
    };
    taps.after_rule = [&](const Tensor& y) { w.dump("gdn_core", il, y); };
    backend::delta_net_ops(be, r, core, taps);
  }
  Tensor out = w.tmp(w.T, c.n_embd);
  be.matmul(L.ssm_out, core, out);  // out_proj(core_attn_out)
  return out;
}

// Qwen3NextDecoderLayer.forward
void qwen3next_layer(Window& w, int64_t il, Tensor x) {
  const LayerWeights& L = w.w.layers[size_t(il)];
  // input_layernorm(hidden_states), unless the layer before computed it with its residual add
  Tensor h = w.input_norm_layer == il ? w.input_norm : norm(w, x, L.attn_norm);
  w.dump("attn_norm", il, h);
  Tensor a = w.c.is_linear(il) ? gated_delta_net(w, il, h)   // linear_attn(...)
                               : gated_attention(w, il, h);  // self_attn(...)
  w.dump("attn_out", il, a);
  h = add_norm(w, x, a, L.post_attention_norm);  // residual + ...; post_attention_layernorm(...)
  w.dump("ffn_inp", il, x);
  w.dump("ffn_norm", il, h);
  Tensor m = moe(w, il, h, &x);  // residual + mlp(hidden_states)
  w.dump("moe_out", il, m);
}

}  // namespace strata::model
