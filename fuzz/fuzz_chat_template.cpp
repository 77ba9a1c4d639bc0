// libFuzzer target for the chat-template engine with a hostile template, as a GGUF's
// tokenizer.chat_template could carry: the input is "TEMPLATE\0MESSAGES", MESSAGES an optional
// JSON array of messages (a fixed conversation with a tool call otherwise). Parsing and rendering
// either succeed or throw strata::Error; the engine's step, recursion and output budgets must stop
// every loop, recursion and blow-up, so a crash, a sanitizer report, a hang or an out-of-memory
// is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "chat/template.h"
#include "util/error.h"

namespace {

const nlohmann::ordered_json& default_messages() {
  static const auto messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris? \u00e9\u4e2d"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
      {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
    {"role": "tool", "content": "sunny", "tool_call_id": "c1"}])");
  return messages;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string source(input.substr(0, split));
  nlohmann::ordered_json variables = {
      {"messages", default_messages()},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"},
      {"tools", nlohmann::ordered_json::parse(
                    R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])")}};
  if (split != std::string_view::npos) {
    auto messages = nlohmann::ordered_json::parse(input.substr(split + 1), nullptr, false);
    if (!messages.is_discarded()) variables["messages"] = std::move(messages);
  }
  try {
    const strata::chat::Template tmpl(source);
    volatile size_t sink = tmpl.render(variables).size();
    (void)sink;
  } catch (const strata::Error&) {
  }
  return 0;
}
