// Named model shapes for `strata synth --preset`. docs/ARCHITECTURES.md gives the source of
// every number.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "quant/types.h"

namespace strata::synth {

struct Preset {
  model::ModelConfig config;
  // Default tensor types (the --trunk-type / --expert-type / --ngram-type flags override them).
  quant::Type trunk_type;
  quant::Type expert_type;
  quant::Type ngram_type;
};

// Throws strata::Error naming the known presets. ngram_full keeps the reference's full n-gram
// vocabulary (ngram_vocab_base 20,000,000) instead of the preset's default.
Preset make_preset(std::string_view name, model::Arch arch, bool ngram_full);
std::vector<std::string> preset_names();

}  // namespace strata::synth
