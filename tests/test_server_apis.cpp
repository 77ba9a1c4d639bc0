// The Anthropic Messages and OpenAI Responses request parsers: what each API's content blocks and
// items become for the chat template (tool calls, tool results, reasoning), how their options map
// onto the shared generation, and that malformed or unknown fields are 400s naming the field by
// the API's own path. Also Anthropic's error shape and status mapping.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server/anthropic_api.h"
#include "server/anthropic_request.h"
#include "server/responses_request.h"

namespace strata::server {
namespace {

using nlohmann::json;

const RequestLimits kLimits{"tiny", 512};

// The ApiError a body gets, or a failure when it is accepted.
template <typename Parse>
ApiError error_of(Parse parse, const std::string& body) {
  try {
    parse(body, kLimits);
  } catch (const ApiError& e) {
    EXPECT_FALSE(e.message.empty());
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

ApiError anthropic_error(const json& body) { return error_of(parse_anthropic_messages, body.dump()); }
ApiError responses_error(const json& body) { return error_of(parse_responses_request, body.dump()); }

// The parsers keep key order (ordered_json); compare as plain JSON.
json plain(const nlohmann::ordered_json& j) { return json::parse(j.dump()); }

json message_body(const json& messages) {
  return {{"model", "tiny"}, {"max_tokens", 32}, {"messages", messages}};
}

TEST(AnthropicRequest, BlocksBecomeTheTemplatesMessages) {
  json body = message_body(json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
      {"type": "text", "text": "Let me check."},
      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
      {"type": "text", "text": "Thanks."}]}])"));
  body["system"] = json::array({{{"type", "text"}, {"text", "Be brief."}}, {{"type", "text"}, {"text", "Be kind."}}});
  body["stop_sequences"] = {"END"};
  body["temperature"] = 0.5;
  body["top_k"] = 7;
  const ChatRequest r = parse_anthropic_messages(body.dump(), kLimits);
  ASSERT_EQ(r.messages.size(), 5u) << r.messages.dump();
  EXPECT_EQ(plain(r.messages[0]), json({{"role", "system"}, {"content", "Be brief.\nBe kind."}}));
  EXPECT_EQ(r.messages[1]["role"], "user");
  const auto& assistant = r.messages[2];
  EXPECT_EQ(assistant["content"], "Let me check.");
  EXPECT_EQ(assistant["reasoning_content"], "Use the tool.");
  EXPECT_EQ(assistant["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(assistant["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(plain(assistant["tool_calls"][0]["function"]["arguments"]), json({{"city", "Paris"}}));
  EXPECT_EQ(plain(r.messages[3]), json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "21 C"}}));
  EXPECT_EQ(plain(r.messages[4]), json({{"role", "user"}, {"content", "Thanks."}}));
  EXPECT_EQ(r.gen.max_tokens, 32);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_EQ(r.gen.sampling.top_k, 7);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false) << "Anthropic's models think only when asked";
  EXPECT_FALSE(r.stream);
}

TEST(AnthropicRequest, ToolsToolChoiceAndThinking) {
  json body = message_body({{{"role", "user"}, {"content", "hi"}}});
  body["tools"] = json::parse(R"([{"name": "get_weather", "description": "d",
      "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}, {"name": "now", "input_schema": {}}])");
  body["tool_choice"] = {{"type", "tool"}, {"name", "now"}};
  ChatRequest r = parse_anthropic_messages(body.dump(), kLimits);
  EXPECT_EQ(r.tools[0]["type"], "function");
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
  EXPECT_EQ(r.tool_choice.mode, ToolChoiceMode::Function);
  EXPECT_EQ(r.tool_choice.function, "now");
  body["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
  r = parse_anthropic_messages(body.dump(), kLimits);
  EXPECT_EQ(r.tool_choice.mode, ToolChoiceMode::Required);
  EXPECT_FALSE(r.parallel_tool_calls);
  body["tool_choice"] = {{"type", "none"}};
  EXPECT_EQ(parse_anthropic_messages(body.dump(), kLimits).tool_choice.mode, ToolChoiceMode::None);

  body.erase("tool_choice");
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 16}};
  r = parse_anthropic_messages(body.dump(), kLimits);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], true);
  EXPECT_EQ(r.thinking_budget, 16);
  body["thinking"]["budget_tokens"] = 32;
  EXPECT_EQ(anthropic_error(body).param, "thinking.budget_tokens") << "the budget must be below max_tokens";

  // count_tokens takes the same messages without max_tokens.
  const json count = {{"model", "tiny"}, {"messages", body["messages"]}, {"system", "s"}};
  EXPECT_EQ(parse_anthropic_count_tokens(count.dump(), kLimits).messages.size(), 2u);
  EXPECT_EQ(error_of(parse_anthropic_count_tokens, json({{"model", "tiny"}, {"messages", body["messages"]},
                                                         {"max_tokens", 5}}).dump()).param,
            "max_tokens");
}

