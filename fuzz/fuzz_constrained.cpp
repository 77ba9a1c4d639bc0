// libFuzzer target for constrained decoding and tool-call parsing. The first byte picks the
// part:
//  - even: the rest is "SCHEMA\0DOCUMENT". The schema compiles or throws strata::Error; the
//    document's bytes run through the automaton, and a document it accepts must parse with
//    nlohmann::json and validate against the schema (oneOf, enforced as anyOf, is only parsed).
//  - odd: the rest is model output for the tool-call parser, fed whole and in pieces whose sizes
//    come from the input; both must give the same content and calls, each call's arguments a
//    JSON object.
// Any other exception, crash, sanitizer report or broken property is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "decode/json_automaton.h"
#include "decode/json_schema.h"
#include "decode/tool_calls.h"
#include "util/error.h"

namespace {

using namespace strata::decode;

void check_schema(std::string_view input) {
  const size_t split = input.find('\0');
  const std::string_view schema_text = input.substr(0, split);
  const std::string_view document = split == std::string_view::npos ? "" : input.substr(split + 1);
  const auto schema = nlohmann::json::parse(schema_text, nullptr, false);
  if (schema.is_discarded()) return;
  std::optional<JsonGrammar> grammar;
  try {
    grammar = JsonGrammar::from_schema(schema);
  } catch (const strata::Error&) {
    return;
  }
  const JsonAutomaton automaton(*grammar);
  std::vector<Stack> stacks = {automaton.start()}, next, forks;
  for (char c : document.substr(0, 4096)) {
    next.clear();
    for (Stack& s : stacks) {
      forks.clear();
      if (automaton.step(s, uint8_t(c), forks)) next.push_back(s);
      for (Stack& f : forks)
        if (next.size() < 64) next.push_back(f);
    }
    std::swap(stacks, next);
    if (stacks.empty()) return;
  }
  bool accepted = false;
  for (const Stack& s : stacks) accepted = accepted || automaton.can_end(s);
  if (!accepted || document.size() > 4096) return;
  const auto value = nlohmann::json::parse(document, nullptr, false);
  if (value.is_discarded()) __builtin_trap();
  if (schema_text.find("oneOf") == std::string_view::npos && validate_json_schema(schema, value)) __builtin_trap();
}

struct Parsed {
  std::string streamed, content;
  std::vector<ToolCall> calls;
};

Parsed parse_pieces(std::string_view text, std::string_view sizes) {
  ToolCallParser parser(7);
  Parsed p;
  size_t at = 0, k = 0;
  while (at < text.size()) {
    const size_t n = sizes.empty() ? text.size() : 1 + size_t(uint8_t(sizes[k++ % sizes.size()]) % 16);
    p.streamed += parser.feed(text.substr(at, n)).content;
    at += std::min(n, text.size() - at);
  }
  p.streamed += parser.finish().content;
  p.content = parser.content();
  p.calls = parser.tool_calls();
  return p;
}

void check_tool_calls(std::string_view input) {
  const std::string_view sizes = input.substr(0, std::min<size_t>(8, input.size()));
  const std::string_view text = input.substr(sizes.size());
  const Parsed whole = parse_pieces(text, ""), cut = parse_pieces(text, sizes);
  if (whole.streamed != whole.content || cut.content != whole.content || cut.streamed != cut.content)
    __builtin_trap();
  if (cut.calls.size() != whole.calls.size()) __builtin_trap();
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    const ToolCall &a = whole.calls[i], &b = cut.calls[i];
    if (a.id != b.id || a.name != b.name || a.arguments != b.arguments) __builtin_trap();
    if (!nlohmann::json::parse(a.arguments, nullptr, false).is_object()) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0)
    check_schema(input);
  else
    check_tool_calls(input);
  return 0;
}
