// qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B): pre-norm attention with q/k RMSNorm, then a
// softmax top-k MoE without a shared expert. Names and shapes are those llama.cpp's loader
// creates (src/models/qwen3moe.cpp); see docs/ARCHITECTURES.md.
#include "model/arch.h"

namespace strata::model {

std::vector<TensorSpec> qwen3moe_tensors(const ModelConfig& c) {
  const int64_t n = c.n_embd, hd = c.head_dim;
  SpecList l;
  l.add("token_embd.weight", {n, c.n_vocab}, Role::Embedding, TypeClass::Trunk, Init::Matrix);
  l.add("output_norm.weight", {n}, Role::Output, TypeClass::Vector, Init::Norm);
  // Optional in llama.cpp (it ties token_embd in); Qwen3 MoE models ship an untied head.
  l.add("output.weight", {n, c.n_vocab}, Role::Output, TypeClass::Trunk, Init::Matrix, false);
  for (int il = 0; il < c.n_layer; ++il) {
    l.at_layer(il);
    l.blk("attn_norm.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Norm);
    l.blk("attn_q.weight", {n, hd * c.n_head}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
    l.blk("attn_k.weight", {n, hd * c.n_head_kv}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
    l.blk("attn_v.weight", {n, hd * c.n_head_kv}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
    l.blk("attn_output.weight", {hd * c.n_head, n}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
    l.blk("attn_q_norm.weight", {hd}, Role::Trunk, TypeClass::Vector, Init::Norm);
    l.blk("attn_k_norm.weight", {hd}, Role::Trunk, TypeClass::Vector, Init::Norm);
    l.blk("ffn_norm.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Norm);
    // The router: llama-quantize keeps it F32.
    l.blk("ffn_gate_inp.weight", {n, c.n_expert}, Role::Trunk, TypeClass::Vector, Init::Matrix);
    l.blk("ffn_gate_exps.weight", {n, c.n_ff_exp, c.n_expert}, Role::RoutedExpert, TypeClass::Expert, Init::Matrix);
    l.blk("ffn_down_exps.weight", {c.n_ff_exp, n, c.n_expert}, Role::RoutedExpert, TypeClass::Expert, Init::Matrix);
    l.blk("ffn_up_exps.weight", {n, c.n_ff_exp, c.n_expert}, Role::RoutedExpert, TypeClass::Expert, Init::Matrix);
  }
  return l.take();
}

}  // namespace strata::model
