// The reasoning split through /v1/chat/completions, in-process on a loopback port: a tiny model
// served with a template that opens <think> in the prompt (tests/fixtures/chat_templates/
// thinking.jinja). The thinking text comes back as reasoning_content, never in content, equal to
// what decode::Session generates for the same prompt split by decode::ReasoningSplitter; streamed
// deltas join to the same; enable_thinking=false has no reasoning; a thinking budget forces
// </think> after that many tokens.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "decode/generate.h"
#include "decode/loaded_model.h"
#include "decode/reasoning.h"
#include "server/server.h"
#include "test_server_util.h"

namespace strata::server {
namespace {

using nlohmann::json;

// The template that opens <think> in the prompt, in place of the tiny model's own.
std::string thinking_template() {
  std::ifstream in(STRATA_SOURCE_DIR "/tests/fixtures/chat_templates/thinking.jinja");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class ServerReasoning : public testing::TinyModelSuite<ServerReasoning> {
 protected:
  static void SetUpTestSuite() { load_tiny_model(2048, thinking_template()); }

  json chat(const json& request) const {
    auto res = testing::post_json(server_.port(), "/v1/chat/completions", request.dump());
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
    return res ? json::parse(res->body) : json();
  }
  std::string stream(const json& request) const {
    json r = request;
    r["stream"] = true;
    auto res = testing::post_json(server_.port(), "/v1/chat/completions", r.dump());
    EXPECT_TRUE(res && res->status == 200);
    return res ? res->body : "";
  }

  // What decode::Session generates for the request's prompt (greedy), split into reasoning and
  // answer; with a budget, through decode::ThinkingBudget's hooks.
  static std::pair<std::string, std::string> expected(const json& messages, const json& kwargs,
                                                      int64_t max_tokens, std::optional<int64_t> budget) {
    const std::string text = model_->render_chat(nlohmann::ordered_json(messages), nullptr, true,
                                                 nlohmann::ordered_json(kwargs));
    const auto start = decode::thinking_start(text, model_->template_thinks());
    decode::Session session(model_->model(), model_->tokenizer(), {.n_ctx = 2048});
    decode::GenerateParams p;
    p.max_tokens = max_tokens;
    std::shared_ptr<decode::ThinkingBudget> limit;
    if (budget) {
      limit = std::make_shared<decode::ThinkingBudget>(model_->tokenizer(), start, *budget);
      p.logits_filter = [limit](std::span<float> logits) { limit->filter(logits); };
      p.on_token = [limit](int32_t id) { limit->accept(id); };
    }
    const auto result = session.generate(model_->encode(text), p, {});
    decode::ReasoningSplitter splitter(start);
    splitter.feed(result.text);
    splitter.finish();
    return {testing::as_json_text(splitter.reasoning()), testing::as_json_text(splitter.content())};
  }

  // A server for each test, made once the suite's model is loaded.
  testing::RunningServer server_{*model_, ServerOptions{}};
};

const json kMessages = json::array({{{"role", "user"}, {"content", "What is 2+2?"}}});

TEST_F(ServerReasoning, ThinkingGoesToReasoningContent) {
  const json request = {{"model", "tiny"}, {"messages", kMessages}, {"max_tokens", 24}};
  const auto [reasoning, content] = expected(kMessages, json::object(), 24, std::nullopt);
  ASSERT_FALSE(reasoning.empty());
  const json body = chat(request);
  const auto& message = body["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], reasoning);
  EXPECT_EQ(message["content"], content);
  EXPECT_EQ(message["content"].get<std::string>().find("think>"), std::string::npos);

  // Streamed: reasoning_content deltas, then content deltas, joining to the same texts.
  std::string streamed_reasoning, streamed_content;
  bool content_started = false;
  for (const auto& e : testing::sse_events(stream(request))) {
    if (e["choices"].empty()) continue;
    const auto& delta = e["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) {
      EXPECT_FALSE(content_started) << "reasoning after the answer began";
      streamed_reasoning += delta["reasoning_content"].get<std::string>();
    }
    if (delta.contains("content")) {
      content_started |= !delta["content"].get<std::string>().empty();
      streamed_content += delta["content"].get<std::string>();
    }
  }
  EXPECT_EQ(streamed_reasoning, reasoning);
  EXPECT_EQ(streamed_content, content);
}

TEST_F(ServerReasoning, EnableThinkingFalseHasNoReasoning) {
  const json kwargs = {{"enable_thinking", false}};
  const json body = chat({{"model", "tiny"}, {"messages", kMessages}, {"max_tokens", 12},
                          {"chat_template_kwargs", kwargs}});
  const auto& message = body["choices"][0]["message"];
  EXPECT_FALSE(message.contains("reasoning_content")) << message;
  EXPECT_EQ(message["content"], expected(kMessages, kwargs, 12, std::nullopt).second);
}

TEST_F(ServerReasoning, ABudgetForcesTheEndOfThinking) {
  const json body = chat({{"model", "tiny"}, {"messages", kMessages}, {"max_tokens", 30},
                          {"thinking_token_budget", 4}});
  const auto [reasoning, content] = expected(kMessages, json::object(), 30, 4);
  const auto& message = body["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], reasoning);
  EXPECT_EQ(message["content"], content);
  // Four tokens of thinking are a short text; the unbounded run thinks on for all 30.
  const auto unbounded = expected(kMessages, json::object(), 30, std::nullopt);
  EXPECT_LT(reasoning.size(), unbounded.first.size());
  EXPECT_FALSE(content.empty());

  auto bad = testing::post_json(server_.port(), "/v1/chat/completions",
                               json({{"model", "tiny"}, {"messages", kMessages}, {"thinking_token_budget", -1}}).dump());
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "thinking_token_budget");
}

}  // namespace
}  // namespace strata::server
