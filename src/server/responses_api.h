// OpenAI's Responses API over the same generation as the other routes: POST /v1/responses, one
// response object or its stream of events (response.created, response.in_progress,
// response.output_item.added/done, response.content_part.added/done, response.output_text.delta/
// done, response.reasoning_text.delta/done, response.function_call_arguments.delta/done,
// response.completed or response.incomplete; each with a sequence_number). The output is a list
// of items: reasoning, message (output_text), function_call. Errors use OpenAI's shape.
// docs/SERVER.md has the fields; responses_request.h the request mapping.
#pragma once

#include <httplib.h>

#include "server/generation.h"

namespace strata::server {

class ResponsesApi {
 public:
  // `generation` must outlive this.
  explicit ResponsesApi(Generation& generation) : generation_(generation) {}

  void create(const httplib::Request& req, httplib::Response& res);

 private:
  Generation& generation_;
};

}  // namespace strata::server
