// What makes a chat reply more than free text, for every chat API (OpenAI chat completions,
// Anthropic Messages, OpenAI Responses): the constraint that a JSON response format or a forced
// tool choice puts on it (decode::JsonConstraint, built before the request is queued so a bad
// schema is a 400), and reading the model's text back as reasoning (decode::ReasoningSplitter),
// answer and tool calls (decode::ToolCallParser), whole or as streaming events.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "decode/json_constraint.h"
#include "decode/reasoning.h"
#include "decode/tool_calls.h"
#include "server/request.h"

namespace strata::server {

using Json = nlohmann::ordered_json;

struct ChatPlan {
  Json tools;            // what the template renders: null with tool_choice "none"
  Json template_kwargs;  // the request's, with enable_thinking off under a constraint
  std::shared_ptr<decode::JsonConstraint> constraint;  // null: free text
  bool read_tool_calls = false;
};

// Throws ApiError 400 for a schema or tool set the constraint cannot enforce, a response_format
// beside a forced tool call, or thinking asked for under a constraint (a <think> block is not
// JSON).
ChatPlan plan_chat(const ChatRequest& r, const decode::JsonVocab& vocab);

// What a piece of the reply adds: reasoning text, answer text, tool-call deltas, in this order.
struct ReplyEvents {
  std::string reasoning;
  std::string content;
  std::vector<decode::ToolCallDelta> calls;
};

// Splits the generated text into reasoning (when the template thinks), answer text and tool
// calls (when tools were offered). How the text is cut never changes the result.
class ReplyReader {
 public:
  ReplyReader(decode::ThinkingStart thinking, bool read_tool_calls, uint64_t id_salt);

  ReplyEvents feed(const std::string& text);
  // The held-back rest once generation has ended.
  ReplyEvents finish();

  // Everything so far (after finish(): the whole reply).
  const std::string& reasoning() const { return splitter_.reasoning(); }
  const std::string& content() const;
  const std::vector<decode::ToolCall>& tool_calls() const;
  bool has_tool_calls() const { return !tool_calls().empty(); }

 private:
  ReplyEvents answer(decode::ReasoningEvents split, bool last);

  decode::ReasoningSplitter splitter_;
  std::unique_ptr<decode::ToolCallParser> parser_;  // null: plain text
};

}  // namespace strata::server
