#include "server/encode.h"

#include <chrono>
#include <random>

namespace strata::server {

Usage usage_of(const decode::Telemetry& t) {
  return {.prompt_tokens = t.prompt_tokens + t.reused_tokens,
          .completion_tokens = t.generated_tokens,
          .cached_tokens = t.reused_tokens};
}

Json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::string finish_reason(decode::FinishReason f, bool tool_calls) {
  if (tool_calls) return "tool_calls";
  switch (f) {
    case decode::FinishReason::Eos:
    case decode::FinishReason::Stop: return "stop";
    case decode::FinishReason::Length:
    case decode::FinishReason::Cancelled: return "length";
  }
  return "stop";
}

ResponseHeader new_header(const std::string& prefix, const std::string& model) {
  // Ids only need to be unique, not reproducible; they never feed the model.
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {id, std::chrono::duration_cast<std::chrono::seconds>(now).count(), model};
}

namespace {

Json object_head(const ResponseHeader& h, const char* object) {
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model},
          {"system_fingerprint", "strata"}};
}

Json finish_or_null(const std::string& finish) {
  return finish.empty() ? Json() : Json(finish);
}

}  // namespace

Json chat_completion(const ResponseHeader& h, const Json& message, const std::string& finish,
                     const Usage& usage) {
  Json j = object_head(h, "chat.completion");
  j["choices"] = Json::array(
      {{{"index", 0}, {"message", message}, {"logprobs", nullptr}, {"finish_reason", finish}}});
  j["usage"] = usage_json(usage);
  return j;
}

Json chat_chunk(const ResponseHeader& h, const Json& delta, const std::string& finish) {
  Json j = object_head(h, "chat.completion.chunk");
  j["choices"] = Json::array({{{"index", 0},
                               {"delta", delta},
                               {"logprobs", nullptr},
                               {"finish_reason", finish_or_null(finish)}}});
  return j;
}

Json chat_usage_chunk(const ResponseHeader& h, const Usage& usage) {
  Json j = object_head(h, "chat.completion.chunk");
  j["choices"] = Json::array();
  j["usage"] = usage_json(usage);
  return j;
}

Json text_completion(const ResponseHeader& h, const std::string& text, const std::string& finish,
                     const Usage& usage) {
  Json j = object_head(h, "text_completion");
  j["choices"] = Json::array(
      {{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}}});
  j["usage"] = usage_json(usage);
  return j;
}

Json text_chunk(const ResponseHeader& h, const std::string& text, const std::string& finish) {
  Json j = object_head(h, "text_completion");
  j["choices"] = Json::array({{{"index", 0},
                               {"text", text},
                               {"logprobs", nullptr},
                               {"finish_reason", finish_or_null(finish)}}});
  return j;
}

Json text_usage_chunk(const ResponseHeader& h, const Usage& usage) {
  Json j = object_head(h, "text_completion");
  j["choices"] = Json::array();
  j["usage"] = usage_json(usage);
  return j;
}

std::string to_text(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string sse_event(const Json& j) { return "data: " + to_text(j) + "\n\n"; }

}  // namespace strata::server
