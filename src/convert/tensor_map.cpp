#include "convert/tensor_map.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "util/error.h"

namespace strata::convert {

namespace {

using model::Arch;
using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Gated DeltaNet value heads: HF groups them by key head (head h = g * r + j for key head g);
// llama.cpp's qwen35moe converter (and so qwen4exp, which shares it) re-orders them to the tiled
// order (slot j * Gk + g) so ggml can broadcast key heads with a plain repeat. qwen3next keeps HF's.
bool v_heads_tiled(const model::ModelConfig& c) {
  return (c.arch == Arch::Qwen35Moe || c.arch == Arch::Qwen4Exp) && c.ssm_v_heads != c.ssm_groups;
}

}  // namespace

// Collects one plan's sources and pieces.
class TensorMapper::Builder {
 public:
  Builder(TensorMapper& m, TensorPlan& p) : m_(m), p_(p) {}

  bool has(const std::string& name) const { return m_.by_name_.count(name) != 0; }

  // Adds HF tensor `name`, which must have torch shape `want`; returns its source index.
  int src(const std::string& name, const Shape& want) {
    const auto it = m_.by_name_.find(name);
    if (it == m_.by_name_.end())
      fail("missing HF tensor ", name, " ", shape_str(want), " (needed for ", p_.spec.name, ")");
    const StTensor* t = it->second;
    if (t->shape != want)
      fail("HF tensor ", name, " (", *t->file, ") has shape ", t->shape_string(), "; ", p_.spec.name,
           " needs ", shape_str(want));
    if (t->dtype != DType::F32 && t->dtype != DType::F16 && t->dtype != DType::BF16 && t->dtype != DType::F8_E4M3)
      fail("HF tensor ", name, " (", *t->file, ") is ", dtype_name(t->dtype), "; weights must be F32, F16, BF16 or F8_E4M3");
    Source s;
    s.weight = t;
    s.cols = want.empty() ? 1 : want.back();
    s.rows = t->n_elements() / std::max<int64_t>(1, s.cols);
    s.inner_rows = want.size() >= 2 ? want[want.size() - 2] : 1;
    s.block_rows = m_.opt_.fp8_block_rows;
    s.block_cols = m_.opt_.fp8_block_cols;
    if (t->dtype == DType::F8_E4M3) {
      const std::string sname = name + "_scale_inv";
      Shape sw(want.begin(), want.end());
      if (sw.size() < 2) fail("HF tensor ", name, " is F8_E4M3 but 1-D; FP8 block scales need a matrix");
      sw[sw.size() - 2] = (s.inner_rows + s.block_rows - 1) / s.block_rows;
      sw.back() = (s.cols + s.block_cols - 1) / s.block_cols;
      const auto sc = m_.by_name_.find(sname);
      if (sc == m_.by_name_.end()) fail("HF tensor ", name, " is F8_E4M3 but ", sname, " (its block scales) is missing");
      if (sc->second->shape != sw)
        fail("HF tensor ", sname, " has shape ", sc->second->shape_string(), "; the ", s.block_rows, "x",
             s.block_cols, " blocks of ", name, " ", shape_str(want), " need ", shape_str(sw));
      if (sc->second->dtype == DType::F8_E4M3 || sc->second->dtype == DType::I64 || sc->second->dtype == DType::I32)
        fail("HF tensor ", sname, " is ", dtype_name(sc->second->dtype), "; scales must be F32, F16 or BF16");
      s.scale = sc->second;
      m_.used_.insert(sname);
    }
    m_.used_.insert(name);
    p_.sources.push_back(s);
    return int(p_.sources.size()) - 1;
  }

  void piece(int s, int64_t src_row, int64_t nrows, int64_t src_col, int64_t ncols, int64_t dst_row,
             int64_t dst_col) {
    p_.pieces.push_back({s, src_row, nrows, src_col, ncols, dst_row, dst_col});
  }

  // The whole source, as the whole output (a plain copy, or a squeeze / flatten).
  void copy(const std::string& name, const Shape& want, Transform tr = Transform::None) {
    const int s = src(name, want);
    piece(s, 0, p_.sources[s].rows, 0, p_.sources[s].cols, 0, 0);
    p_.transform = tr;
  }

