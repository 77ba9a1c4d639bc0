// strata inspect: what is in a GGUF file (gguf/inspect.h builds the report).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "gguf/gguf.h"
#include "gguf/inspect.h"

namespace strata::cli {

namespace {

struct InspectOptions {
  std::string file;
  bool json = false;
  std::string tensor;
  int64_t values = 16;
};

void run_inspect(const InspectOptions& o) {
  const auto reader = gguf::Reader::open(o.file);
  std::string out;
  if (!o.tensor.empty()) out = gguf::format_values(gguf::tensor_values(*reader, o.tensor, o.values));
  else if (o.json) out = gguf::inspect_json(*reader).dump(2) + "\n";
  else out = gguf::inspect_text(*reader);
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Describe a GGUF file: metadata, tensors, bytes per type, experts vs trunk");
  cmd->add_option("file", options->file, "GGUF file")->required()->check(CLI::ExistingFile);
  cmd->add_flag("--json", options->json, "Print the report as JSON (for scripts)");
  CLI::Option* tensor = cmd->add_option(
      "--tensor", options->tensor, "Print the first values of this tensor, dequantized, one per line");
  cmd->add_option("--values", options->values, "How many values --tensor prints")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->needs(tensor);
  cmd->callback([options] { run_inspect(*options); });
}

}  // namespace strata::cli