TEST(AnthropicRequest, BadFieldsAre400sNamingThem) {
  const json hi = {{{"role", "user"}, {"content", "hi"}}};
  json missing = {{"model", "tiny"}, {"messages", hi}};
  const ApiError no_max = anthropic_error(missing);
  EXPECT_EQ(no_max.status, 400);
  EXPECT_EQ(no_max.param, "max_tokens");
  EXPECT_NE(no_max.message.find("max_tokens"), std::string::npos);

  const auto param = [&](json body) { return anthropic_error(body).param; };
  json b = message_body(hi);
  b["frobnicate"] = 1;
  EXPECT_EQ(param(b), "frobnicate");
  EXPECT_EQ(param(message_body({{{"role", "user"}, {"content", {{{"type", "text"}, {"txt", "x"}}}}}})),
            "messages.0.content.0.txt");
  EXPECT_EQ(param(message_body({{{"role", "robot"}, {"content", "x"}}})), "messages.0.role");
  EXPECT_EQ(param(message_body({{{"role", "user"}, {"content", {{{"type", "tool_use"}, {"id", "t"}, {"name", "n"},
                                                                  {"input", json::object()}}}}}})),
            "messages.0.content.0.type")
      << "a user message cannot hold tool_use";
  EXPECT_EQ(param(message_body({{{"role", "assistant"}, {"content", {{{"type", "tool_use"}, {"id", "t"}, {"name", "n"}}}}}})),
            "messages.0.content.0.input");
  EXPECT_EQ(param(message_body({{{"role", "user"}, {"content", {{{"type", "image"}, {"source", json::object()}}}}}})),
            "messages.0.content.0.type");
  b = message_body(hi);
  b["temperature"] = 1.5;
  EXPECT_EQ(param(b), "temperature");
  b = message_body(hi);
  b["stop_sequences"] = {""};
  EXPECT_EQ(param(b), "stop_sequences.0");
  b = message_body(hi);
  b["tools"] = {{{"name", "bad name"}, {"input_schema", json::object()}}};
  EXPECT_EQ(param(b), "tools.0.name");
  b["tools"] = {{{"type", "web_search_20250305"}, {"name", "web_search"}}};
  EXPECT_EQ(param(b), "tools.0.type");
  b = message_body(hi);
  b["tool_choice"] = {{"type", "any"}};
  EXPECT_EQ(param(b), "tool_choice") << "no tools to choose from";
  b = message_body(hi);
  b["model"] = "claude";
  EXPECT_EQ(anthropic_error(b).status, 404);
}

TEST(AnthropicRequest, ErrorShapeAndStatus) {
  const auto body = plain(anthropic_error_body(ApiError(400, "messages: Field required", "messages")));
  EXPECT_EQ(body, json::parse(R"({"type":"error","error":{"type":"invalid_request_error","message":"messages: Field required"}})"));
  const std::pair<int, const char*> cases[] = {{401, "authentication_error"}, {404, "not_found_error"},
                                                {413, "request_too_large"},    {429, "rate_limit_error"},
                                                {500, "api_error"},            {503, "overloaded_error"},
                                                {422, "invalid_request_error"}};
  for (const auto& [status, type] : cases)
    EXPECT_EQ(anthropic_error_body(ApiError(status, "x"))["error"]["type"], type) << status;
  EXPECT_EQ(anthropic_status(ApiError(422, "x")), 400);
  EXPECT_EQ(anthropic_status(ApiError(429, "x")), 429);
}

