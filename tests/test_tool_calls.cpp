// Tool calls: the streaming parser of Qwen's <tool_call> blocks (content vs calls, deltas,
// malformed blocks, any split of the text giving the same result, the chat template's own
// rendering parsing back), and the forced-call grammar generating calls the parser accepts.
#include <gtest/gtest.h>

#include <map>

#include "chat/chat.h"
#include "decode/tool_calls.h"
#include "test_json_constraint_util.h"
#include "tokenizer/qwen3_data.h"
#include "util/error.h"

namespace strata::decode {
namespace {

using nlohmann::json;

// What a client sees of one reply: the streamed content and, per call index, its id, name and
// concatenated argument pieces; plus the parser's final view.
struct Reply {
  std::string streamed_content;
  std::map<size_t, ToolCall> streamed;
  std::string content;
  std::vector<ToolCall> calls;
  bool malformed = false;

  void take(const ToolCallEvents& e) {
    streamed_content += e.content;
    for (const auto& d : e.deltas) {
      ToolCall& c = streamed[d.index];
      if (!d.id.empty()) {
        EXPECT_TRUE(c.id.empty()) << "second first-delta for index " << d.index;
        c.id = d.id;
        c.name = d.name;
      } else {
        EXPECT_FALSE(c.id.empty()) << "arguments before the id for index " << d.index;
      }
      c.arguments += d.arguments;
    }
  }
};

Reply parse(const std::vector<std::string>& pieces, uint64_t salt = 0) {
  ToolCallParser parser(salt);
  Reply r;
  for (const auto& p : pieces) r.take(parser.feed(p));
  r.take(parser.finish());
  r.content = parser.content();
  r.calls = parser.tool_calls();
  r.malformed = parser.malformed();
  return r;
}

Reply parse(const std::string& text) { return parse(std::vector<std::string>{text}); }

TEST(ToolCallParser, SplitsContentAndCalls) {
  const Reply r = parse(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"c\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(r.content, "Let me check.");
  EXPECT_EQ(r.streamed_content, r.content);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris", "unit": "c"})");
  EXPECT_EQ(r.calls[1].name, "time");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.calls[0].index, 0u);
  EXPECT_EQ(r.calls[1].index, 1u);
  EXPECT_TRUE(r.calls[0].id.starts_with("call_"));
  EXPECT_EQ(r.calls[0].id.size(), 21u);
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  EXPECT_FALSE(r.malformed);
  for (const auto& c : r.calls) {
    EXPECT_EQ(r.streamed.at(c.index).id, c.id);
    EXPECT_EQ(r.streamed.at(c.index).name, c.name);
    EXPECT_EQ(r.streamed.at(c.index).arguments, c.arguments);
  }
}

TEST(ToolCallParser, PlainTextIsContent) {
  for (const char* text : {"Hello <b>world</b>, 3 < 4 and <tool_cal> is not a tag.\n", "  trailing ",
                           "<tool_", "a </tool_call> b", ""}) {
    const Reply r = parse(text);
    EXPECT_EQ(r.content, text);
    EXPECT_EQ(r.streamed_content, text);
    EXPECT_TRUE(r.calls.empty());
    EXPECT_FALSE(r.malformed);
  }
}

TEST(ToolCallParser, MalformedBlocksBecomeContent) {
  const std::string bad_json = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>";
  for (const std::string& text :
       {bad_json, std::string("<tool_call>\n{\"arguments\": {}}\n</tool_call>"),
        std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": 3}\n</tool_call>"),
        std::string("<tool_call>\n{\"name\": \"f\", \"name\": \"g\", \"arguments\": {}}\n</tool_call>"),
        std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2")}) {
    const Reply r = parse(text);
    EXPECT_TRUE(r.malformed) << text;
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
    EXPECT_EQ(r.streamed_content, text);
  }
  // A good call after a bad one still parses, and keeps its own index.
  const Reply r =
      parse(bad_json + "\n<tool_call>\n{\"name\": \"g\", \"arguments\": {\"x\": 1}}\n</tool_call>");
  EXPECT_TRUE(r.malformed);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "g");
  EXPECT_EQ(r.content, bad_json);
}

