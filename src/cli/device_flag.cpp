#include "cli/device_flag.h"

namespace strata::cli {

void add_device_flag(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device,
                  "Compute device: cpu, cuda, cuda:N, or auto (a CUDA device when there is one "
                  "and the model fits its memory, else the CPU)")
      ->capture_default_str();
}

}  // namespace strata::cli
