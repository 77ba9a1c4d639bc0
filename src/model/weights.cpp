#include "model/weights.h"

#include <string_view>

#include "gguf/gguf.h"
#include "model/arch.h"
#include "util/error.h"

namespace strata::model {

namespace {

struct Field {
  std::string_view name;  // after "blk.N."
  Weight LayerWeights::*member;
};

const Field kLayerFields[] = {
    {"attn_norm.weight", &LayerWeights::attn_norm},
    {"post_attention_norm.weight", &LayerWeights::post_attention_norm},
    {"ffn_norm.weight", &LayerWeights::ffn_norm},
    {"attn_q.weight", &LayerWeights::attn_q},
    {"attn_k.weight", &LayerWeights::attn_k},
    {"attn_v.weight", &LayerWeights::attn_v},
    {"attn_output.weight", &LayerWeights::attn_output},
    {"attn_q_norm.weight", &LayerWeights::attn_q_norm},
    {"attn_k_norm.weight", &LayerWeights::attn_k_norm},
    {"attn_qkv.weight", &LayerWeights::attn_qkv},
    {"attn_gate.weight", &LayerWeights::attn_gate},
    {"ssm_conv1d.weight", &LayerWeights::ssm_conv1d},
    {"ssm_dt.bias", &LayerWeights::ssm_dt},
    {"ssm_a", &LayerWeights::ssm_a},
    {"ssm_ba.weight", &LayerWeights::ssm_ba},
    {"ssm_beta.weight", &LayerWeights::ssm_beta},
    {"ssm_alpha.weight", &LayerWeights::ssm_alpha},
    {"ssm_norm.weight", &LayerWeights::ssm_norm},
    {"ssm_out.weight", &LayerWeights::ssm_out},
    {"ffn_gate_inp.weight", &LayerWeights::ffn_gate_inp},
    {"ffn_gate_inp_shexp.weight", &LayerWeights::ffn_gate_inp_shexp},
    {"ffn_gate_shexp.weight", &LayerWeights::ffn_gate_shexp},
    {"ffn_up_shexp.weight", &LayerWeights::ffn_up_shexp},
    {"ffn_down_shexp.weight", &LayerWeights::ffn_down_shexp},
    {"nextn.eh_proj.weight", &LayerWeights::nextn_eh_proj},
    {"nextn.enorm.weight", &LayerWeights::nextn_enorm},
    {"nextn.hnorm.weight", &LayerWeights::nextn_hnorm},
    {"nextn.shared_head_norm.weight", &LayerWeights::nextn_shared_head_norm},
    {"nextn.hc_head_norm.weight", &LayerWeights::nextn_hc_head_norm},
    {"nextn.hc_head_down.weight", &LayerWeights::nextn_hc_head_down},
    {"nextn.hc_head_up.weight", &LayerWeights::nextn_hc_head_up},
    {"hc_attn_norm.weight", &LayerWeights::hc_attn_norm},
    {"hc_attn_down.weight", &LayerWeights::hc_attn_down},
    {"hc_attn_up.weight", &LayerWeights::hc_attn_up},
    {"hc_attn_inject.weight", &LayerWeights::hc_attn_inject},
    {"hc_ffn_norm.weight", &LayerWeights::hc_ffn_norm},
    {"hc_ffn_down.weight", &LayerWeights::hc_ffn_down},
    {"hc_ffn_up.weight", &LayerWeights::hc_ffn_up},
    {"hc_ffn_inject.weight", &LayerWeights::hc_ffn_inject},
    {"indexer.q_proj.weight", &LayerWeights::indexer_q_proj},
    {"indexer.k_proj.weight", &LayerWeights::indexer_k_proj},
    {"indexer.q_norm.weight", &LayerWeights::indexer_q_norm},
    {"indexer.k_norm.weight", &LayerWeights::indexer_k_norm},
    {"ple_key.weight", &LayerWeights::ple_key},
    {"ple_value.weight", &LayerWeights::ple_value},
    {"ple_norm_key.weight", &LayerWeights::ple_norm_key},
    {"ple_norm_query.weight", &LayerWeights::ple_norm_query},
    {"ple_norm_conv.weight", &LayerWeights::ple_norm_conv},
    {"ple_conv1d.weight", &LayerWeights::ple_conv1d},
};

Weight* global_field(Weights& w, const ModelConfig& c, std::string_view name) {
  if (name == "token_embd.weight") return &w.token_embd;
  if (name == "output_norm.weight") return &w.output_norm;
  if (name == "output.weight") return &w.output;
  if (name == "output_hc_norm.weight") return &w.output_hc_norm;
  if (name == "output_hc_down.weight") return &w.output_hc_down;
  if (name == "output_hc_up.weight") return &w.output_hc_up;
  for (size_t k = 0; k < w.ple_tables.size(); ++k)
    if (name == c.ple_table_name(int64_t(k))) return &w.ple_tables[k];
  return nullptr;
}

Weight* layer_field(LayerWeights& l, std::string_view suffix) {
  for (const Field& f : kLayerFields)
    if (f.name == suffix) return &(l.*f.member);
  return nullptr;
}

}  // namespace

Weights load_weights(const gguf::Reader& reader, const ModelConfig& c, backend::Backend& be) {
  Weights w;
  w.layers.resize(size_t(c.n_blocks()));
  w.ple_tables.resize(c.ple_tables.size());
  for (const TensorSpec& spec : tensor_specs(c)) {
    if (spec.role == Role::RoutedExpert) continue;  // experts::ExpertSource owns them
    const gguf::TensorInfo* t = reader.find_tensor(spec.name);
    if (!t) continue;  // an optional tensor validate_tensors let through
    Weight* field = nullptr;
    if (spec.layer < 0) {
      field = global_field(w, c, spec.name);
    } else {
      const std::string prefix = cat("blk.", spec.layer, ".");
      field = layer_field(w.layers[size_t(spec.layer)],
                          std::string_view(spec.name).substr(prefix.size()));
    }
    if (!field)
      fail(reader.path(), ": tensor ", spec.name, " has no place in strata's ", arch_name(c.arch),
           " weights (its forward pass is not implemented)");
    if (spec.cls == TypeClass::Vector && t->type != quant::Type::F32)
      fail(reader.path(), ": tensor ", spec.name, " is ", quant::type_name(t->type),
           "; strata needs norm and vector tensors in f32 (as llama.cpp's converter writes them)");
    *field = be.weight(*t);
  }
  if (!present(w.output)) w.output = w.token_embd;
  return w;
}

}  // namespace strata::model
