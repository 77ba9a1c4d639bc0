// strata serve in-process on a loopback port with a tiny synthetic model: chat and completions,
// streamed and not, agree with decode::Session; every bad-input class gets its 4xx and an
// OpenAI error body; the prompt cache reports reused tokens; a full queue answers 429; a client
// that hangs up, a request past its time limit and a shutdown all end the generation early.
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "decode/generate.h"
#include "decode/json_schema.h"
#include "decode/loaded_model.h"
#include "server/server.h"
#include "test_server_util.h"
#include "tokenizer/vocab.h"

namespace strata::server {
namespace {

using nlohmann::json;
using testing::RawClient;

class ServerLoopback : public testing::TinyModelSuite<ServerLoopback> {
 protected:
  static void SetUpTestSuite() { load_tiny_model(4096); }

  // Each test starts the server with the options it tests.
  void start(ServerOptions o = {}) { server_.emplace(*model_, o); }
  int port() const { return server_->port(); }

  httplib::Client client() const { return testing::loopback_client(port()); }
  httplib::Result post(const std::string& path, const std::string& body) const {
    return testing::post_json(port(), path, body);
  }
  httplib::Result get(const std::string& path) const { return client().Get(path.c_str()); }

  std::map<std::string, double> metrics() const { return testing::scrape_metrics(port()); }
  bool await_metric(const std::string& name, double value) const {
    return testing::await_metric(port(), name, value);
  }

  // The "logit_bias" member of a request, banning every end-of-generation token: the reply runs
  // to max_tokens.
  static std::string no_end_tokens() {
    return "\"logit_bias\":" + testing::no_end_token_bias(*model_).dump();
  }
  // A streamed completion long enough that the test acts while it runs.
  static std::string long_completion() {
    return R"({"model":"tiny","prompt":"hello","max_tokens":4000,"temperature":1,"seed":1,)"
           R"("stream":true,)" + no_end_tokens() + "}";
  }

  // What decode::Session gives for `messages` (greedy), as the server's JSON carries it.
  static std::string session_reply(const json& messages, int64_t max_tokens,
                                   decode::GenerateResult* out = nullptr) {
    const auto prompt = model_->encode(
        model_->render_chat(nlohmann::ordered_json(messages), nullptr, true,
                            nlohmann::ordered_json::object()));
    decode::Session session(model_->model(), model_->tokenizer(), {.n_ctx = 4096});
    decode::GenerateParams p;
    p.max_tokens = max_tokens;
    auto result = session.generate(prompt, p, {});
    if (out) *out = result;
    return testing::as_json_text(result.text);
  }

  // Sends `bytes` on a new connection, closes its sending side and returns all the server wrote
  // until it closed.
  std::string send_raw(const std::string& bytes) const {
    const int fd = testing::connect_loopback(port());
    if (fd < 0) return "(no connection)";
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, size_t(n));
    ::close(fd);
    return out;
  }

  static void expect_error(const httplib::Result& res, int status, const std::string& code) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    const auto body = json::parse(res->body);
    ASSERT_TRUE(body["error"].is_object()) << res->body;
    EXPECT_TRUE(body["error"]["message"].is_string());
    EXPECT_TRUE(body["error"]["type"].is_string());
    EXPECT_TRUE(body["error"].contains("param"));
    EXPECT_EQ(body["error"]["code"], code) << res->body;
  }

  std::optional<testing::RunningServer> server_;
};

const json kMessages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                    {{"role", "user"}, {"content", "Name three colours."}}});

std::string with(const json& body, const std::string& extra) {
  std::string s = body.dump();
  if (!extra.empty()) s.insert(s.size() - 1, "," + extra);
  return s;
}

json chat_request(const json& messages, int max_tokens) {
  return {{"model", "tiny"}, {"messages", messages}, {"max_tokens", max_tokens}};
}

