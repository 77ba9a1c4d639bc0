// Helpers for the server tests: a fixture base that loads the tiny model once per suite, an
// in-process server on a free loopback port, HTTP and /metrics helpers, a raw loopback HTTP client
// (to hold a stream open and hang up mid-way, which httplib's client cannot), SSE and Prometheus
// text parsing.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "decode/loaded_model.h"
#include "gguf_test_util.h"
#include "server/http_server.h"
#include "server/server.h"
#include "synth/synth.h"

namespace strata::server::testing {

// Builds the function-local statics of Debian's libcpp-httplib.so that a request to a server
// reaches (Server::parse_request_line's set of method names, write_content_chunked's
// "0\r\n\r\n", the client's own) once, before any test starts: one chunked request to a
// throwaway server. The library is not instrumented: the first thread to reach such a static
// builds it under __cxa_guard_acquire/release, which ThreadSanitizer sees, but every later thread
// passes the guard by a plain acquire load inside the library, which it does not, so two HTTP
// worker threads of a test look like a race on the static (docs/RELIABILITY.md, "TSan and the
// HTTP library"). Here the thread that builds them is joined before the tests create theirs,
// an order TSan does see; nothing is suppressed.
class HttplibStatics final : public ::testing::Environment {
 public:
  void SetUp() override {
    HttpServer server(std::chrono::seconds(5));
    server.Get("/chunked", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/plain", [](size_t, httplib::DataSink& sink) {
        sink.write("x", 1);
        sink.done();
        return true;
      });
    });
    const int port = server.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port, 0);
    std::thread listener([&] { server.listen_after_bind(); });
    httplib::Client client("127.0.0.1", port);
    const auto res = client.Get("/chunked");
    server.stop();
    listener.join();
    ASSERT_TRUE(res && res->body == "x") << (res ? res->body : "no response");
  }
};
inline ::testing::Environment* const httplib_statics =
    ::testing::AddGlobalTestEnvironment(new HttplibStatics);

// The tiny synthetic qwen35moe the server tests run on, written into `dir` as tiny.gguf (so its
// model id is "tiny"). Returns the path.
inline std::string synth_tiny(const gguf::testing::TempDir& dir) {
  synth::SynthOptions o;
  o.arch = "qwen35moe";
  o.preset = "tiny";
  o.output = dir.file("tiny.gguf");
  o.progress = false;
  o.seed = 11;
  synth::run_synth(o);
  return o.output;
}

// Base of a fixture whose tests share one tiny model: synthesizing and loading it once per suite
// leaves each test only its requests. `Suite` is the deriving fixture, so that each suite has a
// model of its own (every suite is in the one test binary). The suite's SetUpTestSuite calls
// load_tiny_model; the model lives until its last test has ended.
template <class Suite>
class TinyModelSuite : public ::testing::Test {
 protected:
  // One CPU thread: ctest runs many tests side by side, and the outputs do not depend on it.
  static void load_tiny_model(int64_t ctx, const std::string& chat_template = "") {
    dir_ = new gguf::testing::TempDir;
    decode::LoadOptions load;
    load.path = synth_tiny(*dir_);
    load.threads = 1;
    load.ctx = ctx;
    load.chat_template = chat_template;
    model_ = new decode::LoadedModel(load);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }

  static inline gguf::testing::TempDir* dir_ = nullptr;  // holds tiny.gguf
  static inline decode::LoadedModel* model_ = nullptr;
};

// A Server serving on a thread of its own from construction until stop() or destruction. It
// listens on port 0, a free port the kernel picks, so that tests running at once never collide.
class RunningServer {
 public:
  RunningServer(decode::LoadedModel& model, ServerOptions options) {
    options.port = 0;
    server_ = std::make_unique<Server>(model, std::move(options));
    port_ = server_->bind();
    thread_ = std::thread([server = server_.get()] { server->run(); });
  }
  ~RunningServer() { stop(); }
  RunningServer(const RunningServer&) = delete;
  RunningServer& operator=(const RunningServer&) = delete;

  int port() const { return port_; }

  // Stops the server and waits for run() to return; a test calls it to watch a shutdown.
  void stop() {
    if (!server_) return;
    server_->stop();
    thread_.join();
    server_.reset();
  }

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// An HTTP client of the server on `port`. The read timeout bounds a hang; it is no timing claim,
// so it is generous enough for a loaded machine.
inline httplib::Client loopback_client(int port, time_t read_timeout_s = 60) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(read_timeout_s);
  return client;
}

