// The speculative-decoding flags of `run`, `serve` and `bench` (docs/SPECULATION.md).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "spec/speculator.h"

namespace strata::cli {

struct SpecFlags {
  std::string mode = "auto";  // --spec off|mtp|suffix|auto
  int depth = -1;             // --spec-depth N (-1: SpecGate chooses)
  int max_depth = 4;          // --spec-max-depth
  bool typical = false;       // --spec-typical
  double mtp_acceptance = 0;  // --mtp-acceptance (bench only)
  int64_t draft_vocab = -1;   // --draft-vocab (-1: the backend's default)
};

// with_knob: also --mtp-acceptance (strata bench).
void add_spec_flags(CLI::App* cmd, SpecFlags& flags, bool with_knob = false);

// Throws strata::Error naming the flag that is out of range. An `auto` mode on a model without
// an MTP block drafts from the suffix drafter alone.
spec::Options spec_options(const SpecFlags& flags);

}  // namespace strata::cli
