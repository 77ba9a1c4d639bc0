// strata synth: a synthetic-weight model of a real architecture and shape (see synth/synth.h).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "gguf/gguf.h"
#include "quant/types.h"
#include "synth/synth.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::cli {

namespace {

void print_report(const synth::SynthReport& r, const std::string& path) {
  const auto& c = r.plan.config;
  uint64_t by_role[5] = {};
  for (size_t i = 0; i < r.plan.specs.size(); ++i)
    by_role[int(r.plan.specs[i].role)] += gguf::tensor_nbytes(r.plan.types[i], r.plan.specs[i].shape);
  std::fprintf(stderr, "%s: %s, %lld layers (+%lld MTP), hidden %lld, %lld experts top-%lld, vocab %lld\n",
               path.c_str(), model::arch_name(c.arch), (long long)c.n_layer, (long long)c.n_mtp,
               (long long)c.n_embd, (long long)c.n_expert, (long long)c.n_expert_used,
               (long long)c.n_vocab);
  std::fprintf(stderr, "  experts %s, trunk %s, embedding+output %s, n-gram table %s\n",
               format_bytes(by_role[int(model::Role::RoutedExpert)]).c_str(),
               format_bytes(by_role[int(model::Role::Trunk)]).c_str(),
               format_bytes(by_role[int(model::Role::Embedding)] + by_role[int(model::Role::Output)]).c_str(),
               format_bytes(by_role[int(model::Role::NgramTable)]).c_str());
  if (!r.plan.notes.empty())
    std::fprintf(stderr, "  %zu tensors fell back to another type or were padded, e.g. %s\n",
                 r.plan.notes.size(), r.plan.notes.front().c_str());
  const uint64_t total = r.file_bytes + r.pack_bytes;
  std::fprintf(stderr, "  wrote %s in %.1f s (%.2f GB/s)\n", format_bytes(total).c_str(), r.seconds,
               r.seconds > 0 ? double(total) / r.seconds / 1e9 : 0.0);
  if (r.pack_bytes)
    std::fprintf(stderr, "  experts in %s.experts (%s); the GGUF holds the trunk (%s)\n", path.c_str(),
                 format_bytes(r.pack_bytes).c_str(), format_bytes(r.file_bytes).c_str());
}

}  // namespace

void add_synth_command(CLI::App& app) {
  auto opts = std::make_shared<synth::SynthOptions>();
  auto sets = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("synth", "Write a synthetic-weight GGUF model of a real shape");
  cmd->add_option("--arch", opts->arch, "qwen4exp, qwen3next, qwen35moe or qwen3moe")->capture_default_str();
  cmd->add_option("--preset", opts->preset, "tiny, flagship or qwen3-next-80b-a3b")->capture_default_str();
  cmd->add_option("--set", *sets, "Override any hparam: KEY=VALUE (repeatable; see docs/ARCHITECTURES.md)");
  cmd->add_option("--layers", opts->layers, "Trunk layers");
  cmd->add_option("--experts", opts->experts, "Routed experts per layer");
  cmd->add_option("--experts-used", opts->experts_used, "Experts routed per token");
  cmd->add_option("--hidden", opts->hidden, "Hidden size");
  cmd->add_option("--vocab-size", opts->vocab_size, "Vocabulary size (embedding rows)");
  cmd->add_option("--expert-type", opts->expert_type, "Type of the routed experts (q4_k, iq2_xs, ...)");
  cmd->add_option("--trunk-type", opts->trunk_type, "Type of the other matrices");
  cmd->add_option("--ngram-type", opts->ngram_type, "Type of the PLE n-gram table");
  cmd->add_option("--fallback-type", opts->fallback_type,
                  "Type for tensors whose rows the requested type's block does not divide, or none")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Seed: same seed, same bytes")->capture_default_str();
  cmd->add_option("--tokenizer-json", opts->tokenizer_json, "Vocabulary from a Hugging Face tokenizer.json");
  cmd->add_flag("--ngram-full", opts->ngram_full, "Full-size PLE n-gram table (the flagship's: ~51B parameters)");
  cmd->add_flag("--pack", opts->pack,
                "Write the routed experts only to OUTPUT.experts (a pack) and the rest to OUTPUT");
  cmd->add_flag("!--no-progress", opts->progress, "No progress bar");
  cmd->add_option("-o,--output", opts->output, "Output .gguf")->required();
  cmd->callback([opts, sets] {
    for (const auto& kv : *sets) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) fail("--set ", kv, ": expected KEY=VALUE");
      opts->sets.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    }
    print_report(synth::run_synth(*opts), opts->output);
  });
}

}  // namespace strata::cli
