// Anthropic Messages request bodies (POST /v1/messages and /v1/messages/count_tokens) -> the
// ChatRequest every chat API generates from. Content blocks become the messages the chat
// template reads: `system` a system message, text blocks the content, tool_use blocks an
// assistant's tool_calls, tool_result blocks tool messages, thinking blocks reasoning_content;
// tools and tool_choice their OpenAI forms; `thinking` sets enable_thinking and the thinking
// budget. Unknown or malformed fields throw ApiError(400) naming the field by its dotted path
// ("messages.1.content.0.type"), as Anthropic's own messages do; `max_tokens` is required.
// docs/SERVER.md lists the fields.
#pragma once

#include <string_view>

#include "server/request.h"

namespace strata::server {

// POST /v1/messages.
ChatRequest parse_anthropic_messages(std::string_view body, const RequestLimits& limits);
// POST /v1/messages/count_tokens: the same messages, system, tools and thinking, without
// max_tokens and the sampling fields.
ChatRequest parse_anthropic_count_tokens(std::string_view body, const RequestLimits& limits);

}  // namespace strata::server