TEST(ToolCallParser, LenientForms) {
  // Cut off after complete JSON (generation stopped at the close tag).
  Reply r = parse("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"a": 1})");
  EXPECT_FALSE(r.malformed);
  // Arguments given as a JSON string, or left out.
  r = parse("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"a": 1})");
  EXPECT_EQ(r.streamed.at(0).arguments, R"({"a": 1})");
  r = parse("<tool_call>{\"arguments\": {\"b\": [1]}, \"name\": \"f\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"b": [1]})");
  EXPECT_EQ(r.streamed.at(0).arguments, R"({"b": [1]})");
  r = parse("<tool_call>{\"name\": \"f\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
}

TEST(ToolCallParser, StreamsArgumentsAsTheyArrive) {
  ToolCallParser parser;
  auto e = parser.feed("Sure.\n<tool_call>\n{\"name\": \"search\", ");
  EXPECT_EQ(e.content, "Sure.");
  ASSERT_EQ(e.deltas.size(), 1u);
  EXPECT_EQ(e.deltas[0].name, "search");
  EXPECT_EQ(e.deltas[0].arguments, "");
  e = parser.feed("\"arguments\": {\"q\": \"caf");
  ASSERT_EQ(e.deltas.size(), 1u);
  EXPECT_EQ(e.deltas[0].arguments, "{\"q\": \"caf");
  e = parser.feed("\xC3\xA9\"}}\n</tool");
  ASSERT_EQ(e.deltas.size(), 1u);
  EXPECT_EQ(e.deltas[0].arguments, "\xC3\xA9\"}");
  EXPECT_TRUE(e.deltas[0].id.empty());
  e = parser.feed("_call>");
  EXPECT_TRUE(e.deltas.empty());
  EXPECT_EQ(parser.tool_calls().size(), 1u);
  EXPECT_TRUE(parser.finish().content.empty());
}

TEST(ToolCallParser, IdsAreDeterministicAndSalted) {
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  EXPECT_EQ(parse({text}, 1).calls.at(0).id, parse({text}, 1).calls.at(0).id);
  EXPECT_NE(parse({text}, 1).calls.at(0).id, parse({text}, 2).calls.at(0).id);
}

// Any cut of the text into pieces gives the same content, calls and streamed view.
TEST(ToolCallParser, RandomSplitsGiveTheSameResult) {
  const std::vector<std::string> texts = {
      "Let me look.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"s\": \"x}\\\"{\", \"n\": [1, {\"k\": "
      "null}]}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>",
      "x <tool_ y </tool_call> <tool_call>{\"name\": \"c\", \"arguments\": {\"e\": "
      "\"\xE2\x82\xAC\"}}</tool_call>  tail",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>\n<tool_call>{\"name\": \"g\", "
      "\"arguments\": 7}</tool_call> ok",
      "<tool_call>{\"arguments\": {\"z\": true}, \"name\": \"late\"}</tool_call>\n\nafter "
      "<tool_call>{\"name\": \"u\", \"arguments\": {\"q\": 1",
      "text only, with <tags> and </tool_call> and <tool_call",
  };
  Rng rng(5);
  for (const auto& text : texts) {
    const Reply whole = parse(text);
    EXPECT_EQ(whole.streamed_content, whole.content) << text;
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::string> pieces;
      for (size_t at = 0; at < text.size();) {
        const size_t n = std::min(text.size() - at, size_t(rng.below(trial % 2 ? 4 : 16)));
        pieces.push_back(text.substr(at, n));
        at += n;
      }
      const Reply r = parse(pieces);
      ASSERT_EQ(r.content, whole.content) << text;
      ASSERT_EQ(r.streamed_content, whole.streamed_content) << text;
      ASSERT_EQ(r.malformed, whole.malformed) << text;
      ASSERT_EQ(r.calls.size(), whole.calls.size()) << text;
      for (size_t i = 0; i < r.calls.size(); ++i) {
        EXPECT_EQ(r.calls[i].id, whole.calls[i].id);
        EXPECT_EQ(r.calls[i].name, whole.calls[i].name);
        EXPECT_EQ(r.calls[i].arguments, whole.calls[i].arguments);
        EXPECT_EQ(r.streamed.at(r.calls[i].index).arguments, r.calls[i].arguments);
      }
      ASSERT_EQ(r.streamed.size(), whole.streamed.size()) << text;
    }
  }
}

// A block with a repeated "name" or "arguments" key is malformed. Cut after the key's first
// value, the call's name has streamed (and taken an index) before the repeat arrives; fed whole,
// the same must happen, or the calls after it get other indices and ids (fuzz_constrained found
// this; fuzz/corpus/constrained/regression-tool-call-duplicate-name-index.txt).
TEST(ToolCallParser, ARepeatedKeyGivesTheSameIdsHoweverTheTextIsCut) {
  const std::string good = "\n<tool_call>\n{\"name\": \"h\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  for (const std::string& bad :
       {std::string("<tool_call>\n{\"name\": \"f\", \"name\": \"g\", \"arguments\": {}}\n</tool_call>"),
        std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"arguments\": {\"b\": 2}}\n"
                    "</tool_call>")}) {
    const size_t cut = bad.find(", \"");  // right after the first "name" value
    const Reply whole = parse(bad + good), pieces = parse({bad.substr(0, cut), bad.substr(cut) + good});
    EXPECT_TRUE(whole.malformed) << bad;
    EXPECT_EQ(whole.content, bad);
    EXPECT_EQ(pieces.content, bad);
    ASSERT_EQ(whole.calls.size(), 1u) << bad;
    ASSERT_EQ(pieces.calls.size(), 1u) << bad;
    EXPECT_EQ(whole.calls[0].index, pieces.calls[0].index) << bad;
    EXPECT_EQ(whole.calls[0].id, pieces.calls[0].id) << bad;
    ASSERT_EQ(whole.streamed.size(), pieces.streamed.size()) << bad;
    for (const auto& [index, call] : whole.streamed) {
      EXPECT_EQ(call.id, pieces.streamed.at(index).id) << bad;
      EXPECT_EQ(call.arguments, pieces.streamed.at(index).arguments) << bad;
    }
  }
}

