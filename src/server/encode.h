// OpenAI response objects and Server-Sent Events framing: chat.completion and
// chat.completion.chunk, text_completion (streamed the same way), usage with the prompt cache's
// reused tokens as prompt_tokens_details.cached_tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "decode/generate.h"
#include "server/chat_reply.h"
#include "server/respond.h"

namespace strata::server {

using Json = nlohmann::ordered_json;

struct Usage {
  int64_t prompt_tokens = 0;  // the whole prompt
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the state already held
};

Usage usage_of(const decode::Telemetry& t);
Json usage_json(const Usage& u);

// How the reply was made, as llama-server's `timings` object (prompt_n, prompt_ms,
// prompt_per_second, predicted_n, predicted_ms, predicted_per_second, cache_n, draft_n,
// draft_n_accepted) plus the expert cache's share: expert_hit_rate (0..1), ssd_gb_per_s,
// stall_ms_per_token. Fields without a value (no decode yet, no cache, no speculation) are left
// out. Sent beside usage on the OpenAI routes; the chat page shows it under each reply.
Json timings_json(const decode::Telemetry& t);

// OpenAI's finish_reason: "stop" (end token or stop string), "length" (max_tokens, the context,
// the request's time limit or a shutdown), "tool_calls" when the reply holds tool calls.
std::string finish_reason(decode::FinishReason f, bool tool_calls);

// What every response object carries.
struct ResponseHeader {
  std::string id;  // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// A fresh response header: a random id with `prefix` and the current time.
ResponseHeader new_header(const std::string& prefix, const std::string& model);

// The assistant message of a finished reply: content (null beside tool calls when empty),
// reasoning_content when the model thought, tool_calls.
Json chat_message(const ReplyReader& reader);
// The chat deltas one piece of the reply streams: reasoning_content, content, tool_calls.
std::vector<Json> chat_deltas(const ReplyEvents& events);

Json chat_completion(const ResponseHeader& h, const Json& message, const std::string& finish,
                     const Usage& usage);
// `finish` empty: null (every chunk but the last). The usage chunk is the extra last one of
// stream_options.include_usage (choices empty).
Json chat_chunk(const ResponseHeader& h, const Json& delta, const std::string& finish);
Json chat_usage_chunk(const ResponseHeader& h, const Usage& usage);

Json text_completion(const ResponseHeader& h, const std::string& text, const std::string& finish,
                     const Usage& usage);
Json text_chunk(const ResponseHeader& h, const std::string& text, const std::string& finish);
Json text_usage_chunk(const ResponseHeader& h, const Usage& usage);

inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace strata::server
