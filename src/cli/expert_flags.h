// The expert-cache flags every command that runs a model takes (`run`, `serve`, `bench`,
// `profile`; docs/EXPERT_CACHE.md), and how they become experts::SourceOptions.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "experts/expert_source.h"

namespace strata::cli {

struct ExpertFlags {
  std::string budget;             // --expert-budget as given ("8G"); empty: the default rule
  std::string pack;               // --pack; empty: the model's own
  std::string read_ahead = "on";  // --read-ahead on|off
  std::string memory_limit;       // --memory-limit as given; empty: the cgroup's, if any
  std::string host_budget;        // --host-budget as given; empty: the default rule
  std::string host_fill = "on";   // --host-fill on|off
};

void add_expert_flags(CLI::App* cmd, ExpertFlags& flags);

// Throws strata::Error naming --expert-budget or --memory-limit when it does not parse. With STRATA_IO_FAULTS set
// in the environment (a test hook, experts/io_fault.h) the pack's reads get injected faults.
experts::SourceOptions source_options(const ExpertFlags& flags);

// Prints what STRATA_IO_FAULTS injected, when it is set (at the end of run and serve).
void report_io_faults();

}  // namespace strata::cli
