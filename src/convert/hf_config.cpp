#include "convert/hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace strata::convert {

namespace {

using nlohmann::json;
using model::Arch;

// Typed look-ups that name the file and key on a missing or mistyped value.
class Keys {
 public:
  Keys(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  const json& at(const char* k) const {
    if (!has(k)) fail(where_, ": missing ", k);
    return j_[k];
  }
  int64_t i64(const char* k) const {
    const json& v = at(k);
    if (!v.is_number_integer()) fail(where_, ": ", k, " must be an integer, found ", v.dump());
    return v.get<int64_t>();
  }
  int64_t i64(const char* k, int64_t fallback) const { return has(k) ? i64(k) : fallback; }
  double f64(const char* k, double fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_number()) fail(where_, ": ", k, " must be a number, found ", j_[k].dump());
    return j_[k].get<double>();
  }
  bool flag(const char* k, bool fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_boolean()) fail(where_, ": ", k, " must be true or false");
    return j_[k].get<bool>();
  }
  std::vector<int64_t> ints(const char* k) const {
    std::vector<int64_t> out;
    if (!has(k)) return out;
    if (!j_[k].is_array()) fail(where_, ": ", k, " must be a list of integers");
    for (const auto& v : j_[k]) {
      if (!v.is_number_integer()) fail(where_, ": ", k, " must be a list of integers");
      out.push_back(v.get<int64_t>());
    }
    return out;
  }
  const json& raw() const { return j_; }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
};

Arch arch_of(const std::string& model_type, const std::string& where) {
  if (model_type == "qwen3_moe") return Arch::Qwen3Moe;
  if (model_type == "qwen3_next") return Arch::Qwen3Next;
  if (model_type == "qwen3_5_moe" || model_type == "qwen3_5_moe_text") return Arch::Qwen35Moe;
  if (model_type == "qwen4_exp" || model_type == "qwen4_exp_text") return Arch::Qwen4Exp;
  fail(where, ": model_type '", model_type, "' is not supported (supported: ", supported_model_types(), ")");
}

// Rope: transformers 5 nests it in rope_parameters; older configs have top-level keys and
// rope_scaling (which also carried mrope_section).
void read_rope(const Keys& t, HfConfig& h) {
  model::ModelConfig& c = h.config;
  const json empty = json::object();
  const json& rp = t.has("rope_parameters") ? t.at("rope_parameters") : empty;
  const json& rs = t.has("rope_scaling") ? t.at("rope_scaling") : empty;
  const Keys r(rp.is_object() ? rp : empty, t.where() + " rope_parameters");
  const Keys s(rs.is_object() ? rs : empty, t.where() + " rope_scaling");
  c.rope_theta = r.f64("rope_theta", t.f64("rope_theta", 1e4));
  const double partial_default = c.arch == Arch::Qwen3Moe ? 1.0 : 0.25;
  const double partial = r.f64("partial_rotary_factor", t.f64("partial_rotary_factor", partial_default));
  c.rope_dim = int64_t(std::lround(double(c.head_dim) * partial));
  for (const Keys* k : {&r, &s}) {
    const std::string type = k->has("rope_type") && k->at("rope_type").is_string()
                                 ? k->at("rope_type").get<std::string>() : "default";
    if (type != "default")
      h.notes.push_back(cat("rope type '", type, "' is not carried into the GGUF (plain rope is used)"));
  }
  std::vector<int64_t> sections = r.ints("mrope_section");
  if (sections.empty()) sections = s.ints("mrope_section");
  if (sections.size() > 4) fail(t.where(), ": mrope_section has more than 4 entries");
  if (c.arch == Arch::Qwen35Moe || c.arch == Arch::Qwen4Exp) {
    if (sections.empty()) {
      // Text positions rotate every section alike, so one section covering all pairs is exact.
      sections = {c.rope_dim / 2};
      h.notes.push_back(cat("no mrope_section in the config: rope.dimension_sections = [",
                            c.rope_dim / 2, ", 0, 0, 0]"));
    }
    for (size_t i = 0; i < sections.size(); ++i) c.rope_sections[i] = sections[i];
  }
}

// layer_types (or full_attention_interval) must be the periodic pattern the GGUF key describes.
void read_layer_pattern(const Keys& t, model::ModelConfig& c) {
  c.full_attn_interval = t.i64("full_attention_interval", 0);
  std::vector<std::string> types;
  if (t.has("layer_types")) {
    for (const auto& v : t.at("layer_types")) {
      if (!v.is_string()) fail(t.where(), ": layer_types must be a list of strings");
      types.push_back(v.get<std::string>());
    }
    if (int64_t(types.size()) != c.n_layer)
      fail(t.where(), ": layer_types has ", types.size(), " entries for ", c.n_layer, " layers");
    if (c.full_attn_interval == 0)
      for (size_t i = 0; i < types.size() && c.full_attn_interval == 0; ++i)
        if (types[i] != "linear_attention") c.full_attn_interval = int64_t(i) + 1;
  }
  if (c.full_attn_interval == 0) c.full_attn_interval = 4;
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string& ty = types[i];
    if (ty != "linear_attention" && ty != "full_attention" && ty != "qwen_sparse_attention")
      fail(t.where(), ": layer_types[", i, "] is '", ty, "' (expected linear_attention, full_attention or qwen_sparse_attention)");
    if ((ty == "linear_attention") != c.is_linear(int64_t(i)))
      fail(t.where(), ": layer_types do not follow one full-attention layer every ", c.full_attn_interval,
           " (layer ", i, " is ", ty, "), which is the only pattern the GGUF can describe");
  }
}

