// How a started generation job reaches its client, whatever the API: a Writer says what to
// write first, for each batch of streamed text, as a heartbeat during silence, and once the job
// is done; respond() drives it through httplib's chunked provider. A failed write (the client
// has gone) cancels the job. Each API (OpenAI chat and completions, Anthropic Messages, OpenAI
// Responses) builds its own Writers.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/scheduler.h"

namespace strata::server {

using Json = nlohmann::ordered_json;

// How long a response may stay silent. A write is the only way to learn that the client has
// gone, so a quiet stretch (a long prefill, a wait in the queue) still writes something: an SSE
// comment or ping, or a space before a JSON body, which JSON parsers skip.
inline constexpr auto kHeartbeat = std::chrono::seconds(1);

// Not "application/json" exactly: httplib gzips that content type, and a compressor would hold
// the heartbeat bytes back. text/event-stream is never compressed.
inline constexpr const char* kJsonType = "application/json; charset=utf-8";
inline constexpr const char* kSseType = "text/event-stream";

struct Writer {
  const char* content_type;
  std::string opening;    // written at once
  std::string heartbeat;  // written after kHeartbeat without news
  std::function<std::string(const std::string& text)> part;  // a batch of streamed text
  std::function<std::string(const Job& job)> closing;       // once the job is done
};

void respond(httplib::Response& res, std::shared_ptr<Job> job, Writer writer);

// A 500 for a generation that failed after it started (a bug).
ApiError internal_error(const std::string& what);

// What a response needs from a finished job: its result; throws internal_error when it failed.
const decode::GenerateResult& finished(const Job& job);

// Before a non-streaming response: waits up to 10 s for the job, watching the client's
// connection meanwhile, so that a generation that fails early (an expert record that cannot be
// read) answers with a 5xx rather than a 200 whose body is an error. Throws the job's error as a
// 500 if it failed, cancels it if the client hung up; a longer job goes on as json_writer says.
void hold_status(Job& job);

// A non-streaming response: spaces while the job runs, then body(result); a failure becomes
// error(e) (the API's own error shape) in the body.
Writer json_writer(std::function<Json(const decode::GenerateResult&)> body,
                   std::function<Json(const ApiError&)> error);

// JSON text; invalid UTF-8 from the model is replaced (U+FFFD) rather than thrown on.
std::string to_text(const Json& j);
// "data: <json>\n\n"
std::string sse_event(const Json& j);
// "event: <name>\ndata: <json>\n\n" (Anthropic's and the Responses API's streams)
std::string sse_event(const std::string& name, const Json& j);

}  // namespace strata::server
