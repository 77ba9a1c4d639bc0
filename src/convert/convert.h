// `strata convert`: a Hugging Face model folder (config.json, safetensors in F32/F16/BF16 or FP8
// with 128x128 block scales, tokenizer.json) to one GGUF file of the matching architecture,
// quantizing on the way. The tensor list is tensor_specs(config), walked in order; each tensor is
// assembled and written chunk by chunk, so memory stays near one chunk (64 MiB of fp32), not the
// model. docs/CONVERT.md has the options and every transform.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "convert/tensor_map.h"
#include "model/config.h"
#include "quant/types.h"

namespace strata::convert {

struct ConvertOptions {
  std::string input_dir;
  std::string output;
  // Type names as quant::parse_type takes them (f32, bf16, q8_0, q4_k, fp8...).
  std::string trunk_type = "q8_0";
  std::string expert_type = "q4_k";
  std::string ngram_type = "q8_0";
  // For a tensor whose row length the requested type's block does not divide; "none" makes that
  // an error instead.
  std::string fallback_type = "f16";
  bool mtp = true;        // write the MTP (NextN) block when the checkpoint and architecture have one
  bool progress = true;
  uint64_t vocab_seed = 0;  // for the generated vocabulary of a folder without tokenizer.json
};

struct ConvertReport {
  model::ModelConfig config;
  std::vector<std::string> notes;  // warnings and fallbacks, one line each
  size_t tensors = 0;
  uint64_t file_bytes = 0;
  uint64_t fp8_exact = 0;  // tensors re-blocked from FP8 codes without requantizing
  double seconds = 0;
};

// Converts; throws strata::Error naming the file, tensor and problem. Nothing is written under
// options.output unless the whole conversion succeeds.
ConvertReport run_convert(const ConvertOptions& options);

// The type a tensor is written in: Vector tensors F32, others the requested type of their class,
// or the fallback (with a note) when ne0 is not a multiple of the requested type's block.
quant::Type resolve_tensor_type(const model::TensorSpec& spec, quant::Type requested,
                                std::optional<quant::Type> fallback, std::vector<std::string>& notes);

}  // namespace strata::convert
