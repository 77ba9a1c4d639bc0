// OpenAI request bodies -> validated requests. Pure functions of the body and the served model's
// limits (no server, no model), so a fuzzer can drive them. Every problem throws ApiError with
// OpenAI's status, message shape, `param` and `code`: 400 for malformed JSON, wrong types,
// missing, unknown or out-of-range fields; 404 for a model other than the one served; 422 for a
// well-formed request asking for something this server does not do (n > 1, logprobs, images).
// Unknown top-level fields are refused (400), as OpenAI does, so a misspelt option never passes
// silently; the llama.cpp/vLLM extensions top_k, min_p, repetition_penalty and
// chat_template_kwargs are accepted.
// docs/SERVER.md lists the fields.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "decode/generate.h"

namespace strata::server {

struct RequestLimits {
  std::string model_id;  // the name /v1/models lists; requests must name it
  int64_t n_vocab = 0;   // token ids in a completion prompt must be below it
};

enum class ResponseFormatType { Text, JsonObject, JsonSchema };

struct ResponseFormat {
  ResponseFormatType type = ResponseFormatType::Text;
  std::string name;           // json_schema.name
  nlohmann::ordered_json schema;  // json_schema.schema; null: any JSON value
  bool strict = false;
};

enum class ToolChoiceMode { None, Auto, Required, Function };

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::Auto;
  std::string function;  // for Function
};

// What both endpoints share.
struct GenerationRequest {
  decode::GenerateParams gen;     // sampling, max_tokens, stop; hooks left empty
  std::optional<uint64_t> seed;   // absent: the server picks one
  // Set when the client gave max_tokens: then the prompt plus it must fit the context. Without
  // it a chat reply runs to the end of the context, a completion 16 tokens (OpenAI's defaults).
  bool max_tokens_given = false;
  // logit_bias: added to the token's logit before sampling (-100 bans it, 100 forces it).
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

struct ChatRequest : GenerationRequest {
  // OpenAI messages normalised for the chat template: "developer" is "system", content parts
  // are joined into one string, only the fields a template reads are kept.
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // null or a non-empty array of function tools, as given
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;  // a forced tool call may be several blocks
  ResponseFormat response_format;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  // Tokens the reasoning may take before </think> is forced (vLLM's thinking_token_budget).
  std::optional<int64_t> thinking_budget;
};

struct CompletionRequest : GenerationRequest {
  std::string prompt;                          // text, when the prompt was text
  std::optional<std::vector<int32_t>> prompt_tokens;  // when it was token ids
  bool echo = false;                           // the prompt text precedes the completion
};

// Nesting deeper than this is refused before anything walks the document recursively.
inline constexpr int kMaxJsonDepth = 64;

ChatRequest parse_chat_request(std::string_view body, const RequestLimits& limits);
CompletionRequest parse_completion_request(std::string_view body, const RequestLimits& limits);

}  // namespace strata::server
