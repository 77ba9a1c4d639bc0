// qwen4exp forward (Qwen3.8-Flash-Next), following transformers' modeling_qwen4_exp.py
// (Qwen4ExpTextDecoderLayer, Qwen4ExpTextGatedResidual). The residual is hc_count streams of
// n_embd side by side ([T, hc_dim]); a block reads them through a hyper-connection mixer and
// injects its output back into every stream with per-stream weights. PLE (ple.cpp) adds hashed
// n-gram features to the streams before its layers; attention layers are QSA (qsa.cpp); the
// DeltaNet and the MoE are qwen3next's (tiled value heads, sigmoid output gate).
// RMSNorm gains are stored as 1 + w (the reference's (1 + w)).
#include "model/qwen4exp.h"

namespace strata::model {

namespace {

// The four tensors of one Qwen4ExpTextGatedResidual; inject is absent in the final mixer.
struct Mixer {
  const Weight& norm;
  const Weight& down;
  const Weight& up;
  const Weight* inject;
};

// Qwen4ExpTextGatedResidual.forward: returns mixed_input [T, n]; with inject, *inject_logits
// receives block_inject_weight(normed), [T, hc] (injection weights = 2 sigmoid of it / hc_count).
Tensor mix(Window& w, const Tensor& x, const Mixer& m, Tensor* inject_logits) {
  backend::Backend& be = w.be;
  const int64_t n = w.c.n_embd, hc = w.c.hc_count, rows = x.rows;
  const Tensor xn = norm_streams(w, x, m.norm);  // hc_norm(hyper_input)
  // input_mix_weight_down(normed) and block_inject_weight(normed): one activation, one launch
  Tensor low = w.tmp(rows, w.c.hc_lowrank);
  if (m.inject) {
    *inject_logits = w.tmp(rows, hc);
    const Weight* weights[] = {&m.down, m.inject};
    Tensor outs[] = {low, *inject_logits};
    be.matmuls(weights, xn, outs);
  } else {
    be.matmul(m.down, xn, low);
  }
  be.scaled_silu(low, 1.0f / float(hc), low);  // silu(... / hc_count)
  // (sigmoid(input_mix_weight_up(...)) * normed).mean over the streams
  Tensor up = w.tmp(rows, hc * n), mixed = w.tmp(rows, n);
  be.matmul(m.up, low, up);
  be.mean_mul_sigmoid_streams(xn, up, hc, mixed);
  return mixed;
}

// hidden_states = hyper_input + (out.unsqueeze(-2) * injection_weights.unsqueeze(-1)).flatten(-2),
// injection_weights = 2 sigmoid(inject_logits / hc_count)
void inject(Window& w, Tensor x, const Tensor& out, Tensor inject_logits) {
  w.be.inject_streams(x, out, inject_logits, 1.0f / float(w.c.hc_count));
}

}  // namespace

Tensor norm_streams(Window& w, const Tensor& x, const Weight& gain) {
  Tensor y = w.tmp(x.rows, x.cols);
  // Each stream of n_embd columns normed alone, with its own n_embd of the gains.
  w.be.rms_norm(x, &gain, w.c.n_embd, float(w.c.rms_eps), y);
  return y;
}

// Qwen4ExpTextDecoderLayer.forward
void qwen4exp_layer(Window& w, int64_t il, Tensor x) {
  const LayerWeights& L = w.w.layers[size_t(il)];
  if (w.c.ple_index(il) >= 0) {
    // hidden_states + self.ple(hidden_states, ple_input_ids, ...)
    Tensor p = per_sequence(w, x, [il](Window& s, const Tensor& rows) { return ple_layer(s, il, rows); });
    w.dump("ple_out", il, p);
    w.be.add(x, p, x);
  }
  Tensor z;
  Tensor h = mix(w, x, {L.hc_attn_norm, L.hc_attn_down, L.hc_attn_up, &L.hc_attn_inject}, &z);
  w.dump("attn_mix", il, h);
  Tensor a = w.c.is_linear(il)
                 ? gated_delta_net(w, il, h)  // linear_attn(...)
                 : per_sequence(w, h, [il](Window& s, const Tensor& rows) {
                     return sparse_attention(s, il, rows);  // self_attn(...)
                   });
  w.dump("attn_out", il, a);
  inject(w, x, a, z);
  h = mix(w, x, {L.hc_ffn_norm, L.hc_ffn_down, L.hc_ffn_up, &L.hc_ffn_inject}, &z);
  w.dump("ffn_mix", il, h);
  Tensor m = moe(w, il, h);  // mlp(hidden_states)
  w.dump("moe_out", il, m);
  inject(w, x, m, z);
}

// MTP head input (docs/SPECULATION.md, "The MTP head"): stream s of the block's input is
// eh_proj(concat(enorm(embedding), hnorm(streams)_s)), i.e. fc_embedding(e) + fc_hidden(h_s).
void qwen4exp_mtp_input(Window& w, const LayerWeights& L, const Tensor& e, const Tensor& streams, Tensor x) {
  const int64_t n = w.c.n_embd;
  Tensor cat = w.tmp(e.rows, 2 * n), stream = w.tmp(e.rows, n);
  w.be.rms_norm(e, &L.nextn_enorm, n, float(w.c.rms_eps), cat.cols_view(0, n));
  const Tensor hn = norm_streams(w, streams, L.nextn_hnorm);
  for (int64_t s = 0; s < w.c.hc_count; ++s) {
    w.be.copy(hn.cols_view(s * n, n), cat.cols_view(n, n));
    w.be.matmul(L.nextn_eh_proj, cat, stream);
    w.be.copy(stream, x.cols_view(s * n, n));
  }
}

// The MTP head's own final mixer (nextn.hc_head_*), as the trunk's feeds the LM head.
Tensor qwen4exp_mtp_output(Window& w, const LayerWeights& L, const Tensor& x) {
  return mix(w, x, {L.nextn_hc_head_norm, L.nextn_hc_head_down, L.nextn_hc_head_up, nullptr}, nullptr);
}

// Qwen4ExpTextModel.forward: hidden_states = self.hyper_connection_mixer(hidden_states)
Tensor qwen4exp_output(Window& w, const Tensor& x) {
  return mix(w, x, {w.w.output_hc_norm, w.w.output_hc_down, w.w.output_hc_up, nullptr}, nullptr);
}

}  // namespace strata::model
