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

Json timings_json(const decode::Telemetry& t) {
  Json j = {{"cache_n", t.reused_tokens},
            {"prompt_n", t.prompt_tokens},
            {"prompt_ms", t.prefill_seconds * 1e3},
            {"predicted_n", t.generated_tokens},
            {"predicted_ms", t.decode_seconds * 1e3}};
  if (auto v = t.prefill_tok_per_s()) j["prompt_per_second"] = *v;
  if (auto v = t.decode_tok_per_s()) j["predicted_per_second"] = *v;
  if (t.cache_hit_rate) j["expert_hit_rate"] = *t.cache_hit_rate;
  if (t.ssd_gb_per_s) j["ssd_gb_per_s"] = *t.ssd_gb_per_s;
  if (t.stall_ms_per_token) j["stall_ms_per_token"] = *t.stall_ms_per_token;
  if (t.spec) {
    j["draft_n"] = t.spec->drafted;
    j["draft_n_accepted"] = t.spec->accepted;
  }
  return j;
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

// A response object with one choice: `key` ("message", "delta" or "text") holds `value`; an empty
// `finish` is null (a chunk before the last). `usage` null: none.
Json with_choice(const ResponseHeader& h, const char* object, const char* key, const Json& value,
                 const std::string& finish, const Json& usage) {
  Json j = {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model},
            {"system_fingerprint", "strata"}};
  j["choices"] = Json::array({{{"index", 0},
                               {key, value},
                               {"logprobs", nullptr},
                               {"finish_reason", finish.empty() ? Json() : Json(finish)}}});
  if (!usage.is_null()) j["usage"] = usage;
  return j;
}

// The usage-only chunk of stream_options.include_usage: no choices.
Json usage_only(const ResponseHeader& h, const char* object, const Usage& usage) {
  Json j = with_choice(h, object, "text", "", "", usage_json(usage));
  j["choices"] = Json::array();
  return j;
}

}  // namespace

Json chat_message(const ReplyReader& reader) {
  Json m = {{"role", "assistant"}};
  // OpenAI sends null content beside tool calls when the model said nothing else.
  m["content"] = reader.content().empty() && reader.has_tool_calls() ? Json() : Json(reader.content());
  // llama-server's and vLLM's field for the thinking text.
  if (!reader.reasoning().empty()) m["reasoning_content"] = reader.reasoning();
  if (reader.has_tool_calls()) {
    Json calls = Json::array();
    for (const auto& c : reader.tool_calls())
      calls.push_back({{"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

std::vector<Json> chat_deltas(const ReplyEvents& events) {
  std::vector<Json> out;
  if (!events.reasoning.empty()) out.push_back({{"reasoning_content", events.reasoning}});
  if (!events.content.empty()) out.push_back({{"content", events.content}});
  for (const auto& d : events.calls) {
    Json call = {{"index", d.index}};
    if (!d.id.empty()) {
      call["id"] = d.id;
      call["type"] = "function";
      call["function"] = {{"name", d.name}, {"arguments", d.arguments}};
    } else {
      call["function"] = {{"arguments", d.arguments}};
    }
    out.push_back({{"tool_calls", Json::array({call})}});
  }
  return out;
}

Json chat_completion(const ResponseHeader& h, const Json& message, const std::string& finish,
                     const Usage& usage) {
  return with_choice(h, "chat.completion", "message", message, finish, usage_json(usage));
}

Json chat_chunk(const ResponseHeader& h, const Json& delta, const std::string& finish) {
  return with_choice(h, "chat.completion.chunk", "delta", delta, finish, nullptr);
}

Json chat_usage_chunk(const ResponseHeader& h, const Usage& usage) {
  return usage_only(h, "chat.completion.chunk", usage);
}

Json text_completion(const ResponseHeader& h, const std::string& text, const std::string& finish,
                     const Usage& usage) {
  return with_choice(h, "text_completion", "text", text, finish, usage_json(usage));
}

Json text_chunk(const ResponseHeader& h, const std::string& text, const std::string& finish) {
  return with_choice(h, "text_completion", "text", text, finish, nullptr);
}

Json text_usage_chunk(const ResponseHeader& h, const Usage& usage) {
  return usage_only(h, "text_completion", usage);
}

}  // namespace strata::server