inline httplib::Result post_json(int port, const std::string& path, const std::string& body,
                                 time_t read_timeout_s = 60) {
  return loopback_client(port, read_timeout_s).Post(path, body, "application/json");
}

// logit_bias banning every end-of-generation token of `model`: a reply that runs to max_tokens.
inline nlohmann::json no_end_token_bias(const decode::LoadedModel& model) {
  const auto& vocab = model.tokenizer().vocab();
  nlohmann::json bias = nlohmann::json::object();
  for (const auto& id : {vocab.eos, vocab.find("<|im_end|>"), vocab.find("<|endoftext|>")})
    if (id) bias[std::to_string(*id)] = -100;
  return bias;
}

// `text` as the server's JSON carries it: the random model writes bytes that are not UTF-8, and
// the server replaces them with U+FFFD.
inline std::string as_json_text(const std::string& text) {
  return nlohmann::json::parse(
             nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .get<std::string>();
}

// A TCP connection to the server on `port`, or -1. Its reads give up after 60 s, so that a broken
// server fails a test instead of hanging it.
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{60, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// One HTTP/1.1 request on its own connection; the test reads the response piecemeal and may
// close the connection at any point.
class RawClient {
 public:
  RawClient(int port, const std::string& method, const std::string& path,
            const std::string& body, const std::string& extra_headers = "") {
    fd_ = connect_loopback(port);
    if (fd_ < 0) std::abort();
    const std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                                extra_headers + "Content-Type: application/json\r\n" +
                                "Content-Length: " + std::to_string(body.size()) +
                                "\r\nConnection: close\r\n\r\n" + body;
    for (size_t sent = 0; sent < request.size();) {
      const ssize_t n = ::send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += size_t(n);
    }
  }
  ~RawClient() { close(); }

  // Reads until `text` has appeared `count` times in the response, or the connection ends.
  bool read_until(const std::string& text, size_t count = 1) {
    while (occurrences(text) < count) {
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return false;
      received_.append(buf, size_t(n));
    }
    return true;
  }
  // Reads to the end of the response (the server closes: Connection: close).
  const std::string& read_all() {
    read_until("\x01never\x02", 1);
    return received_;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  const std::string& received() const { return received_; }

 private:
  size_t occurrences(const std::string& text) const {
    size_t n = 0;
    for (size_t at = received_.find(text); at != std::string::npos;
         at = received_.find(text, at + 1))
      ++n;
    return n;
  }
  int fd_ = -1;
  std::string received_;
};

// The JSON payloads of an SSE body's `data:` events, "[DONE]" excluded; `done` says whether the
// stream ended with it.
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done = nullptr) {
  std::vector<nlohmann::json> events;
  if (done) *done = false;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string data = line.substr(6);
    if (data == "[DONE]") {
      if (done) *done = true;
      continue;
    }
    events.push_back(nlohmann::json::parse(data));
  }
  return events;
}

// Prometheus text exposition -> {"name{labels}": value}. Returns false on a line that is neither
// a comment nor a well-formed sample, or a sample whose metric has no # TYPE line before it.
inline bool parse_prometheus(const std::string& text, std::map<std::string, double>& out) {
  static const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"[^"]*")*\})? (\S+)$)");
  static const std::regex type_line(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)$)");
  std::vector<std::string> typed;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, type_line)) {
      typed.push_back(m[1]);
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (!std::regex_match(line, m, sample)) return false;
    bool known = false;
    for (const auto& t : typed) known |= t == m[1];
    if (!known) return false;
    char* end = nullptr;
    const std::string value = m[3];
    const double v = std::strtod(value.c_str(), &end);
    if (end != value.c_str() + value.size()) return false;
    out[m[1].str() + m[2].str()] = v;
  }
  return true;
}

// The server's /metrics, parsed; a scrape that fails or does not parse fails the test.
inline std::map<std::string, double> scrape_metrics(int port) {
  auto res = loopback_client(port).Get("/metrics");
  EXPECT_TRUE(res && res->status == 200);
  std::map<std::string, double> metrics;
  EXPECT_TRUE(parse_prometheus(res ? res->body : "", metrics)) << (res ? res->body : "");
  return metrics;
}

// Polls /metrics until `name` reaches `value`: for what the server counts just after a client
// has its answer, or while a generation runs (60 s at most: a bound, not a timing claim).
inline bool await_metric(int port, const std::string& name, double value) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    const auto metrics = scrape_metrics(port);
    if (auto it = metrics.find(name); it != metrics.end() && it->second == value) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace strata::server::testing
