// --device on every command that runs a model (run, serve, bench, logits, profile).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace strata::cli {

void add_device_flag(CLI::App* cmd, std::string& device);

}  // namespace strata::cli
