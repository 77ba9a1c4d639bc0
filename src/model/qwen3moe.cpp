// qwen3moe forward, following transformers' modeling_qwen3_moe.py (Qwen3MoeDecoderLayer): pre-norm
// attention with per-head q/k RMSNorm and full NeoX rope, then a softmax top-k MoE. GGUF norms
// are the reference's plain gains (docs/ARCHITECTURES.md).
#include <cmath>

#include "model/forward_common.h"

namespace strata::model {

namespace {

// Qwen3MoeAttention.forward, over every sequence of the window at once: the cache write and the
// attention take each sequence's rows with its own cache.
Tensor attention(Window& w, int64_t il, const Tensor& x) {
  const ModelConfig& c = w.c;
  const LayerWeights& L = w.w.layers[size_t(il)];
  backend::Backend& be = w.be;
  const int64_t h = c.n_head, g = c.n_head_kv, d = c.head_dim;
  const float eps = float(c.rms_eps);

  Tensor q = w.tmp(w.T, h * d), k = w.tmp(w.T, g * d), v = w.tmp(w.T, g * d);
  const backend::Weight* ws[] = {&L.attn_q, &L.attn_k, &L.attn_v};
  Tensor ys[] = {q, k, v};
  be.matmuls(ws, x, ys);                      // q_proj, k_proj, v_proj (hidden_states)
  be.rms_norm(q, &L.attn_q_norm, d, eps, q);  // q_norm(q_proj(hidden_states).view(hidden_shape))
  be.rms_norm(k, &L.attn_k_norm, d, eps, k);  // k_norm(k_proj(hidden_states).view(hidden_shape))
  be.rope_neox(q, w.positions, d, c.rope_dim, float(c.rope_theta));  // apply_rotary_pos_emb
  be.rope_neox(k, w.positions, d, c.rope_dim, float(c.rope_theta));
  // Each sequence's rows with its own cache.
  const std::vector<backend::SequenceCache> caches = sequence_caches(w, il);
  be.kv_write_sequences(caches, k, v, w.positions);  // past_key_values.update
  Tensor o = w.tmp(w.T, h * d);
  be.attention_sequences(q, caches, w.positions, c.n_head, c.n_head_kv, d,
                         1.0f / std::sqrt(float(d)), o);  // scaling
  Tensor out = w.tmp(w.T, c.n_embd);
  be.matmul(L.attn_output, o, out);  // o_proj(attn_output)
  return out;
}

}  // namespace

// Qwen3MoeDecoderLayer.forward
void qwen3moe_layer(Window& w, int64_t il, Tensor x) {
  const LayerWeights& L = w.w.layers[size_t(il)];
  Tensor h = norm(w, x, L.attn_norm);  // input_layernorm(hidden_states)
  w.dump("attn_norm", il, h);
  Tensor a = attention(w, il, h);  // self_attn(...)
  w.dump("attn_out", il, a);
  h = add_norm(w, x, a, L.ffn_norm);  // residual + ...; post_attention_layernorm(...)
  w.dump("ffn_inp", il, x);
  w.dump("ffn_norm", il, h);
  Tensor m = moe(w, il, h);  // mlp(hidden_states)
  w.dump("moe_out", il, m);
  w.be.add(x, m, x);  // residual + hidden_states
}

}  // namespace strata::model