// What Qwen's template renders for an assistant turn with tool calls parses back to those calls.
TEST(ToolCallParser, ParsesTheChatTemplatesOwnRendering) {
  const auto messages = nlohmann::ordered_json::parse(R"([
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "Checking.", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}},
      {"type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}}]}])");
  const std::string rendered = chat::render_chat(tokenizer::qwen3::chat_template(), messages, nullptr, false,
                                                 nullptr, "", "<|im_end|>");
  const size_t start = rendered.rfind("<|im_start|>assistant\n") + 22;
  std::string reply = rendered.substr(start, rendered.rfind("<|im_end|>") - start);
  // The last assistant turn carries an (empty) thinking block, which the server strips first.
  ASSERT_TRUE(reply.starts_with("<think>\n\n</think>\n\n")) << reply;
  reply = reply.substr(19);
  const Reply r = parse(reply);
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.calls[0].arguments), json::parse(R"({"city": "Paris", "days": [1, 2]})"));
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, R"({"tz": "CET"})");
}

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": "integer", "maximum": 9}},
    "required": ["a", "b"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping"}}])";

TEST(ToolCallGrammar, ForcedCallsParseAndMatchTheirParameters) {
  const json tools = json::parse(kTools);
  std::map<std::string, json> params;
  for (const auto& t : tools)
    params[t["function"]["name"]] = t["function"].value("parameters", json{{"type", "object"}});
  size_t completed = 0, runs = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const bool parallel = seed % 3 == 0;
    const std::optional<std::string_view> only =
        seed % 4 == 1 ? std::optional<std::string_view>("add") : std::nullopt;
    const auto out = testing::generate_constrained(
        testing::toy_vocab(), JsonGrammar::tool_calls(tools, only, parallel), seed, 400, seed % 2 == 0);
    ++runs;
    if (!out.completed) continue;
    ++completed;
    const Reply r = parse(out.text);
    EXPECT_FALSE(r.malformed) << out.text;
    EXPECT_EQ(r.content, "") << out.text;
    ASSERT_FALSE(r.calls.empty()) << out.text;
    if (!parallel) {
      EXPECT_EQ(r.calls.size(), 1u) << out.text;
    }
    for (const auto& call : r.calls) {
      ASSERT_TRUE(params.contains(call.name)) << out.text;
      if (only) {
        EXPECT_EQ(call.name, "add");
      }
      const auto problem = validate_json_schema(params[call.name], json::parse(call.arguments));
      EXPECT_FALSE(problem) << out.text << "\n" << problem.value_or("");
    }
  }
  EXPECT_GT(completed, runs * 3 / 4) << completed << " of " << runs;
}

TEST(ToolCallGrammar, AcceptsQwensAddedTokensForTheTags) {
  const tokenizer::Tokenizer& tok = testing::toy_tokenizer();
  JsonConstraint c(testing::toy_vocab(), JsonGrammar::tool_calls(json::parse(kTools), "ping", false));
  const auto ids = tok.encode("<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(tok.piece(ids.front()), "<tool_call>");
  for (uint32_t id : ids) {
    EXPECT_TRUE(c.allows(int32_t(id))) << tok.piece(id);
    c.accept(int32_t(id));
  }
  EXPECT_TRUE(c.complete());
  EXPECT_FALSE(c.allows(int32_t(ids.front())));
}

TEST(ToolCallGrammar, ErrorsNameTheTool) {
  const auto error = [](const char* tools,
                        std::optional<std::string_view> only = std::nullopt) -> std::string {
    try {
      JsonGrammar::tool_calls(json::parse(tools), only, false);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(
      error(
          R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}}}}])"),
      "tools[0].function.parameters: json_schema /properties/x: unsupported keyword \"pattern\"");
  EXPECT_EQ(error(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])"),
            "tools[0].function.parameters: must describe an object");
  EXPECT_EQ(error(R"([{"type": "function", "function": {"name": "f"}}])", "g"),
            "tool_choice: no tool named \"g\" in tools");
  EXPECT_EQ(error(R"([{"type": "retrieval"}])"),
            "tools[0]: expected {\"type\": \"function\", \"function\": {...}}");
}

}  // namespace
}  // namespace strata::decode
