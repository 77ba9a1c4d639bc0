// OpenAI Responses request bodies (POST /v1/responses) -> the ChatRequest every chat API
// generates from. `instructions` becomes the system message; `input` is a string (one user
// message) or items: messages (input_text / output_text parts), function_call and
// function_call_output items (an assistant's tool_calls and the tool messages), reasoning items
// (the next assistant turn's reasoning_content). Tools are the Responses API's flat function
// tools; text.format json_object / json_schema is the constrained JSON output of chat
// completions; reasoning.effort "none" turns thinking off. Responses are not stored:
// previous_response_id and background are refused. Unknown or malformed fields throw
// ApiError(400) naming the field; docs/SERVER.md lists them.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "server/request.h"

namespace strata::server {

struct ResponsesRequest {
  ChatRequest chat;
  // Echoed in the response object, as OpenAI does.
  nlohmann::ordered_json instructions;       // null or the string
  nlohmann::ordered_json tools;              // the request's tools (Responses form), [] if none
  nlohmann::ordered_json tool_choice;        // as given, "auto" by default
  nlohmann::ordered_json text_format;        // {"type": "text"} by default
  nlohmann::ordered_json reasoning;          // {"effort": ..., "summary": ...}
  nlohmann::ordered_json metadata;           // {} by default
  std::optional<int64_t> max_output_tokens;
  double temperature = 1.0, top_p = 1.0;
};

ResponsesRequest parse_responses_request(std::string_view body, const RequestLimits& limits);

}  // namespace strata::server
