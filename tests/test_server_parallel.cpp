// --parallel: several generations share decode windows. In-process servers on loopback ports
// with a tiny synthetic model: requests sent at once (chat and completions, streamed and not,
// greedy and sampled, a JSON schema, different lengths), while a long stream holds a slot and
// another client hangs up mid-stream, each come back exactly as the same request answered alone
// by a --parallel 1 server; a conversation keeps its slot's prompt cache; the queue and 429 count
// beyond the running generations; /metrics shows each running sequence; the expert-cache panel's
// endpoint reads a streamed cache while its windows run; with speculation on, a request alone
// drafts and every reply is still the plain one.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "decode/loaded_model.h"
#include "experts/pack.h"
#include "gguf/gguf.h"
#include "server/server.h"
#include "test_server_util.h"

namespace strata::server {
namespace {

using nlohmann::json;
using testing::RawClient;

struct Call {
  std::string path;
  json request;
};

class ServerParallel : public testing::TinyModelSuite<ServerParallel> {
 protected:
  static void SetUpTestSuite() { load_tiny_model(2048); }

  static testing::RunningServer start(size_t parallel, size_t queue = 8, decode::LoadedModel* model = nullptr) {
    ServerOptions o;
    o.generation.parallel = parallel;
    o.generation.queue = queue;
    o.generation.batch = 16;  // a long prompt takes several windows beside the others' decode rows
    return testing::RunningServer(model ? *model : *model_, o);
  }

  // Twice the usual read bound: a request here may queue and shares its windows with others.
  static httplib::Result post(int port, const std::string& path, const std::string& body) {
    return testing::post_json(port, path, body, 120);
  }

  // A streamed completion that cannot end before its 1500 tokens: it holds a slot while the test
  // runs.
  static std::string slot_holder() {
    return json({{"model", "tiny"}, {"prompt", "hold"}, {"max_tokens", 1500}, {"stream", true},
                 {"logit_bias", testing::no_end_token_bias(*model_)}})
        .dump();
  }