  // Row blocks of `unit` rows (or column blocks of `unit` columns) in the tiled value-head order
  // when the architecture uses it, else as they are.
  void heads(int s, int64_t src_base, int64_t dst_base, int64_t unit, bool by_columns) {
    const model::ModelConfig& c = m_.c_;
    const int64_t gk = c.ssm_groups, r = c.ssm_v_heads / c.ssm_groups;
    const bool tiled = v_heads_tiled(c);
    const Source& sr = p_.sources[s];
    for (int64_t slot = 0; slot < c.ssm_v_heads; ++slot) {
      const int64_t h = tiled ? (slot % gk) * r + slot / gk : slot;
      if (by_columns) piece(s, 0, sr.rows, src_base + h * unit, unit, 0, dst_base + slot * unit);
      else piece(s, src_base + h * unit, unit, 0, sr.cols, dst_base + slot * unit, 0);
    }
  }

 private:
  TensorMapper& m_;
  TensorPlan& p_;
};

TensorMapper::TensorMapper(const Checkpoint& ckpt, const model::ModelConfig& config, MapOptions options)
    : c_(config), opt_(options) {
  for (const auto& [raw, t] : ckpt.tensors()) {
    std::string name = raw;
    if (starts_with(name, "model.language_model.")) name = "model." + name.substr(21);
    if (starts_with(name, "model.visual.") || starts_with(name, "visual.")) {
      set_aside(name, "vision tensors (model.visual.*; a text engine has no vision tower)");
      continue;
    }
    if (ends_with(name, ".rotary_emb.inv_freq")) {
      set_aside(name, "rotary inv_freq buffers (recomputed from rope.freq_base)");
      continue;
    }
    if (starts_with(name, "mtp.") && c_.n_mtp == 0) {
      set_aside(name, "MTP tensors (mtp.*) not written: --no-mtp, or the GGUF architecture has no MTP block");
      continue;
    }
    by_name_.emplace(name, t);
  }
}

void TensorMapper::set_aside(const std::string& name, const std::string& why) { aside_.emplace_back(name, why); }

int64_t TensorMapper::mtp_layers_in(const Checkpoint& ckpt) {
  int64_t n = 0;
  for (const auto& [name, t] : ckpt.tensors()) {
    if (!starts_with(name, "mtp.layers.")) continue;
    const int64_t i = std::atoll(name.c_str() + 11);
    n = std::max(n, i + 1);
  }
  return n;
}

// The int64 hash constants of a PLE layer must be the ones ModelConfig::finalize derives (the
// GGUF carries those); a checkpoint made with another seed or table size would hash differently.
void TensorMapper::check_ple_buffers(const std::string& prefix, const model::ModelConfig::PleTable& table) {
  const std::pair<const char*, const std::vector<uint64_t>*> bufs[] = {
      {"layer_multipliers", &table.multipliers},
      {"ngram_heads_offsets", &table.head_offsets},
      {"ngram_heads_vocab_sizes", &table.head_sizes},
  };
  for (const auto& [suffix, want] : bufs) {
    const std::string name = prefix + suffix;
    const auto it = by_name_.find(name);
    if (it == by_name_.end()) continue;
    const StTensor* t = it->second;
    if (t->dtype != DType::I64 || t->shape != Shape{int64_t(want->size())})
      fail("HF buffer ", name, " is ", dtype_name(t->dtype), " ", t->shape_string(), ", expected I64 [", want->size(), "]");
    for (size_t i = 0; i < want->size(); ++i) {
      int64_t v;
      std::memcpy(&v, t->data + 8 * i, 8);
      if (uint64_t(v) != (*want)[i])
        fail("HF buffer ", name, "[", i, "] = ", v, ", but the config (seed, ngram_vocab_size_base, "
             "vocab) gives ", (*want)[i], ": the config does not describe this checkpoint");
    }
    used_.insert(name);
  }
}

int64_t TensorMapper::ple_table_index(const std::string& name) const {
  for (size_t k = 0; k < c_.ple_tables.size(); ++k)
    if (name == c_.ple_table_name(int64_t(k))) return int64_t(k);
  return -1;
}

TensorPlan TensorMapper::plan(const model::TensorSpec& spec) {
  TensorPlan p;
  p.spec = spec;
  p.cols = spec.shape[0];
  p.rows = 1;
  for (size_t i = 1; i < spec.shape.size(); ++i) p.rows *= spec.shape[i];
  Builder b(*this, p);
  const model::ModelConfig& c = c_;
  const int64_t n = c.n_embd, hd = c.head_dim, V = c.n_vocab, hc = c.hc_dim(), r = c.hc_lowrank;
  const bool plus = c.arch != Arch::Qwen3Moe;  // (1 + w) RMSNorm gains everywhere but qwen3moe
  const Transform norm_tr = plus ? Transform::PlusOne : Transform::None;
  const std::string& name = spec.name;

  if (spec.layer < 0) {
    if (name == "token_embd.weight") b.copy("model.embed_tokens.weight", {V, n});
    else if (name == "output.weight") {
      if (!b.has("lm_head.weight") && opt_.tied_embeddings) p.present = false;
      else b.copy("lm_head.weight", {V, n});
    } else if (name == "output_norm.weight") b.copy("model.norm.weight", {n}, norm_tr);
    else if (name == "output_hc_norm.weight") b.copy("model.hyper_connection_mixer.hc_norm.weight", {hc}, Transform::PlusOne);
    else if (name == "output_hc_down.weight") b.copy("model.hyper_connection_mixer.input_mix_weight_down.weight", {r, hc});
    else if (name == "output_hc_up.weight") b.copy("model.hyper_connection_mixer.input_mix_weight_up.weight", {hc, r});
    else if (const int64_t k = ple_table_index(name); k >= 0) {
      const model::ModelConfig::PleTable& table = c.ple_tables[size_t(k)];
      const std::string base = cat("model.layers.", c.ple_layers[size_t(k)], ".ple.ple_embedding.");
      check_ple_buffers(base, table);
      const int64_t dim = c.ple_head_dim();
      if (b.has(base + "ngram_embedding.weight")) {
        b.copy(base + "ngram_embedding.weight", {table.rows, dim});
      } else {
        // Checkpoint row shards (split_ngram_parts), concatenated in index order.
        int64_t row = 0;
        for (int k = 0; b.has(cat(base, "ngram_embedding.shard_", k, ".weight")); ++k) {
          const std::string shard = cat(base, "ngram_embedding.shard_", k, ".weight");
          const int64_t rows = by_name_.at(shard)->shape.empty() ? 0 : by_name_.at(shard)->shape[0];
          const int s = b.src(shard, {rows, dim});
          b.piece(s, 0, rows, 0, dim, row, 0);
          row += rows;
        }
        if (row != table.rows)
          fail(name, ": the n-gram table shards (", base, "ngram_embedding.shard_N.weight) hold ", row,
               " rows; the config gives ", table.rows);
      }
    } else {
      fail("internal error: no HF mapping for ", name);
    }
    return p;
  }

  const int il = spec.layer;
  const bool mtp = c.is_mtp(il);
  const std::string P = mtp ? cat("mtp.layers.", il - c.n_layer, ".") : cat("model.layers.", il, ".");
  const std::string t = name.substr(name.find('.', 4) + 1);  // after "blk.N."
  const std::string A = P + "self_attn.", L = P + "linear_attn.", M = P + "mlp.";
  const int64_t E = c.n_expert, F = c.n_ff_exp, Fs = c.n_ff_shexp;
  const int64_t gk = c.ssm_groups, S = c.ssm_state, gv = c.ssm_v_heads, rv = gk > 0 ? gv / gk : 0;

  if (t == "attn_norm.weight") b.copy(P + "input_layernorm.weight", {n}, norm_tr);
  else if (t == "post_attention_norm.weight" || t == "ffn_norm.weight") b.copy(P + "post_attention_layernorm.weight", {n}, norm_tr);
  else if (t == "attn_q.weight") b.copy(A + "q_proj.weight", {spec.shape[1], n});
  else if (t == "attn_k.weight") b.copy(A + "k_proj.weight", {hd * c.n_head_kv, n});
  else if (t == "attn_v.weight") b.copy(A + "v_proj.weight", {hd * c.n_head_kv, n});
  else if (t == "attn_output.weight") b.copy(A + "o_proj.weight", {n, hd * c.n_head});
  else if (t == "attn_q_norm.weight") b.copy(A + "q_norm.weight", {hd}, norm_tr);
  else if (t == "attn_k_norm.weight") b.copy(A + "k_norm.weight", {hd}, norm_tr);
  else if (t == "ffn_gate_inp.weight") b.copy(M + "gate.weight", {E, n});
  else if (t == "ffn_gate_exps.weight" || t == "ffn_up_exps.weight" || t == "ffn_down_exps.weight") {
    const bool down = t == "ffn_down_exps.weight";
    const std::string which = t.substr(4, t.find('_', 4) - 4);  // gate, up, down
    const std::string fused = M + "experts." + (down ? "down_proj" : "gate_up_proj");
    const std::string fused_name = b.has(fused) ? fused : fused + ".weight";
    if (b.has(fused_name)) {
      // transformers' fused runtime layout: gate_up_proj [E, 2F, n] (gate rows first), down_proj [E, n, F].
      const int s = b.src(fused_name, down ? Shape{E, n, F} : Shape{E, 2 * F, n});
      if (down) b.piece(s, 0, E * n, 0, F, 0, 0);
      for (int64_t e = 0; !down && e < E; ++e) b.piece(s, e * 2 * F + (which == "up" ? F : 0), F, 0, n, e * F, 0);
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const int s = b.src(cat(M, "experts.", e, ".", which, "_proj.weight"), down ? Shape{n, F} : Shape{F, n});
        b.piece(s, 0, down ? n : F, 0, down ? F : n, e * (down ? n : F), 0);
      }
    }
  } else if (t == "ffn_gate_inp_shexp.weight") b.copy(M + "shared_expert_gate.weight", {1, n});
  else if (t == "ffn_gate_shexp.weight") b.copy(M + "shared_expert.gate_proj.weight", {Fs, n});
  else if (t == "ffn_up_shexp.weight") b.copy(M + "shared_expert.up_proj.weight", {Fs, n});
  else if (t == "ffn_down_shexp.weight") b.copy(M + "shared_expert.down_proj.weight", {n, Fs});
  // Gated DeltaNet.
  else if ((t == "attn_qkv.weight" || t == "attn_gate.weight") && c.arch == Arch::Qwen3Next) {
    // in_proj_qkvz rows per key head g: [q S | k S | v r*S | z r*S]; out: [all q | all k | all v], z.
    const int64_t blk = 2 * S + 2 * rv * S;
    const int s = b.src(L + "in_proj_qkvz.weight", {gk * blk, n});
    for (int64_t g = 0; g < gk; ++g) {
      if (t == "attn_gate.weight") {
        b.piece(s, g * blk + 2 * S + rv * S, rv * S, 0, n, g * rv * S, 0);
        continue;
      }
      b.piece(s, g * blk, S, 0, n, g * S, 0);
      b.piece(s, g * blk + S, S, 0, n, gk * S + g * S, 0);
      b.piece(s, g * blk + 2 * S, rv * S, 0, n, 2 * gk * S + g * rv * S, 0);
    }
  } else if (t == "attn_qkv.weight") {
    const int s = b.src(L + "in_proj_qkv.weight", {c.ssm_conv_dim(), n});
    b.piece(s, 0, 2 * gk * S, 0, n, 0, 0);
    b.heads(s, 2 * gk * S, 2 * gk * S, S, false);
  } else if (t == "attn_gate.weight") b.heads(b.src(L + "in_proj_z.weight", {gv * S, n}), 0, 0, S, false);
  else if (t == "ssm_ba.weight") b.copy(L + "in_proj_ba.weight", {2 * gv, n});
  else if (t == "ssm_beta.weight") b.heads(b.src(L + "in_proj_b.weight", {gv, n}), 0, 0, 1, false);
  else if (t == "ssm_alpha.weight") b.heads(b.src(L + "in_proj_a.weight", {gv, n}), 0, 0, 1, false);
  else if (t == "ssm_conv1d.weight") {
    const int s = b.src(L + "conv1d.weight", {c.ssm_conv_dim(), 1, c.ssm_conv});
    b.piece(s, 0, 2 * gk * S, 0, c.ssm_conv, 0, 0);
    b.heads(s, 2 * gk * S, 2 * gk * S, S, false);
  } else if (t == "ssm_dt.bias") b.heads(b.src(L + "dt_bias", {gv}), 0, 0, 1, true);
  else if (t == "ssm_a") {
    b.heads(b.src(L + "A_log", {gv}), 0, 0, 1, true);
    p.transform = Transform::NegExp;
  } else if (t == "ssm_norm.weight") b.copy(L + "norm.weight", {S});  // gated norm: w, not 1 + w
  else if (t == "ssm_out.weight") b.heads(b.src(L + "out_proj.weight", {n, gv * S}), 0, 0, S, true);
  // qwen4exp: hyper-connection mixers, QSA indexer, PLE.
  else if (starts_with(t, "hc_attn_") || starts_with(t, "hc_ffn_")) {
    const std::string mixer = P + (starts_with(t, "hc_attn_") ? "attn" : "mlp") + "_hyper_connection.";
    const std::string part = t.substr(t.find('_', 3) + 1);
    if (part == "norm.weight") b.copy(mixer + "hc_norm.weight", {hc}, Transform::PlusOne);
    else if (part == "down.weight") b.copy(mixer + "input_mix_weight_down.weight", {r, hc});
    else if (part == "up.weight") b.copy(mixer + "input_mix_weight_up.weight", {hc, r});
    else b.copy(mixer + "block_inject_weight.weight", {c.hc_count, hc});
  } else if (t == "indexer.q_proj.weight" || t == "indexer.k_proj.weight") {
    const int64_t id = c.idx_head_dim, qrows = c.idx_heads * id;
    const int s = b.src(A + "indexer.index_qk_proj.weight", {qrows + id, n});
    if (t == "indexer.q_proj.weight") b.piece(s, 0, qrows, 0, n, 0, 0);
    else b.piece(s, qrows, id, 0, n, 0, 0);
  } else if (t == "indexer.q_norm.weight") b.copy(A + "indexer.q_layernorm.weight", {c.idx_head_dim}, Transform::PlusOne);
  else if (t == "indexer.k_norm.weight") b.copy(A + "indexer.k_layernorm.weight", {c.idx_head_dim}, Transform::PlusOne);
  else if (t == "ple_key.weight") b.copy(P + "ple.key_proj.weight", {hc, c.ple_embed_dim});
  else if (t == "ple_value.weight") b.copy(P + "ple.value_proj.weight", {n, c.ple_embed_dim});
  else if (t == "ple_norm_key.weight") b.copy(P + "ple.norm_key.weight", {hc}, Transform::PlusOne);
  else if (t == "ple_norm_query.weight") b.copy(P + "ple.norm_query.weight", {hc}, Transform::PlusOne);
  else if (t == "ple_norm_conv.weight") b.copy(P + "ple.norm_conv.weight", {hc}, Transform::PlusOne);
  else if (t == "ple_conv1d.weight") b.copy(P + "ple.conv1d.weight", {hc, 1, c.ple_conv});
  // MTP (NextN) head.
  else if (t == "nextn.enorm.weight") b.copy("mtp.pre_fc_norm_embedding.weight", {n}, Transform::PlusOne);
  else if (t == "nextn.shared_head_norm.weight") b.copy("mtp.norm.weight", {n}, Transform::PlusOne);
  else if (t == "nextn.hnorm.weight") b.copy("mtp.pre_fc_norm_hidden.weight", {spec.shape[0]}, Transform::PlusOne);
  else if (t == "nextn.eh_proj.weight" && c.arch == Arch::Qwen4Exp) {
    // fc_embedding and fc_hidden side by side: one matmul over concat(embedding, hidden).
    const int se = b.src("mtp.fc_embedding.weight", {n, n});
    const int sh = b.src("mtp.fc_hidden.weight", {n, n});
    b.piece(se, 0, n, 0, n, 0, 0);
    b.piece(sh, 0, n, 0, n, 0, n);
  } else if (t == "nextn.eh_proj.weight") b.copy("mtp.fc.weight", {n, 2 * n});
  else if (t == "nextn.hc_head_norm.weight") b.copy("mtp.hyper_connection_mixer.hc_norm.weight", {hc}, Transform::PlusOne);
  else if (t == "nextn.hc_head_down.weight") b.copy("mtp.hyper_connection_mixer.input_mix_weight_down.weight", {r, hc});
  else if (t == "nextn.hc_head_up.weight") b.copy("mtp.hyper_connection_mixer.input_mix_weight_up.weight", {hc, r});
  else fail("internal error: no HF mapping for ", name);