TEST(ResponsesRequest, ItemsBecomeTheTemplatesMessages) {
  const json body = json::parse(R"({"model": "tiny", "instructions": "Be brief.", "input": [
      {"role": "user", "content": "Weather?"},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
       "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call", "call_id": "call_2", "name": "now", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
      {"role": "developer", "content": [{"type": "input_text", "text": "Shorter."}]}],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": "required", "parallel_tool_calls": false, "max_output_tokens": 40, "temperature": 0.7,
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}},
    "reasoning": {"effort": "none"}, "store": true, "metadata": {"k": "v"}})");
  const ResponsesRequest q = parse_responses_request(body.dump(), kLimits);
  const ChatRequest& r = q.chat;
  ASSERT_EQ(r.messages.size(), 6u) << r.messages.dump();
  EXPECT_EQ(plain(r.messages[0]), json({{"role", "system"}, {"content", "Be brief."}}));
  const auto& calls = r.messages[2];
  EXPECT_EQ(calls["role"], "assistant");
  EXPECT_EQ(calls["reasoning_content"], "Call the tool.");
  ASSERT_EQ(calls["tool_calls"].size(), 2u) << "parallel calls join one assistant turn";
  EXPECT_EQ(calls["tool_calls"][1]["function"]["name"], "now");
  EXPECT_EQ(plain(r.messages[3]), json({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "21 C"}}));
  EXPECT_EQ(r.messages[4]["content"], "Sunny.");
  EXPECT_EQ(plain(r.messages[5]), json({{"role", "system"}, {"content", "Shorter."}}));
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.tool_choice.mode, ToolChoiceMode::Required);
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.gen.max_tokens, 40);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.7f);
  EXPECT_EQ(r.response_format.type, ResponseFormatType::JsonSchema);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(q.metadata["k"], "v");

  const ResponsesRequest text = parse_responses_request(R"({"model":"tiny","input":"hi"})", kLimits);
  ASSERT_EQ(text.chat.messages.size(), 1u);
  EXPECT_EQ(plain(text.chat.messages[0]), json({{"role", "user"}, {"content", "hi"}}));
  EXPECT_FALSE(text.chat.max_tokens_given);
  EXPECT_FALSE(text.chat.template_kwargs.contains("enable_thinking")) << "the template's default";
}

TEST(ResponsesRequest, BadFieldsAre400sNamingThem) {
  const auto error = [](const std::string& extra, const json& input = "hi") {
    json body = {{"model", "tiny"}, {"input", input}};
    if (!extra.empty()) body.update(json::parse("{" + extra + "}"));
    return responses_error(body);
  };
  EXPECT_EQ(error(R"("frobnicate": 1)").param, "frobnicate");
  EXPECT_EQ(error("", json::array({{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}})).param,
            "input[0].call_id");
  EXPECT_EQ(error("", json::array({{{"role", "user"}, {"content", {{{"type", "input_txt"}, {"text", "x"}}}}}})).param,
            "input[0].content[0].type");
  EXPECT_EQ(error("", json::array({{{"type", "message"}, {"role", "user"}, {"content", "x"}, {"extra", 1}}})).param,
            "input[0].extra");
  EXPECT_EQ(error("", json::array()).param, "input");
  EXPECT_EQ(error(R"("temperature": 3)").param, "temperature");
  EXPECT_EQ(error(R"("max_output_tokens": 0)").param, "max_output_tokens");
  EXPECT_EQ(error(R"("text": {"format": {"type": "json_schema", "name": "x"}})").param, "text.format.schema");
  EXPECT_EQ(error(R"("reasoning": {"effort": "maximal"})").param, "reasoning.effort");
  EXPECT_EQ(error(R"("tool_choice": {"type": "function", "name": "f"})").param, "tool_choice.name");
  EXPECT_EQ(error(R"("stream_options": {"include_obfuscation": false})").param, "stream_options");
  // Valid OpenAI, but not here: 422.
  for (const char* unsupported : {R"("previous_response_id": "resp_1")", R"("background": true)",
                                  R"("tools": [{"type": "web_search"}])", R"("top_logprobs": 2)"}) {
    const ApiError e = error(unsupported);
    EXPECT_EQ(e.status, 422) << unsupported;
    EXPECT_EQ(e.code, "unsupported_value");
  }
  EXPECT_EQ(error("", json::array({{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}})).status,
            422);
  EXPECT_EQ(responses_error({{"model", "gpt-5"}, {"input", "hi"}}).status, 404);
}

}  // namespace
}  // namespace strata::server
