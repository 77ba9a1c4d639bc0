// qwen4exp: Qwen3.8-Flash-Next (HF model_type qwen4_exp, modeling_qwen4_exp.py). Names follow
// llama.cpp's qwen4exp loader (src/models/qwen4exp.cpp); docs/ARCH_QWEN4EXP.md maps every HF
// parameter to these names and lists the converter's transforms.
//
// The residual is hc_count streams of n_embd (hc_dim wide). There are no per-block norms: each
// block has two hyper-connection mixers (before the token mixer, before the MoE) that norm the
// streams per stream, squeeze them through a low-rank sigmoid gate into one n_embd input, and
// give the weights with which the block's output is injected back into each stream. A final
// mixer (output_hc_*) stands in for the output norm.
#include "model/arch.h"

namespace strata::model {

namespace {

// HF attn_hyper_connection / mlp_hyper_connection (Qwen4ExpTextGatedResidual).
void mixer(SpecList& l, const ModelConfig& c, const std::string& site) {
  const int64_t hc = c.hc_dim(), r = c.hc_lowrank;
  l.blk(site + "_norm.weight", {hc}, Role::Trunk, TypeClass::Vector, Init::Norm);  // hc_norm (1 + w)
  l.blk(site + "_down.weight", {hc, r}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk(site + "_up.weight", {r, hc}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk(site + "_inject.weight", {hc, c.hc_count}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
}

// QSA: gated attention (as qwen3next) plus the indexer that scores mean-pooled key blocks.
void sparse_attention(SpecList& l, const ModelConfig& c) {
  const int64_t n = c.n_embd, hd = c.head_dim, id = c.idx_head_dim;
  l.blk("attn_q.weight", {n, hd * c.n_head * 2}, Role::Trunk, TypeClass::Trunk, Init::Matrix);  // per head [q | gate]
  l.blk("attn_k.weight", {n, hd * c.n_head_kv}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("attn_v.weight", {n, hd * c.n_head_kv}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("attn_output.weight", {hd * c.n_head, n}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("attn_q_norm.weight", {hd}, Role::Trunk, TypeClass::Vector, Init::Norm);
  l.blk("attn_k_norm.weight", {hd}, Role::Trunk, TypeClass::Vector, Init::Norm);
  // HF index_qk_proj [(heads + 1) * id, n], split by the converter into the query heads and the
  // single key head.
  l.blk("indexer.q_proj.weight", {n, c.idx_heads * id}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("indexer.k_proj.weight", {n, id}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("indexer.q_norm.weight", {id}, Role::Trunk, TypeClass::Vector, Init::Norm);
  l.blk("indexer.k_norm.weight", {id}, Role::Trunk, TypeClass::Vector, Init::Norm);
}

// Gated DeltaNet, as qwen35moe stores it (separate beta and alpha projections).
void delta_net(SpecList& l, const ModelConfig& c) {
  const int64_t n = c.n_embd, v = c.ssm_v_heads;
  l.blk("attn_qkv.weight", {n, c.ssm_conv_dim()}, Role::Trunk, TypeClass::Trunk, Init::Matrix);  // in_proj_qkv
  l.blk("attn_gate.weight", {n, c.ssm_value_dim()}, Role::Trunk, TypeClass::Trunk, Init::Matrix);  // in_proj_z
  l.blk("ssm_conv1d.weight", {c.ssm_conv, c.ssm_conv_dim()}, Role::Trunk, TypeClass::Vector, Init::Matrix);
  l.blk("ssm_dt.bias", {v}, Role::Trunk, TypeClass::Vector, Init::SsmDt);
  l.blk("ssm_a", {v}, Role::Trunk, TypeClass::Vector, Init::SsmA);  // -exp(A_log)
  l.blk("ssm_beta.weight", {n, v}, Role::Trunk, TypeClass::Trunk, Init::Matrix);   // in_proj_b
  l.blk("ssm_alpha.weight", {n, v}, Role::Trunk, TypeClass::Trunk, Init::Matrix);  // in_proj_a
  l.blk("ssm_norm.weight", {c.ssm_state}, Role::Trunk, TypeClass::Vector, Init::Norm);  // gated, no +1
  l.blk("ssm_out.weight", {c.ssm_value_dim(), n}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
}

// PLE: hashed n-gram embeddings (rows of the layer's own n-gram table) projected to a
// value and one key per stream; the keys gate the value into each stream, then a dilated causal
// depthwise conv adds local context. Its output is added to the streams before the block.
void ple(SpecList& l, const ModelConfig& c) {
  const int64_t hc = c.hc_dim(), e = c.ple_embed_dim;
  l.blk("ple_key.weight", {e, hc}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("ple_value.weight", {e, c.n_embd}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("ple_norm_key.weight", {hc}, Role::Trunk, TypeClass::Vector, Init::Norm);
  l.blk("ple_norm_query.weight", {hc}, Role::Trunk, TypeClass::Vector, Init::Norm);
  l.blk("ple_norm_conv.weight", {hc}, Role::Trunk, TypeClass::Vector, Init::Norm);
  l.blk("ple_conv1d.weight", {c.ple_conv, hc}, Role::Trunk, TypeClass::Vector, Init::Matrix);  // dilation = ngram_size
}

// 512 routed experts top-10 (softmax, renormalised) plus the sigmoid-gated shared expert. HF
// keeps gate and up fused (gate_up_proj [E, 2F, n]); the converter splits them.
void moe(SpecList& l, const ModelConfig& c) {
  const int64_t n = c.n_embd, f = c.n_ff_exp, e = c.n_expert, fs = c.n_ff_shexp;
  l.blk("ffn_gate_inp.weight", {n, e}, Role::Trunk, TypeClass::Vector, Init::Matrix);
  l.blk("ffn_gate_exps.weight", {n, f, e}, Role::RoutedExpert, TypeClass::Expert, Init::Matrix);
  l.blk("ffn_up_exps.weight", {n, f, e}, Role::RoutedExpert, TypeClass::Expert, Init::Matrix);
  l.blk("ffn_down_exps.weight", {f, n, e}, Role::RoutedExpert, TypeClass::Expert, Init::Matrix);
  // n_ff_exp = 640 is not whole 256-element K/IQ blocks: down rows are zero-padded instead.
  l.pad_last_rows_to_block();
  l.blk("ffn_gate_inp_shexp.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Matrix);
  l.blk("ffn_gate_shexp.weight", {n, fs}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("ffn_up_shexp.weight", {n, fs}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
  l.blk("ffn_down_shexp.weight", {fs, n}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
}

}  // namespace

std::vector<TensorSpec> qwen4exp_tensors(const ModelConfig& c) {
  const int64_t n = c.n_embd, hc = c.hc_dim(), r = c.hc_lowrank;
  SpecList l;
  l.add("token_embd.weight", {n, c.n_vocab}, Role::Embedding, TypeClass::Trunk, Init::Matrix);
  // hyper_connection_mixer: the final mixer, without inject; there is no output_norm.
  l.add("output_hc_norm.weight", {hc}, Role::Output, TypeClass::Vector, Init::Norm);
  l.add("output_hc_down.weight", {hc, r}, Role::Output, TypeClass::Trunk, Init::Matrix);
  l.add("output_hc_up.weight", {r, hc}, Role::Output, TypeClass::Trunk, Init::Matrix);
  l.add("output.weight", {n, c.n_vocab}, Role::Output, TypeClass::Trunk, Init::Matrix, false);
  for (int il = 0; il < c.n_blocks(); ++il) {
    l.at_layer(il);
    if (c.ple_index(il) >= 0) ple(l, c);
    mixer(l, c, "hc_attn");
    if (c.is_linear(il)) {
      delta_net(l, c);
    } else {
      sparse_attention(l, c);
    }
    mixer(l, c, "hc_ffn");
    moe(l, c);
    if (c.is_mtp(il)) {
      // MTP head (checkpoint mtp.*): the next token's embedding (enorm) and the four streams
      // (hnorm) meet in eh_proj (fc_embedding | fc_hidden side by side); the block is a QSA +
      // MoE block with its own mixers, and its own final mixer feeds the shared LM head.
      l.blk("nextn.enorm.weight", {n}, Role::Trunk, TypeClass::Vector, Init::Norm);
      l.blk("nextn.hnorm.weight", {hc}, Role::Trunk, TypeClass::Vector, Init::Norm);
      l.blk("nextn.eh_proj.weight", {2 * n, n}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
      l.blk("nextn.hc_head_norm.weight", {hc}, Role::Trunk, TypeClass::Vector, Init::Norm);
      l.blk("nextn.hc_head_down.weight", {hc, r}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
      l.blk("nextn.hc_head_up.weight", {r, hc}, Role::Trunk, TypeClass::Trunk, Init::Matrix);
    }
  }
  // Each PLE layer's ngram_embedding.weight [rows, head_dim]: every head's rows back to back
  // (head_offsets).
  l.at_layer(-1);
  for (size_t k = 0; k < c.ple_tables.size(); ++k)
    l.add(c.ple_table_name(int64_t(k)), {c.ple_head_dim(), c.ple_tables[k].rows}, Role::NgramTable,
          TypeClass::Ngram, Init::Matrix);
  return l.take();
}

}  // namespace strata::model