  int64_t covered = 0;
  for (const Piece& pc : p.pieces) covered += pc.nrows * pc.ncols;
  if (p.present && covered != p.rows * p.cols)
    fail("internal error: the pieces of ", name, " cover ", covered, " of ", p.rows * p.cols, " elements");
  return p;
}

std::vector<std::string> TensorMapper::unused() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : by_name_)
    if (!used_.count(name)) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> TensorMapper::skipped() const {
  std::map<std::string, int64_t> count;
  for (const auto& [name, why] : aside_) ++count[why];
  std::vector<std::string> out;
  for (const auto& [why, k] : count) out.push_back(cat("skipped ", k, " ", why));
  return out;
}

std::vector<TensorPlan> plan_all(const Checkpoint& ckpt, const model::ModelConfig& config,
                                 const MapOptions& options, std::vector<std::string>& notes) {
  TensorMapper m(ckpt, config, options);
  std::vector<TensorPlan> plans;
  for (const auto& spec : model::tensor_specs(config)) plans.push_back(m.plan(spec));
  const auto left = m.unused();
  if (!left.empty()) {
    std::string list;
    for (size_t i = 0; i < left.size() && i < 20; ++i) list += "\n  " + left[i];
    if (left.size() > 20) list += cat("\n  ... and ", left.size() - 20, " more");
    fail(left.size(), " HF tensor(s) have no place in the ", model::arch_name(config.arch),
         " GGUF (nothing is dropped silently; is config.json the checkpoint's?):", list);
  }
  for (auto& s : m.skipped()) notes.push_back(std::move(s));
  return plans;
}

}  // namespace strata::convert
