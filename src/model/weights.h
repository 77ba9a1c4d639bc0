// The resident ("trunk") weights of a model as the backend sees them, one field per GGUF tensor
// and named like it (blk.N.attn_q.weight -> LayerWeights::attn_q). Shapes are in ggml ne order
// (ne0 = inputs); n = n_embd, h/g = query/kv heads, d = head_dim, Gk/Gv = DeltaNet k/v heads,
// S = their head dim, K = conv kernel, E = experts, Fs = shared expert width, V = vocab.
// Routed experts are not here: the forward reaches them through experts::ExpertSource.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace strata::gguf {
class Reader;
}

namespace strata::model {

using backend::Weight;

// A weight is absent (an optional tensor, or one another architecture has) when data is null.
inline bool present(const Weight& w) { return w.data != nullptr; }

struct LayerWeights {
  Weight attn_norm;            // [n]
  Weight post_attention_norm;  // [n] (qwen3next family: the norm before the MoE)
  Weight ffn_norm;             // [n] (qwen3moe: the norm before the MoE)

  // Full attention.
  Weight attn_q;       // [n, h*d] (qwen3moe) or [n, 2*h*d], per head [query d | gate d]
  Weight attn_k;       // [n, g*d]
  Weight attn_v;       // [n, g*d]
  Weight attn_output;  // [h*d, n]
  Weight attn_q_norm;  // [d]
  Weight attn_k_norm;  // [d]

  // Gated DeltaNet.
  Weight attn_qkv;    // [n, 2*Gk*S + Gv*S]: [q all k heads | k all k heads | v all v heads]
  Weight attn_gate;   // [n, Gv*S]: z
  Weight ssm_conv1d;  // [K, 2*Gk*S + Gv*S]
  Weight ssm_dt;      // [Gv] (GGUF ssm_dt.bias)
  Weight ssm_a;       // [Gv]: -exp(A_log)
  Weight ssm_ba;      // [n, 2*Gv] (qwen3next): per k head [beta x Gv/Gk | alpha x Gv/Gk]
  Weight ssm_beta;    // [n, Gv] (qwen35moe)
  Weight ssm_alpha;   // [n, Gv] (qwen35moe)
  Weight ssm_norm;    // [S]: the gated RMSNorm's gain (stored as is, no +1)
  Weight ssm_out;     // [Gv*S, n]

  // MoE router and shared expert.
  Weight ffn_gate_inp;        // [n, E] (F32)
  Weight ffn_gate_inp_shexp;  // [n]: the shared expert's scalar sigmoid gate
  Weight ffn_gate_shexp;      // [n, Fs]
  Weight ffn_up_shexp;        // [n, Fs]
  Weight ffn_down_shexp;      // [Fs, n]

  // MTP (NextN) block extras (qwen35moe; qwen4exp: hnorm [H] and the head's own mixer).
  Weight nextn_eh_proj;  // [2n, n]
  Weight nextn_enorm;    // [n]
  Weight nextn_hnorm;    // [n]
  Weight nextn_shared_head_norm;  // [n] (qwen35moe, optional: absent, output_norm stands in)
  Weight nextn_hc_head_norm, nextn_hc_head_down, nextn_hc_head_up;

  // qwen4exp hyper-connection mixers before the token mixer (attn) and the MoE (ffn); H = hc*n,
  // r = hc_lowrank.
  Weight hc_attn_norm, hc_ffn_norm;      // [H]: per stream gains
  Weight hc_attn_down, hc_ffn_down;      // [H, r]
  Weight hc_attn_up, hc_ffn_up;          // [r, H]
  Weight hc_attn_inject, hc_ffn_inject;  // [H, hc]

  // qwen4exp QSA indexer (hi heads and one key head of di).
  Weight indexer_q_proj;  // [n, hi*di]
  Weight indexer_k_proj;  // [n, di]
  Weight indexer_q_norm;  // [di]
  Weight indexer_k_norm;  // [di]

  // qwen4exp PLE layer (P = ple_embed_dim).
  Weight ple_key;         // [P, H]
  Weight ple_value;       // [P, n]
  Weight ple_norm_key, ple_norm_query, ple_norm_conv;  // [H]
  Weight ple_conv1d;      // [K, H], dilation ngram_size
};

struct Weights {
  Weight token_embd;                 // [n, V]
  Weight output_norm;                // [n]
  Weight output;                     // [n, V]; token_embd when the file has none (tied)
  Weight output_hc_norm, output_hc_down, output_hc_up;  // qwen4exp's final mixer
  std::vector<Weight> ple_tables;  // qwen4exp: each PLE layer's n-gram table, [P/heads, rows]
  std::vector<LayerWeights> layers;  // n_blocks()
};

// Prepares every non-expert tensor of tensor_specs(config) through backend.weight(). Throws
// strata::Error naming the tensor when a norm/vector weight is not F32 (the ops take F32 gains)
// or a tensor has no field (an architecture whose forward strata does not have yet).
Weights load_weights(const gguf::Reader& reader, const ModelConfig& config,
                     backend::Backend& backend);

}  // namespace strata::model
