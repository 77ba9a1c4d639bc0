// strata serve: the OpenAI-compatible server (src/server/) over one model. SIGTERM or SIGINT
// stops it cleanly: no new connections, queued requests answered 503, the running generation
// ended at its next window with what it has, the shutdown hook run, exit 0. docs/SERVER.md
// describes the flags and endpoints.
#include <csignal>
#include <fstream>
#include <sstream>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include <pthread.h>

#include "cli/commands.h"
#include "cli/device_flag.h"
#include "cli/expert_flags.h"
#include "cli/route_flags.h"
#include "cli/spec_flags.h"
#include "decode/loaded_model.h"
#include "server/server.h"
#include "util/error.h"

namespace strata::cli {

namespace {

struct ServeOptions {
  decode::LoadOptions load;
  std::string chat_template_file;
  ExpertFlags experts;
  SpecFlags spec;
  server::ServerOptions server;
  std::optional<size_t> parallel;  // --parallel; unset: server::default_parallel for the device
  std::optional<double> warmup_after;  // --warmup-after; unset: server::default_warmup_after
};

// Blocks SIGTERM, SIGINT, SIGUSR1 and SIGPIPE in this thread and every thread it starts later,
// so none of them interrupts a model or socket call; a watcher thread takes the first three
// with sigwait (SIGUSR1 only wakes it when the server ends by itself). SIGPIPE stays blocked:
// a client that hangs up shows as a failed write.
void block_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGPIPE}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--chat-template-file: cannot read ", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void run_serve(const ServeOptions& o) {
  block_signals();
  std::fprintf(stderr, "strata: loading %s\n", o.load.path.c_str());
  decode::LoadOptions load = o.load;
  load.experts = source_options(o.experts);
  if (!o.chat_template_file.empty()) load.chat_template = read_text_file(o.chat_template_file);
  decode::LoadedModel model(load);
  std::fprintf(stderr, "strata: device %s\n", model.device_description().c_str());
  std::fprintf(stderr, "strata: experts %s\n", model.model().experts_description().c_str());
  // The usage history and start-up fill when the experts stream.
  install_routing(model.model(), {}, o.experts.pack);
  server::ServerOptions so = o.server;
  so.generation.parallel = o.parallel.value_or(server::default_parallel(model.model().backend().name()));
  so.generation.warmup_after_s =
      o.warmup_after.value_or(server::default_warmup_after(model.model().backend().name()));
  // With --parallel above 1 a generation speculates while it runs alone (decode::SequenceRun).
  so.generation.spec = spec_options(o.spec);
  server::Server srv(model, so);
  const int port = srv.bind();
  if (const std::string warning = server::startup_warning(o.server); !warning.empty())
    std::fprintf(stderr, "strata: %s\n", warning.c_str());

