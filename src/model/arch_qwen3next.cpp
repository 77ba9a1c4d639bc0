// qwen3next (Qwen3-Next-80B-A3B) and qwen35moe (Qwen3.5 MoE): every 4th block is gated full
// attention, the others Gated DeltaNet; each block ends in a 512-way top-10 MoE plus a
// sigmoid-gated shared expert. The two differ only in the DeltaNet beta/alpha projections (one
// fused ssm_ba in qwen3next, ssm_beta + ssm_alpha in qwen35moe) and in MTP, which only
// qwen35moe's llama.cpp loader knows. Names, shapes and optionality are those of llama.cpp's
// loaders (src/models/qwen3next.cpp, qwen35moe.cpp); see docs/ARCHITECTURES.md.
#include "model/arch.h"

namespace strata::model {

namespace {

// Gated attention: attn_q holds per head [query head_dim | gate head_dim]; the gate goes through
// a sigmoid and multiplies the attention output. (llama.cpp would also take a fused attn_qkv, but
// the qwen3next graph of older builds reads wq/wk/wv only, so we write them apart.)
void attention(SpecList& l, const ModelConfig& c) {
  const int64_t n = c.n_embd, hd = c.head_dim;
  l.blk("attn_q.weight", {n, hd * c.n_head * 2}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("attn_k.weight", {n, hd * c.n_head_kv}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("attn_v.weight", {n, hd * c.n_head_kv}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("attn_output.weight", {hd * c.n_head, n}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("attn_q_norm.weight", {hd}, Role::Trunk, TypeClass::Vector, Init::Norm);
  l.blk("attn_k_norm.weight", {hd}, Role::Trunk, TypeClass::Vector, Init::Norm);
}

// Gated DeltaNet. attn_qkv rows are [q (k heads x state) | k (same) | v (v heads x state)], the
// converter's reordering of HF's per-k-head interleaved in_proj_qkvz; attn_gate is z.
void delta_net(SpecList& l, const ModelConfig& c) {
  const int64_t n = c.n_embd, v = c.ssm_v_heads;
  l.blk("attn_qkv.weight", {n, c.ssm_conv_dim()}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("attn_gate.weight", {n, c.ssm_value_dim()}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  // HF conv1d.weight [conv_dim, 1, K] squeezed to 2-D.
  l.blk("ssm_conv1d.weight", {c.ssm_conv, c.ssm_conv_dim()}, Role::Trunk, TypeClass::Vector, Init::Matrix);
  l.blk("ssm_dt.bias", {v}, Role::Trunk, TypeClass::Vector, Init::SsmDt);
  // No ".weight" suffix; the converter stores -exp(A_log).
  l.blk("ssm_a", {v}, Role::Trunk, TypeClass::Vector, Init::SsmA);
  if (c.arch == Arch::Qwen3Next) {
    // Per k-head group [beta x (v/k) | alpha x (v/k)].
    l.blk("ssm_ba.weight", {n, 2 * v}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  } else {
    l.blk("ssm_beta.weight", {n, v}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
    l.blk("ssm_alpha.weight", {n, v}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  }
  // Gated RMSNorm over each v head; stored as is (no +1: HF initialises it to ones).
  l.blk("ssm_norm.weight", {c.ssm_state}, Role::Trunk, TypeClass::Vector, Init::Norm);
  l.blk("ssm_out.weight", {c.ssm_value_dim(), n}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
}

void moe(SpecList& l, const ModelConfig& c) {
  const int64_t n = c.n_embd, f = c.n_ff_exp, e = c.n_expert, fs = c.n_ff_shexp;
  l.blk("ffn_gate_inp.weight", {n, e}, Role::Trunk, TypeClass::Vector, Init::Matrix);
  l.blk("ffn_gate_exps.weight", {n, f, e}, Role::RoutedExpert, TypeClass::Expert, Init::Matrix);
  l.blk("ffn_up_exps.weight", {n, f, e}, Role::RoutedExpert, TypeClass::Expert, Init::Matrix);
  l.blk("ffn_down_exps.weight", {f, n, e}, Role::RoutedExpert, TypeClass::Expert, Init::Matrix);
  // HF shared_expert_gate [1, n]: a scalar sigmoid gate per token.
  l.blk("ffn_gate_inp_shexp.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Matrix);
  l.blk("ffn_gate_shexp.weight", {n, fs}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("ffn_up_shexp.weight", {n, fs}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("ffn_down_shexp.weight", {fs, n}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
}

}  // namespace

std::vector<TensorSpec> qwen3next_tensors(const ModelConfig& c) {
  const int64_t n = c.n_embd;
  SpecList l;
  l.add("token_embd.weight", {n, c.n_vocab}, Role::Embedding, TypeClass::Trunk, Init::Matrix);
  l.add("output_norm.weight", {n}, Role::Output, TypeClass::Vector, Init::Norm);
  l.add("output.weight", {n, c.n_vocab}, Role::Output, TypeClass::Trunk, Init::Matrix, false);
  for (int il = 0; il < c.n_blocks(); ++il) {
    l.at_layer(il);
    // RMSNorm gains, stored as 1 + w by the converter.
    l.blk("attn_norm.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Norm);
    l.blk("post_attention_norm.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Norm);
    if (c.is_linear(il)) {
      delta_net(l, c);
    } else {
      attention(l, c);
    }
    moe(l, c);
    if (c.is_mtp(il)) {
      // qwen35moe's NextN block: a full-attention MoE block fed by eh_proj(concat(enorm(embed
      // of the next token), hnorm(hidden))).
      l.blk("nextn.eh_proj.weight", {2 * n, n}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
      l.blk("nextn.enorm.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Norm);
      l.blk("nextn.hnorm.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Norm);
      // The head's final norm (checkpoint mtp.norm) before the shared LM head; optional in
      // llama.cpp, and older strata files lack it (the head then uses output_norm).
      l.blk("nextn.shared_head_norm.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Norm, false);
    }
  }
  return l.take();
}

}  // namespace strata::model
