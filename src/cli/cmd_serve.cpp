// strata serve: the OpenAI-compatible server (src/server/) over one model. SIGTERM or SIGINT
// stops it cleanly: no new connections, queued requests answered 503, the running generation
// ended at its next window with what it has, the shutdown hook run, exit 0. docs/SERVER.md
// describes the flags and endpoints.
#include <csignal>
#include <cstdio>
#include <memory>
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
  ExpertFlags experts;
  SpecFlags spec;
  server::ServerOptions server;
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

void run_serve(const ServeOptions& o) {
  block_signals();
  std::fprintf(stderr, "strata: loading %s\n", o.load.path.c_str());
  decode::LoadOptions load = o.load;
  load.experts = source_options(o.experts);
  decode::LoadedModel model(load);
  std::fprintf(stderr, "strata: device %s\n", model.device_description().c_str());
  std::fprintf(stderr, "strata: experts %s\n", model.model().experts_description().c_str());
  // The usage history and start-up fill when the experts stream.
  install_routing(model.model(), {}, o.experts.pack);
  server::ServerOptions so = o.server;
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
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  auto& s = opts->server;
  auto& g = s.generation;
  cmd->add_option("-m,--model", opts->load.path, "GGUF model")->required();
  cmd->add_option("--host", s.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", s.port, "Port to listen on; 0 picks a free one")
      ->capture_default_str();
  cmd->add_option("--model-id", g.model_id,
                  "Model name clients must send (default: the file name without .gguf)");
  cmd->add_option("--queue", g.queue, "Requests that may wait behind the running one; past it, 429")
      ->capture_default_str();
  cmd->add_option("--timeout", g.timeout_s,
                  "Seconds a request may take, queue wait and generation together")
      ->capture_default_str();
  cmd->add_option("--max-body", s.max_body, "Largest request body in bytes; past it, 413")
      ->capture_default_str();
  cmd->add_option("--read-timeout", s.read_timeout_s,
                  "Seconds a client has to send a whole request (line, headers, body); past it, 408")
      ->capture_default_str();
  cmd->add_option("--api-key", s.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/ routes (default: none)");
  cmd->add_option("--ctx", opts->load.ctx, "Context positions")->capture_default_str();
  add_expert_flags(cmd, opts->experts);
  cmd->add_option("--batch", g.batch, "Rows per prefill window")->capture_default_str();
  cmd->add_option("--threads", opts->load.threads,
                  "CPU threads (default: one per hardware thread)");
  add_device_flag(cmd, opts->load.device);
  add_spec_flags(cmd, opts->spec);
  cmd->callback([opts] { run_serve(*opts); });
}

}  // namespace strata::cli