void read_qwen4exp(const Keys& t, const Keys& top, HfConfig& h) {
  model::ModelConfig& c = h.config;
  c.hc_count = t.i64("hc_count");
  c.hc_lowrank = t.i64("hc_lowrank");
  c.idx_heads = t.i64("indexer_n_heads");
  c.idx_head_dim = t.i64("indexer_head_dim");
  c.idx_top_k = t.i64("indexer_budget");
  c.idx_block = t.i64("indexer_compress_ratio");
  if (t.i64("indexer_kv_heads", 1) != 1) fail(t.where(), ": indexer_kv_heads must be 1 (one shared index key head)");
  // ple_layer_ids are 1-based; each listed layer gets its own n-gram table.
  for (int64_t id : t.ints("ple_layer_ids")) c.ple_layers.push_back(id - 1);
  c.ple_ngram = t.i64("ngram_size", 3);
  c.ple_heads_per_ngram = t.i64("heads_per_ngram", 8);
  c.ple_embed_dim = t.i64("ple_embed_dim", 0);
  c.ple_conv = t.i64("ple_conv_kernel_size", 4);
  c.ngram_vocab_base = t.i64("ngram_vocab_size_base", 20000000);
  c.ngram_vocab_divisor = t.i64("make_ngram_vocab_size_divisible_by", 128);
  c.ple_seed = t.i64("seed", 1234);
  // The reference resets n-grams on the first eos id when the config lists several.
  if (h.eos_token_id < 0 && c.has_ple())
    fail(t.where(), ": eos_token_id is required with PLE (the n-gram hash resets on it)");
  c.ple_eos = std::max<int64_t>(h.eos_token_id, 0);
  c.image_token = top.i64("image_token_id", t.i64("image_token_id", 0));
}

}  // namespace

const char* supported_model_types() {
  return "qwen3_moe, qwen3_next, qwen3_5_moe, qwen3_5_moe_text, qwen4_exp, qwen4_exp_text";
}

HfConfig read_hf_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open (a Hugging Face model folder has a config.json)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(path, ": must be a JSON object");
  const Keys top(j, path);
  const bool wrapped = top.has("text_config");
  if (wrapped && !top.at("text_config").is_object()) fail(path, ": text_config must be an object");
  const Keys t(wrapped ? top.at("text_config") : j, wrapped ? path + " text_config" : path);

  HfConfig h;
  const json& mt = t.has("model_type") ? t.at("model_type") : top.at("model_type");
  if (!mt.is_string()) fail(path, ": model_type must be a string");
  h.model_type = mt.get<std::string>();
  model::ModelConfig& c = h.config;
  c.arch = arch_of(h.model_type, path);
  c.n_vocab = t.i64("vocab_size");
  c.n_embd = t.i64("hidden_size");
  c.n_layer = t.i64("num_hidden_layers");
  c.n_ctx = t.i64("max_position_embeddings");
  c.rms_eps = t.f64("rms_norm_eps", 1e-6);
  c.n_head = t.i64("num_attention_heads");
  c.n_head_kv = t.i64("num_key_value_heads", c.n_head);
  c.head_dim = t.i64("head_dim", c.n_head > 0 ? c.n_embd / c.n_head : 0);
  c.n_ff = t.i64("intermediate_size", 0);
  c.n_expert = t.has("num_experts") ? t.i64("num_experts") : t.i64("num_local_experts");
  c.n_expert_used = t.i64("num_experts_per_tok");
  c.n_ff_exp = t.i64("moe_intermediate_size");
  c.n_mtp = t.i64("mtp_num_hidden_layers", t.i64("num_nextn_predict_layers", 0));
  for (const Keys* k : {&t, &top}) {
    if (h.eos_token_id >= 0 || !k->has("eos_token_id")) continue;
    const json& e = k->at("eos_token_id");
    if (e.is_array() && !e.empty() && e[0].is_number_integer()) h.eos_token_id = e[0].get<int64_t>();
    else if (!e.is_array()) h.eos_token_id = k->i64("eos_token_id");
  }
  h.tied_embeddings = t.flag("tie_word_embeddings", top.flag("tie_word_embeddings", false));
  read_rope(t, h);

  if (!t.flag("norm_topk_prob", true))
    fail(path, ": norm_topk_prob false is not supported: the GGUF architectures always renormalise the top-k weights");
  if (t.flag("attention_bias", false)) fail(path, ": attention_bias true is not supported (the GGUF lists no biases)");
  if (t.i64("decoder_sparse_step", 1) != 1 || !t.ints("mlp_only_layers").empty())
    fail(path, ": dense (non-MoE) layers (decoder_sparse_step != 1 or mlp_only_layers) are not supported");

  if (model::has_gdn(c.arch)) {
    c.n_ff_shexp = t.i64("shared_expert_intermediate_size");
    c.ssm_conv = t.i64("linear_conv_kernel_dim");
    c.ssm_state = t.i64("linear_key_head_dim");
    if (t.i64("linear_value_head_dim", c.ssm_state) != c.ssm_state)
      fail(path, ": linear_value_head_dim must equal linear_key_head_dim (the GGUF has one ssm.state_size)");
    c.ssm_groups = t.i64("linear_num_key_heads");
    c.ssm_v_heads = t.i64("linear_num_value_heads");
    read_layer_pattern(t, c);
  }
  if (c.arch == Arch::Qwen4Exp) read_qwen4exp(t, top, h);

  if (top.has("quantization_config")) {
    const Keys q(top.at("quantization_config"), path + " quantization_config");
    const std::vector<int64_t> block = q.ints("weight_block_size");
    if (block.size() == 2) {
      h.fp8_block_rows = block[0];
      h.fp8_block_cols = block[1];
    }
    if (h.fp8_block_rows <= 0 || h.fp8_block_cols <= 0) fail(path, ": weight_block_size must be positive");
  }
  return h;
}

}  // namespace strata::convert