TEST_F(ServerLoopback, ChatEqualsTheSession) {
  start();
  decode::GenerateResult expected;
  const std::string text = session_reply(kMessages, 12, &expected);
  auto res = post("/v1/chat/completions", chat_request(kMessages, 12).dump());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto body = json::parse(res->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  const auto& choice = body["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], text);
  EXPECT_EQ(choice["finish_reason"],
            expected.finish == decode::FinishReason::Length ? "length" : "stop");
  const auto& usage = body["usage"];
  EXPECT_EQ(usage["prompt_tokens"], expected.telemetry.prompt_tokens);
  EXPECT_EQ(usage["completion_tokens"], int64_t(expected.tokens.size()));
  EXPECT_EQ(usage["total_tokens"],
            expected.telemetry.prompt_tokens + int64_t(expected.tokens.size()));
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 0);
  // How it was made, in llama-server's names; no expert cache (mapped experts), no speculation.
  const auto& timings = body["timings"];
  EXPECT_EQ(timings["prompt_n"], expected.telemetry.prompt_tokens);
  EXPECT_EQ(timings["cache_n"], 0);
  EXPECT_EQ(timings["predicted_n"], int64_t(expected.tokens.size()));
  EXPECT_GT(timings["prompt_per_second"].get<double>(), 0);
  EXPECT_GE(timings["predicted_ms"].get<double>(), 0);
  EXPECT_FALSE(timings.contains("expert_hit_rate"));
  EXPECT_FALSE(timings.contains("draft_n"));
}

TEST_F(ServerLoopback, StreamedChatMatchesTheWholeReply) {
  start();
  const std::string text = session_reply(kMessages, 12);
  auto res = post("/v1/chat/completions",
                  with(chat_request(kMessages, 12),
                       R"("stream":true,"stream_options":{"include_usage":true})"));
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  bool done = false;
  const auto events = testing::sse_events(res->body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  std::string finish;
  for (const auto& e : events) {
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["id"], events.front()["id"]);
    if (e["choices"].empty()) continue;
    const auto& c = e["choices"][0];
    if (c["delta"].contains("content")) streamed += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(streamed, text);
  EXPECT_FALSE(finish.empty());
  const auto& last = events.back();
  const auto& finishing = events[events.size() - 2];
  EXPECT_FALSE(finishing["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(finishing["timings"]["predicted_n"], last["usage"]["completion_tokens"])
      << "the finishing chunk carries the reply's timings";
  EXPECT_TRUE(last["choices"].empty()) << "include_usage adds a usage-only chunk at the end";
  EXPECT_GT(last["usage"]["prompt_tokens"], 0);
  EXPECT_GT(last["usage"]["completion_tokens"], 0);
}

TEST_F(ServerLoopback, CompletionsFromTextAndFromTokens) {
  start();
  const std::string prompt = "Once upon a time";
  auto a = post("/v1/completions",
                json({{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}}).dump());
  ASSERT_TRUE(a);
  ASSERT_EQ(a->status, 200) << a->body;
  const auto ja = json::parse(a->body);
  EXPECT_EQ(ja["object"], "text_completion");
  const auto ids = model_->encode(prompt);
  auto b = post("/v1/completions",
                json({{"model", "tiny"}, {"prompt", ids}, {"max_tokens", 6}, {"echo", true}})
                    .dump());
  ASSERT_TRUE(b);
  ASSERT_EQ(b->status, 200) << b->body;
  const auto jb = json::parse(b->body);
  EXPECT_EQ(jb["choices"][0]["text"], prompt + ja["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(jb["usage"]["prompt_tokens"], int64_t(ids.size()));
  EXPECT_EQ(jb["usage"]["completion_tokens"], ja["usage"]["completion_tokens"]);

  auto s = post("/v1/completions",
                json({{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"stream", true}})
                    .dump());
  ASSERT_TRUE(s);
  bool done = false;
  std::string streamed;
  for (const auto& e : testing::sse_events(s->body, &done))
    streamed += e["choices"][0]["text"].get<std::string>();
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed, ja["choices"][0]["text"]);
}

TEST_F(ServerLoopback, ModelsHealthPageAndMetrics) {
  start();
  auto models = get("/v1/models");
  ASSERT_TRUE(models);
  const auto list = json::parse(models->body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "tiny");
  EXPECT_EQ(get("/v1/models/tiny")->status, 200);
  expect_error(get("/v1/models/gpt-4"), 404, "model_not_found");
  auto health = get("/health");
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto page = get("/");
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("/v1/chat/completions"), std::string::npos);
  EXPECT_EQ(page->body.find("http"), page->body.find("http-equiv")) << "no external resources";
  EXPECT_NE(page->body.find("/expert-cache"), std::string::npos) << "the live expert-cache panel";
  auto cache = get("/expert-cache");
  ASSERT_EQ(cache->status, 200);
  EXPECT_EQ(json::parse(cache->body), json({{"streamed", false}, {"description", "mapped from the GGUF"}}));

  ASSERT_EQ(post("/v1/chat/completions", chat_request(kMessages, 3).dump())->status, 200);
  // httplib counts a streamed (chunked) response once it has been sent, which may be just after
  // the client has read it.
  ASSERT_TRUE(await_metric("strata_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}", 1));
  const auto m = metrics();
  EXPECT_EQ(m.at("strata_requests_total{endpoint=\"/v1/models\",status=\"200\"}"), 1);
  EXPECT_EQ(m.at("strata_requests_total{endpoint=\"/v1/models/{id}\",status=\"404\"}"), 1);
  EXPECT_EQ(m.at("strata_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"), 1);
  EXPECT_GT(m.at("strata_prompt_tokens_total"), 0);
  EXPECT_GT(m.at("strata_completion_tokens_total"), 0);
  EXPECT_EQ(m.at("strata_queue_depth"), 0);
  EXPECT_EQ(m.at("strata_queue_capacity"), 8);
  EXPECT_GT(m.at("strata_decode_tokens_per_second"), 0);
}

// A request is counted before its answer leaves: a client that has its answer and scrapes
// /metrics next always finds it (and every earlier scrape) counted. Counting in the HTTP
// library's logger, which runs after the write, failed this now and then on a loaded machine.
TEST_F(ServerLoopback, RequestsAreCountedBeforeTheAnswerLeaves) {
  start();
  for (int i = 1; i <= 40; ++i) {
    ASSERT_EQ(get(i % 2 ? "/health" : "/nowhere")->status, i % 2 ? 200 : 404);
    const auto m = metrics();
    ASSERT_EQ(m.at("strata_requests_total{endpoint=\"/health\",status=\"200\"}"), (i + 1) / 2)
        << "after request " << i;
    if (i > 1) {
      ASSERT_EQ(m.at("strata_requests_total{endpoint=\"other\",status=\"404\"}"), i / 2)
          << "after request " << i;
      ASSERT_EQ(m.at("strata_requests_total{endpoint=\"/metrics\",status=\"200\"}"), i - 1)
          << "after request " << i;
    }
  }
}

TEST_F(ServerLoopback, BadInputGetsTheRight4xx) {
  ServerOptions o;
  o.max_body = 64 << 10;
  start(o);
  expect_error(post("/v1/chat/completions", "{\"model\":"), 400, "invalid_json");
  expect_error(post("/v1/chat/completions", "[]"), 400, "invalid_type");
  expect_error(post("/v1/chat/completions", R"({"model":"tiny","messages":[]})"), 400,
               "empty_array");
  expect_error(post("/v1/chat/completions", R"({"model":"tiny"})"), 400,
               "missing_required_parameter");
  expect_error(post("/v1/chat/completions", with(chat_request(kMessages, 3), R"("temperature":"x")")),
               400, "invalid_type");
  expect_error(post("/v1/chat/completions", with(chat_request(kMessages, 3), R"("top_p":7)")), 400,
               "decimal_above_max_value");
  expect_error(post("/v1/chat/completions", with(chat_request(kMessages, 3), R"("bogus":1)")), 400,
               "unrecognized_argument");
  expect_error(post("/v1/chat/completions", with(chat_request(kMessages, 3), R"("n":3)")), 422,
               "unsupported_value");
  auto other = chat_request(kMessages, 3);
  other["model"] = "gpt-4o";
  expect_error(post("/v1/chat/completions", other.dump()), 404, "model_not_found");
  expect_error(post("/v1/nothing", "{}"), 404, "unknown_url");
  expect_error(post("/v1/completions", std::string(100 << 10, ' ')), 413, "request_too_large");
  // Longer than the context: as a prompt, and as prompt plus max_tokens.
  expect_error(post("/v1/completions",
                    json({{"model", "tiny"}, {"prompt", std::vector<int>(5000, 65)}}).dump()),
               400, "context_length_exceeded");
  expect_error(post("/v1/chat/completions", chat_request(kMessages, 4090).dump()), 400,
               "context_length_exceeded");
  // A message the chat template cannot take: tool-call arguments that are not a JSON object.
  const json bad_args = json::array(
      {{{"role", "user"}, {"content", "x"}},
       {{"role", "assistant"},
        {"tool_calls", {{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", "[1"}}}}}}}});
  expect_error(post("/v1/chat/completions", chat_request(bad_args, 3).dump()), 400,
               "invalid_value");
  // The server is still fine.
  EXPECT_EQ(post("/v1/chat/completions", chat_request(kMessages, 2).dump())->status, 200);
}

TEST_F(ServerLoopback, ApiKeyGuardsTheApi) {
  ServerOptions o;
  o.api_key = "sekrit";
  start(o);
  expect_error(get("/v1/models"), 401, "invalid_api_key");
  auto c = client();
  c.set_bearer_token_auth("wrong");
  expect_error(c.Get("/v1/models"), 401, "invalid_api_key");
  c.set_bearer_token_auth("sekrit");
  EXPECT_EQ(c.Get("/v1/models")->status, 200);
  EXPECT_EQ(get("/health")->status, 200) << "health and metrics stay open for probes";
  // Near misses: a prefix, the key plus a byte, one byte changed at either end, another scheme.
  for (const std::string header : {"Bearer sekri", "Bearer sekritt", "Bearer sekriT",
                                   "Bearer Sekrit", "Basic sekrit", "sekrit", "Bearer  sekrit"}) {
    httplib::Client raw = testing::loopback_client(port());
    expect_error(raw.Get("/v1/models", {{"Authorization", header}}), 401, "invalid_api_key");
  }
}

// A client that sends its request a byte at a time, each byte well inside the per-read timeout,
// is cut off when the whole request has not arrived within --read-timeout: a 408 in the body,
// a closed connection in the request line. Meanwhile and afterwards the server answers others.
TEST_F(ServerLoopback, SlowClientsGetA408) {
  ServerOptions o;
  o.read_timeout_s = 0.5;
  start(o);
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                           "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n";
  for (const bool in_body : {true, false}) {
    const int fd = testing::connect_loopback(port());
    ASSERT_GE(fd, 0);
    if (in_body) {
      ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), ssize_t(head.size()));
    }
    // One byte every 50 ms would take minutes to finish; the server must end it long before.
    std::string received;
    for (int i = 0; i < 2400; ++i) {
      const char byte = in_body ? ' ' : "GET /health HTTP/1.1"[i % 20];
      if (::send(fd, &byte, 1, MSG_NOSIGNAL) != 1) break;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        char buf[4096];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        received.append(buf, size_t(n));
        if (received.find("\r\n\r\n") != std::string::npos) break;
      }
    }
    // The answer has begun: stop sending and read the rest (the body may come in a later
    // segment) until the server closes (each read bounded by the connection's 60 s).
    char buf[4096];
    for (ssize_t n; !received.empty() && (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
      received.append(buf, size_t(n));
    ::close(fd);
    if (in_body) {
      EXPECT_EQ(received.rfind("HTTP/1.1 408", 0), 0u) << received;
      EXPECT_NE(received.find("request_timeout"), std::string::npos) << received;
    } else {
      EXPECT_EQ(received, "") << "a request line that never ends gets no answer, only a close";
    }
    EXPECT_EQ(get("/health")->status, 200);
  }
  EXPECT_EQ(metrics().at("strata_requests_total{endpoint=\"/v1/chat/completions\",status=\"408\"}"), 1);
}

// A client that opens its connection and takes longer than the keep-alive second to send its
// request (a loaded machine, a slow start) still gets its answer: the wait for a connection's
// first request is that of a request, --read-timeout. (Closing it after the keep-alive timeout
// dropped the request unanswered: the flake hunt saw node's fetch fail so.)
TEST_F(ServerLoopback, ANewConnectionMayTakeMoreThanTheKeepAliveToSendItsRequest) {
  start();
  const int fd = testing::connect_loopback(port());
  ASSERT_GE(fd, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past the 1 s keep-alive
  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), ssize_t(request.size()));
  std::string received;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) received.append(buf, size_t(n));
  ::close(fd);
  EXPECT_EQ(received.rfind("HTTP/1.1 200", 0), 0u) << received;
}

// Hostile bodies over HTTP: each gets its 4xx and the server serves the next request.
TEST_F(ServerLoopback, HostileRequestsGet4xx) {
  start();
  std::string deep = R"({"model":"tiny","messages":)";
  for (int i = 0; i < 100000; ++i) deep += '[';
  expect_error(post("/v1/chat/completions", deep), 400, "invalid_json");
  auto exploding = chat_request(kMessages, 8);
  exploding["response_format"] = {
      {"type", "json_schema"},
      {"json_schema",
       {{"name", "x"},
        {"schema", json::parse(R"({"$defs":{"a":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/a"}},)"
                               R"({"type":"array","maxItems":3,"items":{"$ref":"#/$defs/a"}}]}},)"
                               R"("$ref":"#/$defs/a"})")}}}};
  auto res = post("/v1/chat/completions", exploding.dump());
  expect_error(res, 400, "invalid_value");
  EXPECT_NE(res->body.find("parses alive at once (the limit)"), std::string::npos) << res->body;
  expect_error(post("/v1/chat/completions", chat_request(kMessages, 8).dump().insert(1, R"("n":1e300,)")),
               400, "invalid_type");
  expect_error(post("/v1/chat/completions",
                    with(chat_request(kMessages, 3), R"("max_tokens":9223372036854775807)")),
               400, "context_length_exceeded");
  // Raw HTTP the client library would never send: a bad request line, a header past the
  // limit, a chunked body with a bad chunk size.
  for (const std::string& raw :
       {std::string("NONSENSE\r\n\r\n"),
        "GET /health HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n",
        std::string("POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")}) {
    const std::string answer = send_raw(raw);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << raw.substr(0, 60) << " -> " << answer;
  }
  EXPECT_EQ(post("/v1/chat/completions", chat_request(kMessages, 2).dump())->status, 200);
}

TEST_F(ServerLoopback, TokenizeAndDetokenizeAsLlamaServer) {
  start();
  const std::string text = "Hello <|im_end|> w\xC3\xB6rld";
  auto res = post("/tokenize", json({{"content", text}}).dump());
  ASSERT_EQ(res->status, 200) << res->body;
  const auto ids = json::parse(res->body)["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, model_->encode(text));
  res = post("/tokenize", json({{"content", text}, {"parse_special", false}, {"with_pieces", true}}).dump());
  const auto pieces = json::parse(res->body)["tokens"];
  std::string joined;
  for (const auto& p : pieces) {
    ASSERT_TRUE(p["id"].is_number_integer());
    if (p["piece"].is_string()) {
      joined += p["piece"].get<std::string>();
    } else {
      for (int byte : p["piece"]) joined += char(byte);  // a piece that is not UTF-8 on its own
    }
  }
  EXPECT_EQ(joined, text);
  EXPECT_GT(pieces.size(), ids.size()) << "without parse_special <|im_end|> is plain text";
  res = post("/detokenize", json({{"tokens", ids}}).dump());
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["content"], text);
  expect_error(post("/detokenize", R"({"tokens":[1, 99999]})"), 400, "invalid_value");
  expect_error(post("/tokenize", R"({"content":"x","add_bos":true})"), 400, "unrecognized_argument");
  expect_error(post("/tokenize", R"({})"), 400, "missing_required_parameter");
}

TEST_F(ServerLoopback, AnthropicRoutesAnswerInAnthropicsShape) {
  ServerOptions o;
  o.api_key = "k";
  o.max_body = 64 << 10;
  start(o);
  const auto anthropic_error = [](const httplib::Result& res, int status, const std::string& type) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    const auto body = json::parse(res->body);
    EXPECT_EQ(body["type"], "error") << res->body;
    EXPECT_EQ(body["error"]["type"], type) << res->body;
    EXPECT_TRUE(body["error"]["message"].is_string());
  };
  const std::string ok = R"({"model":"tiny","max_tokens":2,"messages":[{"role":"user","content":"hi"}]})";
  anthropic_error(post("/v1/messages", ok), 401, "authentication_error");
  httplib::Client c = client();
  const httplib::Headers key = {{"x-api-key", "k"}};
  auto res = c.Post("/v1/messages", key, ok, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["type"], "message");
  anthropic_error(c.Post("/v1/messages", key, R"({"model":"tiny","messages":[]})", "application/json"), 400,
                  "invalid_request_error");
  anthropic_error(c.Post("/v1/messages", key, R"({"model":"x","max_tokens":1,"messages":[{"role":"user","content":"hi"}]})",
                         "application/json"),
                  404, "not_found_error");
  anthropic_error(c.Post("/v1/messages", key, std::string(100 << 10, ' '), "application/json"), 413,
                  "request_too_large");
  anthropic_error(c.Post("/v1/messages/nothing", key, "{}", "application/json"), 404, "not_found_error");
  // The OpenAI routes keep OpenAI's shape, and take the same key as a bearer token.
  c.set_bearer_token_auth("k");
  expect_error(c.Post("/v1/chat/completions", "{}", "application/json"), 400, "missing_required_parameter");
}

TEST_F(ServerLoopback, SecondTurnReusesThePromptCache) {
  start();
  auto first = post("/v1/chat/completions", chat_request(kMessages, 6).dump());
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200);
  const auto one = json::parse(first->body);
  json turns = kMessages;
  turns.push_back({{"role", "assistant"}, {"content", one["choices"][0]["message"]["content"]}});
  turns.push_back({{"role", "user"}, {"content", "And three more?"}});
  auto second = post("/v1/chat/completions", chat_request(turns, 6).dump());
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 200);
  const auto two = json::parse(second->body);
  const int64_t first_prompt = one["usage"]["prompt_tokens"];
  const int64_t cached = two["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, first_prompt) << "the whole first prompt is reused";
  EXPECT_LT(cached, two["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(metrics().at("strata_prompt_tokens_cached_total"), double(cached));
}

TEST_F(ServerLoopback, AClientThatHangsUpCancelsItsGeneration) {
  start();
  {
    RawClient stream(port(), "POST", "/v1/completions", long_completion(),
                     "Accept-Encoding: gzip, deflate, br\r\n");
    ASSERT_TRUE(stream.read_until("data: ", 3)) << stream.received();
    EXPECT_EQ(stream.received().find("Content-Encoding"), std::string::npos)
        << "a compressed stream would hold events back";
  }
  ASSERT_TRUE(await_metric("strata_generations_total{finish_reason=\"cancelled\"}", 1));
  EXPECT_LT(metrics().at("strata_completion_tokens_total"), 4000);
}

TEST_F(ServerLoopback, AFullQueueAnswers429) {
  ServerOptions o;
  o.generation.queue = 1;
  start(o);
  RawClient running(port(), "POST", "/v1/completions", long_completion());
  ASSERT_TRUE(running.read_until("data: ", 2));
  int queued_status = 0;
  std::thread queued([&] {
    auto res = post("/v1/chat/completions", chat_request(kMessages, 2).dump());
    queued_status = res ? res->status : -1;
  });
  ASSERT_TRUE(await_metric("strata_queue_depth", 1));
  auto refused = post("/v1/chat/completions", chat_request(kMessages, 2).dump());
  expect_error(refused, 429, "queue_full");
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
  running.close();
  queued.join();
  EXPECT_EQ(queued_status, 200) << "the queued request runs once the first one is gone";
  EXPECT_EQ(metrics().at("strata_rejected_total"), 1);
}

TEST_F(ServerLoopback, TheTimeLimitEndsALongGeneration) {
  ServerOptions o;
  o.generation.timeout_s = 0.5;
  start(o);
  auto res = post("/v1/completions",
                  R"({"model":"tiny","prompt":"hello","max_tokens":4000,)" + no_end_tokens() + "}");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_LT(body["usage"]["completion_tokens"], 4000);
}

TEST_F(ServerLoopback, ShutdownEndsTheRunningStreamCleanly) {
  start();
  RawClient stream(port(), "POST", "/v1/completions", long_completion());
  ASSERT_TRUE(stream.read_until("data: ", 2));
  server_->stop();
  const std::string& all = stream.read_all();
  bool done = false;
  const auto events = testing::sse_events(all.substr(all.find("\r\n\r\n")), &done);
  EXPECT_TRUE(done) << all.substr(all.size() > 500 ? all.size() - 500 : 0);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
}

const json kWeatherTool = json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"description", "Weather in a city"},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"city", {{"type", "string"}, {"maxLength", 8}}}}},
          {"required", {"city"}}}}}}}});

