// strata bench's PLE flags (docs/PERFORMANCE.md, "PLE rows issued early"): whether a window issues
// the reads of its qwen4exp n-gram rows before layer 0, and a cold page cache for the n-gram
// tables; and what the PLE row reads cost, per token, in the bench JSON.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "model/model.h"

namespace strata::cli {

struct PleFlags {
  std::string prefetch = "on";  // --ple-prefetch on|off
  bool cold = false;            // --ple-cold
};

void add_ple_flags(CLI::App* cmd, PleFlags& flags);

// Sets the model's PLE prefetch, and with --ple-cold drops the n-gram tables' pages from the page
// cache and turns off the kernel's read-around on them, so that every row the run gathers comes
// from the disk, as with a table far larger than RAM. Throws strata::Error for --ple-cold on a
// model without PLE or a file it cannot advise.
void apply_ple_flags(const PleFlags& flags, model::Model& m);

// The flags and the PLE row reads between two readings of the counters, per token.
nlohmann::ordered_json ple_json(const PleFlags& flags, int64_t tokens,
                                const model::PleCounters& before, const model::PleCounters& after);

}  // namespace strata::cli
