// `strata synth`: writes a GGUF model of a real architecture and shape with synthetic weights, so
// benchmarks and tests need no download. Values are valid blocks of the requested formats scaled
// so activations stay near unit scale through the whole network; the tokenizer is a generated
// byte-level BPE or one loaded from a Hugging Face tokenizer.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/arch.h"
#include "model/config.h"
#include "quant/types.h"
#include "tokenizer/vocab.h"

namespace strata::synth {

struct SynthOptions {
  std::string arch = "qwen4exp";
  std::string preset = "tiny";
  // Common overrides, applied before the --set list (which is applied in order).
  std::optional<int64_t> layers, experts, experts_used, hidden, vocab_size;
  std::vector<std::pair<std::string, std::string>> sets;
  // Type names as parse_type takes them; empty = the preset's default.
  std::string trunk_type, expert_type, ngram_type;
  // Used for a tensor whose row length the requested type's block does not divide (llama-quantize
  // falls back the same way); "none" makes that an error instead.
  std::string fallback_type = "q4_0";
  uint64_t seed = 0;
  std::string tokenizer_json;
  bool ngram_full = false;
  std::string output;
  // Also write the routed experts as OUTPUT.experts (a pack) and leave them out of the GGUF, which
  // names the pack in strata.experts.pack: one copy of the experts on disk (docs/PACK.md).
  bool pack = false;
  bool progress = true;
};

// What will be written: the final config, the tensor list and each tensor's type.
struct SynthPlan {
  model::ModelConfig config;
  std::vector<model::TensorSpec> specs;  // shapes as stored (model::stored_shape)
  std::vector<quant::Type> types;
  std::vector<std::string> notes;  // one line per tensor that fell back to another type or padded
  tokenizer::Vocab vocab;          // exactly config.n_vocab tokens
  uint64_t data_bytes = 0;
};

// Builds the config and resolves the types; throws strata::Error on any bad option, naming the
// flag (or the tensor and its dims for a type that does not fit).
SynthPlan plan_synth(const SynthOptions& opts);

struct SynthReport {
  SynthPlan plan;
  uint64_t file_bytes = 0;
  uint64_t pack_bytes = 0;  // with options.pack
  double seconds = 0;
};

// Plans, checks free disk space, writes options.output (and with options.pack its pack). Throws
// strata::Error.
SynthReport run_synth(const SynthOptions& opts);

}  // namespace strata::synth