  std::thread watcher([&srv] {
    sigset_t wait_for;
    sigemptyset(&wait_for);
    for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaddset(&wait_for, sig);
    int sig = 0;
    sigwait(&wait_for, &sig);
    if (sig == SIGUSR1) return;
    std::fprintf(stderr, "strata: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv.stop();
  });
  srv.set_shutdown_hook([&model] {
    finish_routing(model.model());
    std::fprintf(stderr, "strata: server stopped\n");
  });
  std::fprintf(stderr, "strata: %zu sequence%s per window (--parallel%s)\n", so.generation.parallel,
               so.generation.parallel == 1 ? "" : "s", o.parallel ? "" : ", the default on this device");
  const spec::Mode spec_mode = so.generation.spec.mode;
  std::fprintf(stderr, "strata: speculation %s%s (--spec)\n", spec::mode_name(spec_mode),
               spec_mode != spec::Mode::Off && so.generation.parallel > 1 ? ", while a generation runs alone" : "");
  const char* warmup_default = o.warmup_after ? "" : ", the default on this device";
  if (so.generation.warmup_after_s > 0)
    std::fprintf(stderr, "strata: a warm-up window after %g s idle (--warmup-after%s)\n",
                 so.generation.warmup_after_s, warmup_default);
  else
    std::fprintf(stderr, "strata: no warm-up window after idle (--warmup-after 0%s)\n", warmup_default);
  std::fprintf(stderr,
               "strata: serving %s as '%s' on http://%s:%d (chat page at /, API under /v1)\n",
               o.load.path.c_str(), srv.model_id().c_str(), o.server.host.c_str(), port);
  srv.run();
  pthread_kill(watcher.native_handle(), SIGUSR1);
  watcher.join();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto opts = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve a model over HTTP: OpenAI chat completions, completions and Responses, "
               "Anthropic Messages, tokenize/detokenize, a chat page");
  auto& s = opts->server;
  auto& g = s.generation;
  // --help lists the flags by topic, in this order.
  const char* kModel = "Model";
  const char* kNetwork = "Network and access";
  const char* kRequests = "Requests and queue";
  const char* kCompute = "Compute";
  const char* kExperts = "Expert cache";
  const char* kSpec = "Speculative decoding";
  cmd->add_option("-m,--model", opts->load.path, "GGUF model")->required()->group(kModel);
  cmd->add_option("--model-id", g.model_id,
                  "Model name clients must send (default: the file name without .gguf)")
      ->group(kModel);
  cmd->add_option("--chat-template-file", opts->chat_template_file,
                  "A Jinja chat template to use instead of the model's own")
      ->check(CLI::ExistingFile)
      ->group(kModel);
  cmd->add_option("-c,--ctx", opts->load.ctx, "Context positions (prompt plus reply)")
      ->capture_default_str()
      ->group(kModel);
  cmd->add_option("--host", s.host, "Address to listen on")->capture_default_str()->group(kNetwork);
  cmd->add_option("--port", s.port, "Port to listen on; 0 picks a free one")
      ->capture_default_str()
      ->group(kNetwork);
  cmd->add_option("--api-key", s.api_key,
                  "Require this key ('Authorization: Bearer KEY' or 'x-api-key: KEY') on the API "
                  "routes (default: none)")
      ->group(kNetwork);
  cmd->add_option("--max-body", s.max_body, "Largest request body in bytes; past it, 413")
      ->capture_default_str()
      ->group(kNetwork);
  cmd->add_option("--queue", g.queue, "Requests that may wait behind the running ones; past it, 429")
      ->capture_default_str()
      ->group(kRequests);
  cmd->add_option("--parallel", opts->parallel,
                  "Generations that share each decode window (continuous batching), each with its "
                  "own state and prompt cache; one running alone speculates (default: 4 on CUDA, 1 on the CPU)")
      ->check(CLI::Range(1, 64))
      ->group(kRequests);
  cmd->add_option("--timeout", g.timeout_s,
                  "Seconds a request may take, queue wait and generation together")
      ->capture_default_str()
      ->group(kRequests);
  cmd->add_option("--read-timeout", s.read_timeout_s,
                  "Seconds a client has to send a whole request (line, headers, body); past it, 408")
      ->capture_default_str()
      ->group(kNetwork);
  cmd->add_option("--warmup-after", opts->warmup_after,
                  "Seconds idle after which a request is preceded by a one-token warm-up window "
                  "(0: never; default: 30 on the CPU, 0 on CUDA, where it measured slower)")
      ->check(CLI::NonNegativeNumber)
      ->group(kRequests);
  cmd->add_option("--batch", g.batch, "Prompt rows per window (with --parallel: beside the decode rows)")
      ->capture_default_str()
      ->group(kCompute);
  cmd->add_option("-t,--threads", opts->load.threads,
                  "CPU threads (default: one per hardware thread)")
      ->group(kCompute);
  add_device_flag(cmd, opts->load.device);
  cmd->get_option("--device")->group(kCompute);
  add_expert_flags(cmd, opts->experts);
  for (const char* flag : {"--expert-budget", "--read-ahead", "--pack", "--host-budget", "--host-fill"})
    cmd->get_option(flag)->group(kExperts);
  add_spec_flags(cmd, opts->spec);
  for (const char* flag : {"--spec", "--spec-depth", "--spec-max-depth", "--spec-typical"})
    cmd->get_option(flag)->group(kSpec);
  cmd->callback([opts] { run_serve(*opts); });
}

}  // namespace strata::cli
