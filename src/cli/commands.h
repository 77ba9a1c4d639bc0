// Each subcommand lives in its own cmd_NAME.cpp and adds itself to the app here.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

void add_convert_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_pack_command(CLI::App& app);
void add_replay_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_trace_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_profile_command(CLI::App& app);

}  // namespace strata::cli