TEST_F(ServerLoopback, JsonSchemaResponseIsValidJson) {
  start();
  const json schema = {{"type", "object"},
                       {"properties", {{"ok", {{"type", "boolean"}}}}},
                       {"required", {"ok"}}};
  auto req = chat_request(kMessages, 600);
  req["response_format"] = {{"type", "json_schema"},
                            {"json_schema", {{"name", "answer"}, {"schema", schema}}}};
  auto res = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto choice = json::parse(res->body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop");
  const auto doc = json::parse(choice["message"]["content"].get<std::string>());
  EXPECT_TRUE(doc["ok"].is_boolean()) << doc;

  // json_object: biasing the braces makes the shortest object the likeliest.
  const auto& vocab = model_->tokenizer().vocab();
  auto obj = chat_request(kMessages, 100);
  obj["response_format"] = {{"type", "json_object"}};
  obj["logit_bias"] = json::object();
  for (const char* brace : {"{", "}"})
    if (auto id = vocab.find(brace)) obj["logit_bias"][std::to_string(*id)] = 100;
  res = post("/v1/chat/completions", obj.dump());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto text = json::parse(res->body)["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_TRUE(json::parse(text).is_object()) << text;
}

// The case from issue 13: a random model, a two-field schema, sampled, a modest max_tokens. The
// whitespace bound and the steering to the shortest ending make every reply a parseable document
// that ends with the end token, down to a budget of the shortest document itself.
TEST_F(ServerLoopback, JsonSchemaRepliesAlwaysFinish) {
  start();
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"name", {{"type", "string"}, {"maxLength", 12}}},
                         {"city", {{"type", "string"}, {"maxLength", 12}}}}},
                       {"required", {"name", "city"}},
                       {"additionalProperties", false}};
  // {"city":"","name":""} is 21 bytes, each a token in the worst case, and the end token.
  for (int max_tokens : {96, 40, 22}) {
    for (int seed = 0; seed < 3; ++seed) {
      auto req = chat_request(kMessages, max_tokens);
      req["temperature"] = 1;
      req["seed"] = seed;
      req["response_format"] = {{"type", "json_schema"},
                                {"json_schema", {{"name", "person"}, {"schema", schema}}}};
      auto res = post("/v1/chat/completions", req.dump());
      ASSERT_TRUE(res);
      ASSERT_EQ(res->status, 200) << res->body;
      const auto body = json::parse(res->body);
      const auto& choice = body["choices"][0];
      EXPECT_EQ(choice["finish_reason"], "stop") << body;
      EXPECT_LE(body["usage"]["completion_tokens"].get<int>(), max_tokens);
      const std::string text = choice["message"]["content"];
      const auto doc = json::parse(text);
      EXPECT_FALSE(decode::validate_json_schema(schema, doc)) << text;
    }
  }
}

