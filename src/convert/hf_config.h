// A Hugging Face config.json turned into strata's ModelConfig: which architecture (model_type
// qwen3_moe, qwen3_next, qwen3_5_moe[_text], qwen4_exp[_text], or a VL wrapper whose text_config
// is one of them) and every hparam the GGUF carries. Settings the GGUF architectures cannot
// express (dense layers, attention biases, un-normalised top-k) are errors, not silent changes.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace strata::convert {

struct HfConfig {
  model::ModelConfig config;  // n_mtp as the config declares it; not finalized or validated
  std::string model_type;     // the text model's, as written
  bool tied_embeddings = false;
  int64_t eos_token_id = -1;  // the first one when the config lists several; -1: none
  int64_t fp8_block_rows = 128, fp8_block_cols = 128;  // quantization_config.weight_block_size
  std::vector<std::string> notes;  // settings read with a default or not carried over
};

// Reads path (a config.json). Throws strata::Error naming the file and the key.
HfConfig read_hf_config(const std::string& path);

// The HF model_type values read_hf_config accepts, for messages.
const char* supported_model_types();

}  // namespace strata::convert
