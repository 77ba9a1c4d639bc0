// strata synth --pack: the plan's routed experts written straight into a `.experts` pack, with
// the same bytes a plain synth followed by `strata pack` gives.
#pragma once

#include <cstdint>
#include <string>

#include "synth/synth.h"
#include "synth/weights.h"

namespace strata {
class ProgressBar;
}

namespace strata::synth {

// Bytes the plan's pack takes (records only; the tables add a few KiB).
uint64_t pack_record_bytes(const SynthPlan& plan);

// Writes the pack of the plan's RoutedExpert stacks to `path`; returns its source id (for the
// trunk GGUF's strata.experts.source_id). `bar` (may be null) advances by the expert bytes.
uint64_t write_synth_pack(const SynthPlan& plan, WeightSource& source, const std::string& path,
                          ProgressBar* bar);

}  // namespace strata::synth