  // What a reply is, whatever the API: the text (joined from a stream), its end and its length.
  static json reply_of(const std::string& path, const json& request, const std::string& body) {
    if (!request.value("stream", false)) {
      const json r = json::parse(body);
      const json& c = r["choices"][0];
      return {{"text", path == "/v1/completions" ? c["text"] : c["message"]["content"]},
              {"finish", c["finish_reason"]},
              {"tokens", r["usage"]["completion_tokens"]}};
    }
    std::string text, finish;
    for (const auto& e : testing::sse_events(body)) {
      if (e["choices"].empty()) continue;
      const json& c = e["choices"][0];
      if (path == "/v1/completions")
        text += c["text"].get<std::string>();
      else if (c["delta"].contains("content"))
        text += c["delta"]["content"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    return {{"text", text}, {"finish", finish}};
  }

  // Each request's reply from a --parallel 1 server without speculation, one after another.
  static std::vector<json> answered_alone(const std::vector<Call>& requests) {
    std::vector<json> replies;
    auto serial = start(1);
    for (const Call& c : requests) {
      auto res = post(serial.port(), c.path, c.request.dump());
      EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
      replies.push_back(res && res->status == 200 ? reply_of(c.path, c.request, res->body) : json());
    }
    return replies;
  }

  // The replies of the requests sent at once, each from a client thread of its own.
  static std::vector<json> answered_at_once(int port, const std::vector<Call>& requests) {
    std::vector<json> replies(requests.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < requests.size(); ++i)
      clients.emplace_back([&, i] {
        auto res = post(port, requests[i].path, requests[i].request.dump());
        if (res && res->status == 200) replies[i] = reply_of(requests[i].path, requests[i].request, res->body);
      });
    for (auto& t : clients) t.join();
    return replies;
  }
};

std::vector<Call> calls() {
  const auto chat = [](const std::string& text, int max_tokens, json extra = json::object()) {
    json r = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", max_tokens}};
    r.update(extra);
    return Call{"/v1/chat/completions", r};
  };
  const json schema = {{"type", "object"},
                       {"properties", {{"ok", {{"type", "boolean"}}}, {"why", {{"type", "string"}, {"maxLength", 8}}}}},
                       {"required", {"ok", "why"}}};
  return {
      chat("Name three colours.", 24),
      chat("Tell me a story about experts.", 40, {{"temperature", 1}, {"seed", 7}}),
      chat("Streamed and sampled", 30, {{"temperature", 0.8}, {"seed", 3}, {"stream", true}}),
      chat(std::string(600, 'y') + " summarise that", 12),
      chat("Reply in JSON", 60, {{"temperature", 1}, {"seed", 5},
                                 {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}}),
      Call{"/v1/completions", {{"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 20}, {"seed", 2}, {"temperature", 1}}},
      Call{"/v1/completions", {{"model", "tiny"}, {"prompt", "In a land far away"}, {"max_tokens", 9}, {"stream", true}}},
      chat("One more, short", 3),
  };
}

TEST_F(ServerParallel, EveryReplyEqualsTheSameRequestAnsweredAlone) {
  const auto requests = calls();
  const std::vector<json> alone = answered_alone(requests);
  auto parallel = start(4);
  // Two long streams hold two slots throughout, so every request below shares its windows with
  // them (and with each other); a third client hangs up on its stream first.
  const std::string holder = slot_holder();
  RawClient held(parallel.port(), "POST", "/v1/completions", holder);
  RawClient also_held(parallel.port(), "POST", "/v1/completions", holder);
  ASSERT_TRUE(held.read_until("data: ", 2));
  ASSERT_TRUE(also_held.read_until("data: ", 2));
  {
    RawClient leaver(parallel.port(), "POST", "/v1/completions", holder);
    ASSERT_TRUE(leaver.read_until("data: ", 2));
    ASSERT_TRUE(testing::await_metric(parallel.port(), "strata_generation_running", 3));
  }
  ASSERT_TRUE(testing::await_metric(parallel.port(), "strata_generations_total{finish_reason=\"cancelled\"}", 1));
  const std::vector<json> together = answered_at_once(parallel.port(), requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(together[i], alone[i]) << requests[i].request.dump();
  {
    const auto m = testing::scrape_metrics(parallel.port());
    EXPECT_EQ(m.at("strata_generation_running"), 2) << "the held streams ran throughout";
    // Each running generation by its sequence: tokens so far and its decode speed.
    std::vector<double> tokens, speeds;
    for (const auto& [name, value] : m) {
      if (name.starts_with("strata_sequence_tokens{")) tokens.push_back(value);
      if (name.starts_with("strata_sequence_decode_tokens_per_second{")) speeds.push_back(value);
    }
    ASSERT_EQ(tokens.size(), 2u);
    ASSERT_EQ(speeds.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_GT(tokens[i], 1);
      EXPECT_GT(speeds[i], 0);
    }
  }
  held.close();
  also_held.close();
  EXPECT_TRUE(testing::await_metric(parallel.port(), "strata_generation_running", 0));
  const auto m = testing::scrape_metrics(parallel.port());
  EXPECT_EQ(m.at("strata_parallel_sequences"), 4);
  for (const auto& [name, value] : m) EXPECT_FALSE(name.starts_with("strata_sequence_")) << name << " with none running";
  EXPECT_EQ(m.at("strata_generations_total{finish_reason=\"cancelled\"}"), 3);
}

// With speculation on (the tiny model's MTP head, two drafts a window), a request that has the
// server to itself drafts (its timings count the drafts) and every reply still equals the same
// request answered by a --parallel 1 server without speculation: one at a time, then all at once
// (their windows shared, drafting only when one is left).
TEST_F(ServerParallel, ARequestAloneSpeculatesAndRepliesAsWithout) {
  const auto requests = calls();
  const std::vector<json> alone = answered_alone(requests);
  ServerOptions o;
  o.generation.parallel = 3;
  o.generation.queue = 8;
  o.generation.batch = 16;
  o.generation.spec.mode = spec::Mode::Mtp;
  o.generation.spec.depth = 2;
  testing::RunningServer speculating(*model_, o);
  int drafted = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto res = post(speculating.port(), requests[i].path, requests[i].request.dump());
    ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
    EXPECT_EQ(reply_of(requests[i].path, requests[i].request, res->body), alone[i]) << requests[i].request.dump();
    if (!requests[i].request.value("stream", false))
      drafted += json::parse(res->body)["timings"].value("draft_n", 0);
  }
  EXPECT_GT(drafted, 0) << "requests alone drafted";
  const std::vector<json> together = answered_at_once(speculating.port(), requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(together[i], alone[i]) << requests[i].request.dump();
  EXPECT_GT(testing::scrape_metrics(speculating.port()).at("strata_spec_drafted_windows_total"), 0);
}

TEST_F(ServerParallel, AConversationKeepsItsSlotsPromptCache) {
  auto parallel = start(2);
  const auto turn = [&](const json& messages) {
    auto res = post(parallel.port(), "/v1/chat/completions",
                    json({{"model", "tiny"}, {"messages", messages}, {"max_tokens", 6}}).dump());
    EXPECT_TRUE(res && res->status == 200);
    return json::parse(res->body);
  };
  json a = {{{"role", "user"}, {"content", "Conversation A begins here."}}};
  json b = {{{"role", "user"}, {"content", "Something else entirely, conversation B."}}};
  const json a1 = turn(a);
  const json b1 = turn(b);
  a.push_back(a1["choices"][0]["message"]);
  a.push_back({{"role", "user"}, {"content", "A goes on."}});
  const json a2 = turn(a);
  EXPECT_GE(a2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), a1["usage"]["prompt_tokens"].get<int>())
      << "A's second turn found A's state although B ran in between";
  b.push_back(b1["choices"][0]["message"]);
  b.push_back({{"role", "user"}, {"content", "B goes on."}});
  EXPECT_GE(turn(b)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), b1["usage"]["prompt_tokens"].get<int>());
}

TEST_F(ServerParallel, TheQueueCountsBeyondTheRunningGenerations) {
  auto parallel = start(2, 1);
  const std::string holder = slot_holder();
  RawClient one(parallel.port(), "POST", "/v1/completions", holder);
  RawClient two(parallel.port(), "POST", "/v1/completions", holder);
  ASSERT_TRUE(one.read_until("data: ", 2));
  ASSERT_TRUE(two.read_until("data: ", 2));
  RawClient waiting(parallel.port(), "POST", "/v1/completions",
                    R"({"model":"tiny","prompt":"wait","max_tokens":2})");
  ASSERT_TRUE(testing::await_metric(parallel.port(), "strata_queue_depth", 1));
  auto refused = post(parallel.port(), "/v1/completions", R"({"model":"tiny","prompt":"no room","max_tokens":2})");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 429);
  one.close();
  const std::string& answer = waiting.read_all();
  EXPECT_NE(answer.find("\"text_completion\""), std::string::npos) << answer;
}


// The chat page's expert-cache panel reads GET /expert-cache while sequences share windows over a
// streamed cache: the counters and residency of a window boundary, never torn (the TSan build
// runs this), and each reply's timings carry the cache's share.
TEST_F(ServerParallel, TheExpertCachePanelReadsTheCacheBetweenWindows) {
  const std::string path = dir_->file("tiny.gguf");
  experts::write_pack(*gguf::Reader::open(path), path + ".experts");
  const auto pack = experts::Pack::open(path + ".experts");
  decode::LoadOptions load;
  load.path = path;
  load.threads = 1;
  load.ctx = 512;
  load.experts.budget_bytes = 6 * ((pack->max_record_bytes() + 4095) / 4096 * 4096);  // 6 slots
  decode::LoadedModel streamed(load);
  auto server = start(2, 8, &streamed);
  auto c = testing::loopback_client(server.port());
  const json idle = json::parse(c.Get("/expert-cache")->body);
  EXPECT_EQ(idle["streamed"], true);
  EXPECT_EQ(idle["n_layers"], pack->n_layers()) << "the pack's layers: the model's and its MTP block's";
  EXPECT_EQ(idle["n_experts"], pack->n_experts());

  std::vector<json> replies(2);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < replies.size(); ++i)
    clients.emplace_back([&, i] {
      auto res = post(server.port(), "/v1/chat/completions",
                      json({{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Stream me " + std::to_string(i)}}}},
                            {"max_tokens", 40}, {"logit_bias", testing::no_end_token_bias(*model_)}})
                          .dump());
      if (res && res->status == 200) replies[i] = json::parse(res->body);
    });
  // Read while the windows run: every reading is whole and the counters only grow.
  uint64_t windows = 0, lookups = 0;
  for (int i = 0; i < 50; ++i) {
    const json s = json::parse(c.Get("/expert-cache")->body);
    ASSERT_EQ(s["resident"].size(), size_t(s["n_layers"]));
    size_t resident = 0;
    for (const auto& row : s["resident"]) {
      const std::string bits = row;
      ASSERT_EQ(bits.size(), size_t(s["n_experts"]));
      resident += size_t(std::count(bits.begin(), bits.end(), '1'));
    }
    EXPECT_LE(resident, 6u) << "no more experts resident than the cache has slots: " << s.dump();
    EXPECT_GE(s["windows"].get<uint64_t>(), windows);
    EXPECT_GE(s["hits"].get<uint64_t>() + s["misses"].get<uint64_t>(), lookups);
    windows = s["windows"];
    lookups = s["hits"].get<uint64_t>() + s["misses"].get<uint64_t>();
  }
  for (auto& t : clients) t.join();
  const json done = json::parse(c.Get("/expert-cache")->body);
  EXPECT_GT(done["windows"].get<uint64_t>(), 40u) << "a prefill and 39 decode windows at least";
  EXPECT_GT(done["misses"].get<uint64_t>(), 0u);
  EXPECT_GT(done["bytes_read"].get<uint64_t>(), 0u);
  const double rate = done["hit_rate"];
  EXPECT_DOUBLE_EQ(rate, double(done["hits"].get<uint64_t>()) /
                             double(done["hits"].get<uint64_t>() + done["misses"].get<uint64_t>()));
  EXPECT_EQ(done["h2d_bytes"], 0u) << "host expert slots: nothing is copied to a device";
  EXPECT_EQ(done["handshakes"], 0u) << "CPU windows: no device waits for the host";
  // /metrics exports the same counters (nothing runs between the two readings).
  const auto m = testing::scrape_metrics(server.port());
  EXPECT_EQ(m.at("strata_expert_cache_hits_total"), double(done["hits"].get<uint64_t>()));
  EXPECT_EQ(m.at("strata_expert_cache_misses_total"), double(done["misses"].get<uint64_t>()));
  EXPECT_EQ(m.at("strata_expert_cache_read_bytes_total"), double(done["bytes_read"].get<uint64_t>()));
  EXPECT_EQ(m.at("strata_expert_cache_evictions_total"), double(done["evictions"].get<uint64_t>()));
  EXPECT_EQ(m.at("strata_expert_cache_h2d_bytes_total"), 0.0);
  EXPECT_EQ(m.at("strata_expert_cache_handshakes_total"), 0.0);
  EXPECT_EQ(m.at("strata_expert_cache_handshake_seconds_total"), 0.0);
  EXPECT_GE(m.at("strata_expert_cache_stall_seconds_total"), 0.0);
  for (const json& r : replies) {
    ASSERT_TRUE(r.contains("timings")) << r.dump();
    EXPECT_EQ(r["timings"]["predicted_n"], 40);
    EXPECT_GE(r["timings"]["expert_hit_rate"].get<double>(), 0.0);
    EXPECT_LE(r["timings"]["expert_hit_rate"].get<double>(), 1.0);
    EXPECT_TRUE(r["timings"].contains("stall_ms_per_token"));
  }
}

}  // namespace
}  // namespace strata::server