TEST_F(ServerLoopback, ForcedToolCallComesBackAsToolCalls) {
  start();
  auto req = chat_request(kMessages, 600);
  req["tools"] = kWeatherTool;
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  auto res = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto choice = json::parse(res->body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const auto& calls = choice["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << choice;
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  const std::string arguments = calls[0]["function"]["arguments"];
  const auto args = json::parse(arguments);
  ASSERT_TRUE(args["city"].is_string()) << arguments;

  // Streamed: the same call in deltas (greedy, so the same tokens).
  req["stream"] = true;
  auto streamed = post("/v1/chat/completions", req.dump());
  ASSERT_TRUE(streamed);
  std::string name, streamed_arguments, finish;
  for (const auto& e : testing::sse_events(streamed->body)) {
    const auto& c = e["choices"][0];
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    if (!c["delta"].contains("tool_calls")) continue;
    const auto& d = c["delta"]["tool_calls"][0];
    EXPECT_EQ(d["index"], 0);
    if (d.contains("id")) name = d["function"]["name"];
    streamed_arguments += d["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(streamed_arguments, arguments);
  EXPECT_EQ(finish, "tool_calls");

  // The call and its result go back into the conversation.
  json turns = kMessages;
  turns.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}});
  turns.push_back({{"role", "tool"}, {"tool_call_id", calls[0]["id"]}, {"content", "sunny"}});
  auto next = chat_request(turns, 4);
  next["tools"] = kWeatherTool;
  EXPECT_EQ(post("/v1/chat/completions", next.dump())->status, 200);
}

TEST_F(ServerLoopback, ToolsReachTheTemplateUnlessToolChoiceIsNone) {
  start();
  const auto prompt_tokens = [&](const json& req) {
    auto res = post("/v1/chat/completions", req.dump());
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "");
    return json::parse(res->body)["usage"]["prompt_tokens"].get<int64_t>();
  };
  auto plain = chat_request(kMessages, 1);
  auto with_tools = plain;
  with_tools["tools"] = kWeatherTool;
  auto none = with_tools;
  none["tool_choice"] = "none";
  const int64_t base = prompt_tokens(plain);
  EXPECT_GT(prompt_tokens(with_tools), base + 20);
  EXPECT_EQ(prompt_tokens(none), base);
}

TEST_F(ServerLoopback, ConstraintsThatCannotBeEnforcedAre400) {
  start();
  auto req = chat_request(kMessages, 8);
  req["response_format"] = {
      {"type", "json_schema"},
      {"json_schema",
       {{"name", "x"},
        {"schema", {{"type", "object"}, {"properties", {{"a", {{"pattern", "^x$"}}}}}}}}}};
  expect_error(post("/v1/chat/completions", req.dump()), 400, "invalid_value");
  req["response_format"] = {{"type", "json_object"}};
  req["tools"] = kWeatherTool;
  req["tool_choice"] = "required";
  expect_error(post("/v1/chat/completions", req.dump()), 400, "invalid_value");
  req.erase("tools");
  req.erase("tool_choice");
  req["chat_template_kwargs"] = {{"enable_thinking", true}};
  expect_error(post("/v1/chat/completions", req.dump()), 400, "invalid_value");
}

}  // namespace
}  // namespace strata::server
