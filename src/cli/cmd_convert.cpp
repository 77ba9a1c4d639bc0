// strata convert: a Hugging Face model folder to GGUF (see convert/convert.h, docs/CONVERT.md).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "convert/convert.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::cli {

void add_convert_command(CLI::App& app) {
  auto o = std::make_shared<convert::ConvertOptions>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a Hugging Face model folder (safetensors) to GGUF");
  cmd->add_option("HF_DIR", o->input_dir, "Folder with config.json and model.safetensors[.index.json]")
      ->required()->check(CLI::ExistingDirectory);
  cmd->add_option("OUT", o->output, "Output .gguf")->required();
  cmd->add_option("--trunk-type", o->trunk_type, "Type of the non-expert matrices (f32, bf16, q8_0, q4_k, fp8, ...)")
      ->capture_default_str();
  cmd->add_option("--expert-type", o->expert_type, "Type of the routed experts")->capture_default_str();
  cmd->add_option("--ngram-type", o->ngram_type, "Type of the PLE n-gram table (qwen4exp)")->capture_default_str();
  cmd->add_option("--fallback-type", o->fallback_type,
                  "Type for tensors whose rows the requested type's block does not divide, or none")
      ->capture_default_str();
  cmd->add_flag("!--no-mtp", o->mtp, "Leave out the MTP (NextN) draft block");
  cmd->add_option("--vocab-seed", o->vocab_seed, "Seed of the generated vocabulary when there is no tokenizer.json")
      ->capture_default_str();
  cmd->add_flag("!--no-progress", o->progress, "No progress bar");
  cmd->callback([o] {
    const convert::ConvertReport r = convert::run_convert(*o);
    for (const auto& note : r.notes) std::fprintf(stderr, "  note: %s\n", note.c_str());
    const auto& c = r.config;
    std::fprintf(stderr, "%s: %s, %lld layers (+%lld MTP), %zu tensors (%llu re-blocked FP8 exactly), %s in %.1f s\n",
                 o->output.c_str(), model::arch_name(c.arch), (long long)c.n_layer, (long long)c.n_mtp, r.tensors,
                 (unsigned long long)r.fp8_exact, format_bytes(r.file_bytes).c_str(), r.seconds);
  });
}

}  // namespace strata::cli
