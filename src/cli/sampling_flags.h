// The sampling flags (--temp, --top-k, --top-p, --min-p, the penalties, --seed) of run and
// bench, onto decode::SamplingParams.
#pragma once

#include <CLI/CLI.hpp>

#include "decode/sampler.h"

namespace strata::cli {

void add_sampling_flags(CLI::App* cmd, decode::SamplingParams& s);

}  // namespace strata::cli
