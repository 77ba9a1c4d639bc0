// strata run: generates from a model on the CPU, one-shot with -p or as an interactive chat.
// The reply streams to stdout; one telemetry line per reply goes to stderr, so the reply can be
// piped on its own. docs/RUN.md describes the flags and the chat commands.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device_flag.h"
#include "cli/sampling_flags.h"
#include "cli/expert_flags.h"
#include "cli/route_flags.h"
#include "cli/spec_flags.h"
#include "decode/generate.h"
#include "decode/loaded_model.h"
#include "experts/arena.h"
#include "model/route_control.h"
#include "util/error.h"

namespace strata::cli {

namespace {

struct RunOptions {
  std::string model;
  std::string prompt;
  bool one_shot = false;  // -p given, even as ""
  std::string system;
  bool raw = false;
  std::optional<bool> think;
  decode::GenerateParams gen;
  std::string device = "auto";
  int threads = 0;
  int64_t ctx = 4096;
  ExpertFlags experts;
  RouteFlags route;
  SpecFlags spec;
};

// The conversation so far and how it becomes prompt tokens: the model's chat template over the
// messages, or with --raw the plain transcript.
class Conversation {
 public:
  Conversation(const RunOptions& o, const decode::LoadedModel& lm) : opts_(o), lm_(lm) {
    if (!o.raw && !lm.has_chat_template())
      fail(o.model, " has no chat template; pass --raw to send the prompt as it is");
    if (o.think) extra_["enable_thinking"] = *o.think;
    clear();
  }

  // The tokens of the conversation with `user` as the next turn, ready for the reply.
  std::vector<int32_t> prompt_with(const std::string& user) const {
    std::string text;
    if (opts_.raw) {
      text = transcript_.empty() ? user : transcript_ + "\n" + user;
    } else {
      auto messages = messages_;
      messages.push_back({{"role", "user"}, {"content", user}});
      text = lm_.render_chat(messages, nullptr, true, extra_);
    }
    return lm_.encode(text);
  }

  void add_turn(const std::string& user, const std::string& reply) {
    if (opts_.raw) {
      transcript_ = (transcript_.empty() ? user : transcript_ + "\n" + user) + reply;
    } else {
      messages_.push_back({{"role", "user"}, {"content", user}});
      messages_.push_back({{"role", "assistant"}, {"content", reply}});
    }
  }

  void clear() {
    transcript_.clear();
    messages_ = nlohmann::ordered_json::array();
    if (!opts_.system.empty()) messages_.push_back({{"role", "system"}, {"content", opts_.system}});
  }

