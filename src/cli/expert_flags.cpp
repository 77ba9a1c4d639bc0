#include "cli/expert_flags.h"

#include "experts/arena.h"
#include "util/error.h"

namespace strata::cli {

void add_expert_flags(CLI::App* cmd, ExpertFlags& flags) {
  cmd->add_option("--expert-budget", flags.budget,
                  "Expert cache size (8G, 512M): stream the routed experts from the pack "
                  "through a cache of this size (default: from free memory, when they do not fit)");
  cmd->add_option("--read-ahead", flags.read_ahead,
                  "Guess the next layer's experts and start reading them early (on|off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--pack", flags.pack,
                  "The .experts pack (default: the model's strata.experts.pack or MODEL.experts)");
}

experts::SourceOptions source_options(const ExpertFlags& flags) {
  experts::SourceOptions o{.pack = flags.pack, .read_ahead = flags.read_ahead == "on"};
  if (!flags.budget.empty()) {
    try {
      o.budget_bytes = experts::parse_byte_size(flags.budget);
    } catch (const Error& e) {
      fail("--expert-budget: ", e.what());
    }
  }
  return o;
}

}  // namespace strata::cli
