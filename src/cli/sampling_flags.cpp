#include "cli/sampling_flags.h"

namespace strata::cli {

void add_sampling_flags(CLI::App* cmd, decode::SamplingParams& s) {
  cmd->add_option("--temp", s.temperature, "Temperature; 0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Keep the k most likely tokens; 0 is off");
  cmd->add_option("--top-p", s.top_p, "Nucleus sampling mass; 1 is off");
  cmd->add_option("--min-p", s.min_p, "Drop tokens below min-p times the best; 0 is off");
  cmd->add_option("--repeat-penalty", s.repetition_penalty, "Repetition penalty; 1 is off");
  cmd->add_option("--presence-penalty", s.presence_penalty, "Presence penalty; 0 is off");
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "Frequency penalty; 0 is off");
}

}  // namespace strata::cli