 private:
  const RunOptions& opts_;
  const decode::LoadedModel& lm_;
  nlohmann::ordered_json messages_;
  nlohmann::ordered_json extra_ = nlohmann::ordered_json::object();
  std::string transcript_;
};

void print_piece(const std::string& piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

// Streams one reply, ends its line and reports the telemetry.
// Streams one reply, ends its line and reports the telemetry, plus what the expert cache did when
// the experts stream.
decode::GenerateResult reply(decode::Session& session, const model::Model& model,
                             const std::vector<int32_t>& prompt,
                             const decode::GenerateParams& gen) {
  const auto cache_before = model.expert_stats();
  auto result = session.generate(prompt, gen, print_piece);
  if (result.text.empty() || result.text.back() != '\n') print_piece("\n");
  std::fprintf(stderr, "[strata] %s\n", decode::format_telemetry(result.telemetry).c_str());
  std::string cache_line = cache_before ? model.expert_stats()->since(*cache_before).summary() : "";
  if (const model::RouteControl* route = model.route_control(); route && !route->summary().empty())
    cache_line = cache_line.empty() ? route->summary() : cat(cache_line, "; ", route->summary());
  if (!cache_line.empty()) std::fprintf(stderr, "[strata] %s\n", cache_line.c_str());
  return result;
}

std::string too_long(size_t tokens, int64_t ctx) {
  return cat("the prompt has ", tokens, " tokens, more than --ctx ", ctx);
}

void chat_loop(decode::Session& session, const model::Model& model, Conversation& conv,
               const RunOptions& o) {
  const bool tty = isatty(STDIN_FILENO) != 0;
  if (tty)
    std::fprintf(stderr, "strata: chatting with %s; /reset clears, /exit or Ctrl-D quits\n",
                 o.model.c_str());
  std::string line;
  while (true) {
    if (tty) print_piece("> ");
    if (!std::getline(std::cin, line)) {
      if (tty) print_piece("\n");
      return;
    }
    if (line == "/exit") return;
    if (line == "/reset") {
      conv.clear();
      session.reset();
      std::fprintf(stderr, "[strata] conversation cleared\n");
      continue;
    }
    if (line.empty()) continue;
    const auto prompt = conv.prompt_with(line);
    if (int64_t(prompt.size()) > o.ctx) {
      std::fprintf(stderr, "strata: %s; /reset starts over\n",
                   too_long(prompt.size(), o.ctx).c_str());
      continue;
    }
    conv.add_turn(line, reply(session, model, prompt, o.gen).text);
  }
}

void run_run(const RunOptions& o) {
  o.gen.validate();
  decode::LoadedModel lm(
      {.path = o.model, .device = o.device, .threads = o.threads, .ctx = o.ctx, .experts = source_options(o.experts)});
  std::fprintf(stderr, "[strata] device %s\n", lm.device_description().c_str());
  std::fprintf(stderr, "[strata] experts %s\n", lm.model().experts_description().c_str());
  install_routing(lm.model(), o.route, o.experts.pack);
  Conversation conv(o, lm);
  decode::Session session(lm.model(), lm.tokenizer(),
                          {.n_ctx = o.ctx, .snapshot_prompt = !o.one_shot, .spec = spec_options(o.spec)});

  if (!o.one_shot) {
    chat_loop(session, lm.model(), conv, o);
    finish_routing(lm.model());
    return;
  }
  const auto prompt = conv.prompt_with(o.prompt);
  if (int64_t(prompt.size()) > o.ctx) fail(too_long(prompt.size(), o.ctx));
  reply(session, lm.model(), prompt, o.gen);
  finish_routing(lm.model());
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Generate from a model: one-shot with -p, else an interactive chat on stdin");
  cmd->add_option("-m,--model", opts->model, "GGUF model")->required();
  auto* prompt =
      cmd->add_option("-p,--prompt", opts->prompt, "Prompt (one-shot); without it, chat");
  cmd->add_option("--system", opts->system, "System message for the chat template");
  cmd->add_flag("--raw", opts->raw, "Send the prompt as it is, without the chat template");
  auto* think = cmd->add_flag_callback(
      "--think", [opts] { opts->think = true; }, "Set the template's enable_thinking to true");
  cmd->add_flag_callback(
         "--no-think", [opts] { opts->think = false; }, "Set enable_thinking to false")
      ->excludes(think);
  auto& gen = opts->gen;
  auto& s = gen.sampling;
  cmd->add_option("-n,--max-tokens", gen.max_tokens, "Most tokens to generate per reply")
      ->capture_default_str();
  add_sampling_flags(cmd, s);
  cmd->add_option("--seed", s.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--stop", gen.stop, "Stop string (repeatable); the reply ends before it")
      ->allow_extra_args(false);
  cmd->add_option("-t,--threads", opts->threads, "CPU threads (default: one per hardware thread)");
  add_device_flag(cmd, opts->device);
  cmd->add_option("-c,--ctx", opts->ctx, "Context positions")->capture_default_str();
  add_expert_flags(cmd, opts->experts);
  cmd->add_option("--batch", gen.batch, "Rows per prefill window")->capture_default_str();
  add_route_flags(cmd, opts->route);
  add_spec_flags(cmd, opts->spec);
  cmd->callback([opts, prompt] {
    opts->one_shot = prompt->count() > 0;
    run_run(*opts);
  });
}

}  // namespace strata::cli
