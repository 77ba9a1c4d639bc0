// What makes a chat reply more than free text: the constraint that response_format or a forced
// tool_choice puts on it (decode::JsonConstraint, built before the request is queued so a bad
// schema is a 400), and reading the model's <tool_call> blocks back as OpenAI tool calls
// (decode::ToolCallParser), whole or as streaming deltas.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "decode/json_constraint.h"
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

// Turns generated text into OpenAI message content and tool calls. Without tool reading it
// passes the text through.
class ReplyReader {
 public:
  ReplyReader(bool read_tool_calls, uint64_t id_salt);

  // Streaming: the `delta` objects for a piece of text (none while text is held back).
  std::vector<Json> feed(const std::string& text);
  // The deltas of the held-back rest once generation has ended.
  std::vector<Json> finish();
  // After finish(): the whole message, and whether it carries tool calls.
  Json message() const;
  bool has_tool_calls() const;

 private:
  std::vector<Json> deltas(const decode::ToolCallEvents& events);

  std::unique_ptr<decode::ToolCallParser> parser_;  // null: plain text
  std::string text_;
};

}  // namespace strata::server
