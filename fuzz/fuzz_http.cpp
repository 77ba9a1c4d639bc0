// libFuzzer target for the HTTP layer of strata serve: any bytes as one connection's input (request
// lines, headers, chunked and sized bodies, several pipelined requests, truncated ones) through the
// server's own parsing, limits, error handling and routes, over a tiny synthetic model made once.
// Every answer must be an HTTP/1.1 response with a status the server uses; any crash, sanitizer
// report or hang is a bug. (cpp-httplib itself is Debian's shared library, not instrumented, so
// coverage guides the fuzzer through strata's handlers; crashes inside httplib still show.)
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "decode/loaded_model.h"
#include "server/server.h"
#include "synth/synth.h"

namespace {

std::string g_dir;
std::unique_ptr<strata::decode::LoadedModel> g_model;
std::unique_ptr<strata::server::Server> g_server;

void remove_dir() { std::filesystem::remove_all(g_dir); }

// An answer's status code, or -1 when it does not start like an HTTP/1.1 response.
int status_of(std::string_view answer) {
  if (answer.substr(0, 9) != "HTTP/1.1 " || answer.size() < 12) return -1;
  int code = 0;
  for (char c : answer.substr(9, 3)) {
    if (c < '0' || c > '9') return -1;
    code = code * 10 + (c - '0');
  }
  return code;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char dir[] = "/tmp/strata-fuzz-http-XXXXXX";
  if (!::mkdtemp(dir)) std::abort();
  g_dir = dir;
  std::atexit(remove_dir);
  strata::synth::SynthOptions o;
  o.arch = "qwen35moe";
  o.preset = "tiny";
  o.output = g_dir + "/tiny.gguf";
  o.progress = false;
  o.seed = 11;
  strata::synth::run_synth(o);
  strata::decode::LoadOptions load;
  load.path = o.output;
  load.threads = 1;
  load.ctx = 96;  // a valid request generates a few tokens at most
  g_model = std::make_unique<strata::decode::LoadedModel>(load);
  strata::server::ServerOptions options;
  options.port = 0;
  options.max_body = 64 << 10;
  options.api_key = "";
  options.generation.timeout_s = 0.2;
  options.generation.queue = 1;
  g_server = std::make_unique<strata::server::Server>(*g_model, options);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string answer =
      g_server->serve_bytes(std::string_view(reinterpret_cast<const char*>(data), size));
  // Every response the input drew out, pipelined ones included, has a well-formed status line.
  for (size_t at = 0; at < answer.size();) {
    const int status = status_of(std::string_view(answer).substr(at));
    if (status < 100 || status > 599) __builtin_trap();
    const size_t next = answer.find("\r\nHTTP/1.1 ", at + 1);
    if (next == std::string::npos) break;
    at = next + 2;
  }
  return 0;
}
