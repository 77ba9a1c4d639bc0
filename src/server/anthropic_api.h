// Anthropic's Messages API over the same generation as the OpenAI routes: POST /v1/messages
// (one message object, or its stream of message_start, content_block_start/delta/stop,
// message_delta, message_stop and ping events) and POST /v1/messages/count_tokens. A reply is
// a list of content blocks: thinking (the reasoning), text, tool_use. Errors use Anthropic's
// shape, {"type": "error", "error": {"type": ..., "message": ...}}. docs/SERVER.md has the
// fields and events; anthropic_request.h the request mapping.
#pragma once

#include <httplib.h>

#include "server/api_error.h"
#include "server/generation.h"

namespace strata::server {

// Anthropic's error body and status for an ApiError: 400 invalid_request_error (422s too),
// 401 authentication_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error,
// 500 api_error, 503 overloaded_error.
Json anthropic_error_body(const ApiError& e);
int anthropic_status(const ApiError& e);

class AnthropicApi {
 public:
  // `generation` must outlive this.
  explicit AnthropicApi(Generation& generation) : generation_(generation) {}

  void messages(const httplib::Request& req, httplib::Response& res);
  void count_tokens(const httplib::Request& req, httplib::Response& res);

 private:
  Generation& generation_;
};

}  // namespace strata::server
