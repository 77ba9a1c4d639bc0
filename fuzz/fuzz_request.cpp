// libFuzzer target for the server's request parsing and validation: any bytes as the body of a
// chat completions, completions, Anthropic Messages (and count_tokens) or Responses request. The only accepted failure is ApiError with a 4xx status and a
// message; anything else (another exception, a crash, a sanitizer report, a 5xx) is a bug. An
// accepted request must hold what the generation loop relies on.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/anthropic_request.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server/responses_request.h"

namespace {

using namespace strata::server;

const RequestLimits kLimits{"tiny", 512};

void check_error(const ApiError& e) {
  if (e.status < 400 || e.status >= 500 || e.message.empty()) __builtin_trap();
  volatile size_t sink = error_body(e).dump().size();
  (void)sink;
}

void check_generation(const GenerationRequest& r) {
  // What GenerateParams::validate would refuse must never get past parsing; a strata::Error
  // escaping here is reported as a crash.
  r.gen.sampling.validate();
  if (r.gen.max_tokens < 1) __builtin_trap();
  for (const auto& s : r.gen.stop)
    if (s.empty()) __builtin_trap();
  if (r.include_usage && !r.stream) __builtin_trap();
  for (const auto& [id, bias] : r.logit_bias)
    if (id < 0 || id >= kLimits.n_vocab || bias < -100 || bias > 100) __builtin_trap();
}

// What every chat API hands the generation: template messages with string content (or null
// beside tool calls), roles the template knows, a thinking budget only when positive.
void check_chat(const ChatRequest& r) {
  check_generation(r);
  if (r.messages.empty()) __builtin_trap();
  for (const auto& m : r.messages) {
    const auto& role = m["role"];
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") __builtin_trap();
    if (!m["content"].is_string()) __builtin_trap();
  }
  if (r.thinking_budget && *r.thinking_budget < 0) __builtin_trap();
  if (!r.tools.is_null() && (!r.tools.is_array() || r.tools.empty())) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    check_chat(parse_chat_request(body, kLimits));
  } catch (const ApiError& e) {
    check_error(e);
  }
  try {
    const auto r = parse_anthropic_messages(body, kLimits);
    check_chat(r);
    if (!r.max_tokens_given) __builtin_trap();
  } catch (const ApiError& e) {
    check_error(e);
  }
  try {
    check_chat(parse_anthropic_count_tokens(body, kLimits));
  } catch (const ApiError& e) {
    check_error(e);
  }
  try {
    check_chat(parse_responses_request(body, kLimits).chat);
  } catch (const ApiError& e) {
    check_error(e);
  }
  try {
    const auto r = parse_completion_request(body, kLimits);
    check_generation(r);
    if (r.prompt_tokens)
      for (const int32_t id : *r.prompt_tokens)
        if (id < 0 || id >= kLimits.n_vocab) __builtin_trap();
  } catch (const ApiError& e) {
    check_error(e);
  }
  return 0;
}
