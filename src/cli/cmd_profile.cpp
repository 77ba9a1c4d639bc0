// strata profile: an expert profile (per (layer, expert) route counts, docs/ROUTING.md) from a run
// of the model over a prompt: the prompt is prefilled and --max-tokens tokens generated greedily,
// and every routed expert of every window is counted. Saved next to the pack as PACK.profile, it
// is the start-up fill's default (docs/EXPERT_CACHE.md, "Start-up fill").
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/device_flag.h"
#include "cli/expert_flags.h"
#include "decode/generate.h"
#include "decode/loaded_model.h"
#include "experts/arena.h"
#include "model/route_control.h"
#include "util/error.h"

namespace strata::cli {

namespace {

struct ProfileOptions {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  std::string output;
  ExpertFlags experts;
  int64_t max_tokens = 64;
  std::string device = "auto";
  int threads = 0;
  int64_t ctx = 4096;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--prompt-file ", path, ": cannot open it");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void run_profile(const ProfileOptions& o) {
  const std::string text = o.prompt_file.empty() ? o.prompt : read_text(o.prompt_file);
  decode::LoadedModel lm(
      {.path = o.model, .device = o.device, .threads = o.threads, .ctx = o.ctx, .experts = source_options(o.experts)});
  std::fprintf(stderr, "strata: device %s\n", lm.device_description().c_str());
  model::Model& m = lm.model();
  const auto prompt = lm.encode(text);
  if (prompt.empty()) fail("the prompt has no tokens: give a text with -p or --prompt-file");
  if (int64_t(prompt.size()) >= o.ctx)
    fail("the prompt has ", prompt.size(), " tokens; --ctx ", o.ctx, " leaves no room to generate");

  const std::string id = model::route_model_id(m.config());
  route::ExpertProfile profile(int(m.config().n_layer), int(m.config().n_expert), id);
  auto control = std::make_unique<model::RouteControl>(m.config(), m.renormalize_topk(), id, model::RouteOptions{});
  control->set_profile(&profile);
  m.set_route_control(std::move(control));

  decode::Session session(m, lm.tokenizer(), {.n_ctx = o.ctx});
  decode::GenerateParams gen;
  gen.max_tokens = o.max_tokens;
  gen.sampling.temperature = 0;
  const auto result = session.generate(prompt, gen, [](const std::string&) {});
  m.route_control()->set_profile(nullptr);
  profile.save(o.output);
  std::fprintf(stderr, "[strata] profile of %lld tokens (%zu prompt, %zu generated) written to %s\n",
               static_cast<long long>(profile.tokens()), prompt.size(), result.tokens.size(), o.output.c_str());
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  CLI::App* cmd = app.add_subcommand("profile", "Count the experts a run routes to: an expert profile for the start-up fill");
  cmd->add_option("-m,--model", o->model, "GGUF model")->required();
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "Prompt text (raw, no chat template)");
  cmd->add_option("--prompt-file", o->prompt_file, "Read the prompt from this file")->excludes(p);
  cmd->add_option("-o,--output", o->output, "Profile file to write (e.g. MODEL.gguf.experts.profile)")->required();
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Tokens generated greedily after the prompt")->capture_default_str();
  add_expert_flags(cmd, o->experts);
  cmd->add_option("-t,--threads", o->threads, "CPU threads (default: one per hardware thread)");
  add_device_flag(cmd, o->device);
  cmd->add_option("-c,--ctx", o->ctx, "Context positions")->capture_default_str();
  cmd->callback([o] { run_profile(*o); });
}

}  // namespace strata::cli
