#include "server/server.h"

#include <httplib.h>

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/chat_page.h"
#include "server/encode.h"
#include "server/expert_cache_api.h"
#include "server/http_server.h"
#include "server/responses_api.h"
#include "server/tokenize_api.h"
#include "util/error.h"

namespace strata::server {

struct Server::Http {
  explicit Http(std::chrono::milliseconds request_read_timeout) : server(request_read_timeout) {}
  HttpServer server;
};

namespace {

// Errors come in the shape of the API the path belongs to: Anthropic's under /v1/messages,
// OpenAI's everywhere else.
void send_error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  const bool anthropic = req.path.rfind("/v1/messages", 0) == 0;
  res.status = anthropic ? anthropic_status(e) : e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(to_text(anthropic ? anthropic_error_body(e) : error_body(e)), "application/json");
}

// Runs a route, turning what it throws into an error response.
template <typename Fn>
httplib::Server::Handler guarded(Fn fn) {
  return [fn](const httplib::Request& req, httplib::Response& res) {
    try {
      fn(req, res);
    } catch (const ApiError& e) {
      send_error(req, res, e);
    } catch (const std::exception& e) {
      send_error(req, res, ApiError(500, cat("Internal error: ", e.what()), "", "internal_error",
                                    "server_error"));
    }
  };
}

// The label /metrics counts a request under: its route, never the raw path (unbounded).
std::string endpoint_label(const std::string& path) {
  for (const char* route : {"/", "/health", "/metrics", "/expert-cache", "/v1/models", "/v1/chat/completions",
                            "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                            "/v1/responses", "/tokenize", "/detokenize"})
    if (path == route) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

// Compares a presented secret with the expected one in time that depends only on the presented
// length, never on how much of it matches or on the expected secret's length.
bool same_secret(std::string_view given, std::string_view expected) {
  unsigned diff = given.size() != expected.size();
  for (size_t i = 0; i < given.size(); ++i)
    diff |= unsigned(uint8_t(given[i]) ^ uint8_t(expected[i % expected.size()]));
  return diff == 0;
}

Json model_object(const std::string& id, int64_t created) {
  return {{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "strata"}};
}

}  // namespace

size_t default_parallel(std::string_view backend_name) { return backend_name == "cuda" ? 4 : 1; }

double default_warmup_after(std::string_view backend_name) { return backend_name == "cuda" ? 0 : 30; }

Server::Server(decode::LoadedModel& model, ServerOptions options)
    : model_(model), options_(std::move(options)) {
  auto& gen = options_.generation;
  if (gen.model_id.empty()) gen.model_id = std::filesystem::path(model.path()).stem().string();
  if (gen.timeout_s <= 0) fail("--timeout: ", gen.timeout_s, " must be positive");
  if (!(options_.read_timeout_s >= 0.001 && options_.read_timeout_s <= 3600))
    fail("--read-timeout: ", options_.read_timeout_s, " is outside 0.001..3600 seconds");
  http_ = std::make_unique<Http>(std::chrono::milliseconds(int64_t(options_.read_timeout_s * 1000)));
  if (options_.max_body < 1024) fail("--max-body: ", options_.max_body, " is below 1024 bytes");
  if (gen.parallel < 1) fail("--parallel: ", gen.parallel, " must be at least 1");
  generation_ = std::make_unique<Generation>(model, metrics_, gen);
  anthropic_ = std::make_unique<AnthropicApi>(*generation_);
  responses_ = std::make_unique<ResponsesApi>(*generation_);
  add_routes();
}

Server::~Server() {
  stop();
  generation_.reset();
}

void Server::add_routes() {
  auto& svr = http_->server;
  // Every queued request holds an HTTP thread while it waits, and so does an idle keep-alive
  // connection until its timeout. Spare threads plus a short keep-alive keep /health, /metrics
  // and the 429 answers responsive when the queue is full and clients hold connections open
  // (the default 5 s keep-alive let a dozen idle clients stall every other request for 5 s).
  const size_t threads = options_.generation.queue + options_.generation.parallel + 32;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_keep_alive_timeout(1);
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half the connections; a taken port must be an error.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  svr.set_payload_max_length(options_.max_body);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);

  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool api = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
    if (options_.api_key.empty() || !api) return httplib::Server::HandlerResponse::Unhandled;
    // OpenAI's clients send a bearer token, Anthropic's an x-api-key header.
    if (same_secret(req.get_header_value("Authorization"), "Bearer " + options_.api_key) ||
        same_secret(req.get_header_value("x-api-key"), options_.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(req, res,
               ApiError(401, "Incorrect or missing API key (Authorization: Bearer KEY or x-api-key: KEY).",
                        "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (HttpServer::request_timed_out())
      send_error(req, res, ApiError(408, cat("The request did not arrive within ",
                                             options_.read_timeout_s, " s (--read-timeout)."),
                                    "", "request_timeout"));
    else if (res.status == 413)
      send_error(req, res, ApiError(413, "The request body is larger than the server's limit "
                                    "(--max-body).", "", "request_too_large"));
    else if (res.status == 404)
      send_error(req, res, ApiError(404, cat("Unknown request URL: ", req.method, " ", req.path, "."),
                               "", "unknown_url"));
    else
      send_error(req, res, ApiError(res.status, cat("The HTTP request could not be served (status ",
                                               res.status, ")."), "", "http_error"));
  });
  svr.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
        send_error(req, res, ApiError(500, "Internal error.", "", "internal_error", "server_error"));
      });
  // Counted before the response leaves (httplib runs this after the route and the error
  // handler, before it writes the status line): a client that has its answer and asks /metrics
  // next must find the request counted. The logger runs after the write, which left a window.
  svr.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    metrics_.count_request(endpoint_label(req.path), res.status);
  });

  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    const auto page = chat_page_html();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
  svr.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    if (stopping_)
      send_error(req, res, ApiError(503, "The server is shutting down.", "", "shutting_down",
                               "server_error"));
    else
      res.set_content(R"({"status":"ok"})", "application/json");
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(generation_->gauges()), "text/plain; version=0.0.4");
  });
  svr.Get("/expert-cache", [this](const httplib::Request& req, httplib::Response& res) {
    expert_cache(model_, req, res);
  });
  const auto created = int64_t(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
  svr.Get("/v1/models", [this, created](const httplib::Request&, httplib::Response& res) {
    const Json list = {{"object", "list"},
                       {"data", Json::array({model_object(model_id(), created)})}};
    res.set_content(to_text(list), "application/json");
  });
  svr.Get(R"(/v1/models/(.+))", guarded([this, created](const httplib::Request& req,
                                                         httplib::Response& res) {
            if (req.matches[1] != model_id())
              throw ApiError(404, cat("The model '", req.matches[1].str(), "' does not exist."),
                             "model", "model_not_found");
            res.set_content(to_text(model_object(model_id(), created)), "application/json");
          }));
  svr.Post("/v1/chat/completions", guarded([this](const httplib::Request& req,
                                                   httplib::Response& res) {
             generation_->chat(req, res);
           }));
  svr.Post("/v1/completions", guarded([this](const httplib::Request& req,
                                              httplib::Response& res) {
             generation_->completion(req, res);
           }));
  svr.Post("/v1/responses", guarded([this](const httplib::Request& req, httplib::Response& res) {
             responses_->create(req, res);
           }));
  svr.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
             tokenize(model_, req, res);
           }));
  svr.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
             detokenize(model_, req, res);
           }));
  svr.Post("/v1/messages", guarded([this](const httplib::Request& req, httplib::Response& res) {
             anthropic_->messages(req, res);
           }));
  svr.Post("/v1/messages/count_tokens",
           guarded([this](const httplib::Request& req, httplib::Response& res) {
             anthropic_->count_tokens(req, res);
           }));
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::string startup_warning(const ServerOptions& options) {
  if (!options.api_key.empty() || is_loopback_host(options.host)) return "";
  return cat("warning: listening on ", options.host, " without --api-key: anyone who can reach "
             "this address can use the model. Set --api-key KEY, or --host 127.0.0.1.");
}

int Server::bind() {
  auto& svr = http_->server;
  const int port = options_.port == 0 ? svr.bind_to_any_port(options_.host)
                                      : (svr.bind_to_port(options_.host, options_.port)
                                             ? options_.port
                                             : -1);
  if (port < 0)
    fail("cannot listen on ", options_.host, ":", options_.port,
         " (in use, or not an address of this machine)");
  if (!svr.deepen_backlog())
    fail("cannot listen on ", options_.host, ":", port, ": ", std::strerror(errno));
  return port;
}

std::string Server::serve_bytes(std::string_view bytes) { return http_->server.serve_bytes(bytes); }

void Server::run() {
  phase_ = 1;
  if (!stopping_) http_->server.listen_after_bind();
  generation_->shutdown();
  phase_ = 2;
  if (shutdown_hook_) {
    auto hook = std::move(shutdown_hook_);
    shutdown_hook_ = nullptr;
    hook();
  }
}

void Server::stop() {
  stopping_ = true;
  generation_->shutdown();
  // httplib ignores stop() until listen has started; wait for that if run() is on its way.
  while (phase_ == 1 && !http_->server.is_running())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->server.stop();
}

}  // namespace strata::server
