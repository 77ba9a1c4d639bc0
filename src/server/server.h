// strata serve: an HTTP server over one loaded model. Routes:
//   POST /v1/chat/completions, POST /v1/completions   (server/generation.h)
//   POST /v1/messages, /v1/messages/count_tokens      (server/anthropic_api.h)
//   POST /v1/responses                                (server/responses_api.h)
//   POST /tokenize, /detokenize                       (server/tokenize_api.h)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text), / (chat page)
//   GET  /expert-cache                                (server/expert_cache_api.h: the page's panel)
// Errors are JSON bodies in the shape of the route's API; docs/SERVER.md has the details.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "decode/loaded_model.h"
#include "server/anthropic_api.h"
#include "server/generation.h"
#include "server/responses_api.h"

namespace strata::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                // 0: any free port (bind() says which)
  size_t max_body = 4 << 20;      // bytes; a larger request body gets 413
  std::string api_key;            // empty: no authentication
  double read_timeout_s = 30;     // a request's line, headers and body must arrive within this
  GenerationOptions generation;   // model id, queue, timeout, prefill batch
};

// Whether `host` (an address or "localhost") only listens on this machine.
bool is_loopback_host(const std::string& host);
// The warning to print at start-up when the server listens beyond this machine without an API
// key; empty when there is nothing to warn about.
std::string startup_warning(const ServerOptions& options);
// --parallel when none is given, by the backend that runs the model (Backend::name()): 4 on a GPU,
// where a decode window of one row leaves most of the device idle; 1 on the CPU, where each
// sequence's attention and DeltaNet rows cost about what they cost alone.
size_t default_parallel(std::string_view backend_name);
// --warmup-after when none is given: 30 s on the CPU, where an idle machine's cold pages, caches
// and thread pool cost a request more than a one-token window does; 0 (never) on CUDA, where the
// window itself cost the request's first token more than it saved (docs/PERFORMANCE.md).
double default_warmup_after(std::string_view backend_name);

class Server {
 public:
  // `model` must outlive the server. An empty generation.model_id becomes the file's stem.
  Server(decode::LoadedModel& model, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port. Throws strata::Error when it cannot.
  int bind();
  // Serves until stop(), then waits for the open responses to end and runs the shutdown hook.
  void run();
  // From any thread (a signal watcher, a test): stop accepting, drop queued requests (503),
  // end the running generation at its next window. run() returns soon after.
  void stop();
  // Runs once at the end of run(), after the last response (the usage history is saved here).
  void set_shutdown_hook(std::function<void()> hook) { shutdown_hook_ = std::move(hook); }

  const std::string& model_id() const { return options_.generation.model_id; }

  // Runs raw bytes through the server's HTTP parsing, limits and routes as one connection's input
  // and returns what it wrote back (the HTTP fuzzer; no socket involved).
  std::string serve_bytes(std::string_view bytes);

 private:
  struct Http;
  void add_routes();

  decode::LoadedModel& model_;
  ServerOptions options_;
  Metrics metrics_;
  std::unique_ptr<Generation> generation_;
  std::unique_ptr<AnthropicApi> anthropic_;
  std::unique_ptr<ResponsesApi> responses_;
  std::unique_ptr<Http> http_;
  std::function<void()> shutdown_hook_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> phase_{0};  // 0: run() not entered, 1: serving, 2: run() done
};

}  // namespace strata::server
