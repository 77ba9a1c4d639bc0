#include "cli/expert_flags.h"

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "experts/arena.h"
#include "experts/io_fault.h"
#include "util/error.h"

namespace strata::cli {

namespace {

// The process's fault injector, made by the first source_options() call when STRATA_IO_FAULTS
// is set; null otherwise.
std::unique_ptr<experts::FaultInjector> g_io_faults;

experts::FaultInjector* io_faults() {
  static const bool made = [] {
    const char* spec = std::getenv("STRATA_IO_FAULTS");
    if (!spec) return false;
    g_io_faults = std::make_unique<experts::FaultInjector>(experts::parse_fault_rates(spec));
    std::fprintf(stderr, "[strata] STRATA_IO_FAULTS=%s: injecting faults into expert reads\n", spec);
    return true;
  }();
  return made ? g_io_faults.get() : nullptr;
}

}  // namespace

void add_expert_flags(CLI::App* cmd, ExpertFlags& flags) {
  cmd->add_option("--expert-budget", flags.budget,
                  "Expert cache size (8G, 512M): stream the routed experts from the pack "
                  "through a cache of this size (default: from free memory, when they do not fit)");
  cmd->add_option("--read-ahead", flags.read_ahead,
                  "Guess the next layer's experts and start reading them early (on|off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--memory-limit", flags.memory_limit,
                  "Memory the trunk, the expert cache, the readers and the activations must fit in (11G); "
                  "sizes the default expert budget (default: the cgroup's limit, when one is set)");
  cmd->add_option("--host-budget", flags.host_budget,
                  "Host tier size (32G, 0 for none) with --device cuda: pinned RAM between the device's "
                  "expert cache and the pack; its misses are copied from there instead of read (default: "
                  "the pack, at most half of free RAM, when it does not fit the device budget)");
  cmd->add_option("--host-fill", flags.host_fill, "Read the pack into the host tier at start-up (on|off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--pack", flags.pack,
                  "The .experts pack (default: the model's strata.experts.pack or MODEL.experts)");
}

experts::SourceOptions source_options(const ExpertFlags& flags) {
  experts::SourceOptions o;
  o.pack = flags.pack;
  o.read_ahead = flags.read_ahead == "on";
  o.host_fill = flags.host_fill == "on";
  if (experts::FaultInjector* faults = io_faults())
    o.io_wrapper = [faults](std::unique_ptr<experts::FileIo> io) { return faults->wrap(std::move(io)); };
  if (!flags.budget.empty()) {
    try {
      o.budget_bytes = experts::parse_byte_size(flags.budget);
    } catch (const Error& e) {
      fail("--expert-budget: ", e.what());
    }
  }
  if (!flags.host_budget.empty()) {
    try {
      o.host_budget_bytes = experts::parse_byte_size(flags.host_budget);
    } catch (const Error& e) {
      fail("--host-budget: ", e.what());
    }
  }
  if (!flags.memory_limit.empty()) {
    try {
      o.memory_limit = experts::parse_byte_size(flags.memory_limit);
    } catch (const Error& e) {
      fail("--memory-limit: ", e.what());
    }
    if (*o.memory_limit == 0) fail("--memory-limit: '", flags.memory_limit, "' is zero; give the memory to stay within (11G)");
  }
  return o;
}

void report_io_faults() {
  if (const experts::FaultInjector* faults = g_io_faults.get())
    std::fprintf(stderr, "[strata] %s\n", faults->summary().c_str());
}

}  // namespace strata::cli
