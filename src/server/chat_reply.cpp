#include "server/chat_reply.h"

#include "server/api_error.h"
#include "util/error.h"

namespace strata::server {

namespace {

// The constraint library reads plain nlohmann::json; the request keeps key order.
nlohmann::json plain(const Json& j) { return nlohmann::json::parse(j.dump()); }

decode::JsonGrammar grammar_for(const ChatRequest& r) {
  const bool forced_tool = r.tool_choice.mode == ToolChoiceMode::Required ||
                           r.tool_choice.mode == ToolChoiceMode::Function;
  if (forced_tool && r.response_format.type != ResponseFormatType::Text)
    throw ApiError(400,
                   "A response_format and a forced tool_choice cannot both shape the reply; "
                   "drop one of them.",
                   "response_format", "invalid_value");
  try {
    if (forced_tool) {
      // Qwen writes a call on one line: {"name": ..., "arguments": {...}}.
      const decode::GrammarLimits one_line{.compact = true};
      if (r.tool_choice.mode == ToolChoiceMode::Function)
        return decode::JsonGrammar::tool_calls(plain(r.tools), r.tool_choice.function, false, one_line);
      return decode::JsonGrammar::tool_calls(plain(r.tools), std::nullopt, r.parallel_tool_calls, one_line);
    }
    if (r.response_format.type == ResponseFormatType::JsonObject)
      return decode::JsonGrammar::any_object();
    return decode::JsonGrammar::from_schema(plain(r.response_format.schema));
  } catch (const Error& e) {
    throw ApiError(400, e.what(), forced_tool ? "tools" : "response_format.json_schema.schema",
                   "invalid_value");
  }
}

}  // namespace

ChatPlan plan_chat(const ChatRequest& r, const decode::JsonVocab& vocab) {
  ChatPlan plan;
  plan.template_kwargs = r.template_kwargs;
  const bool use_tools = !r.tools.is_null() && r.tool_choice.mode != ToolChoiceMode::None;
  plan.tools = use_tools ? r.tools : Json();
  plan.read_tool_calls = use_tools;
  const bool constrained = r.response_format.type != ResponseFormatType::Text ||
                           r.tool_choice.mode == ToolChoiceMode::Required ||
                           r.tool_choice.mode == ToolChoiceMode::Function;
  if (!constrained) return plan;
  // The constraint holds from the first token; a thinking model would open with <think>.
  const auto thinking = plan.template_kwargs.find("enable_thinking");
  if (thinking != plan.template_kwargs.end() && *thinking == true)
    throw ApiError(400,
                   "Thinking cannot be enabled with a JSON response format or a forced tool call: "
                   "the reasoning block is not JSON.",
                   "chat_template_kwargs.enable_thinking", "invalid_value");
  plan.template_kwargs["enable_thinking"] = false;
  plan.constraint = std::make_shared<decode::JsonConstraint>(vocab, grammar_for(r));
  return plan;
}

ReplyReader::ReplyReader(decode::ThinkingStart thinking, bool read_tool_calls, uint64_t id_salt)
    : splitter_(thinking),
      parser_(read_tool_calls ? std::make_unique<decode::ToolCallParser>(id_salt) : nullptr) {}

ReplyEvents ReplyReader::answer(decode::ReasoningEvents split, bool last) {
  ReplyEvents out;
  out.reasoning = std::move(split.reasoning);
  if (!parser_) {
    out.content = std::move(split.content);
    return out;
  }
  decode::ToolCallEvents calls = parser_->feed(split.content);
  if (last) {
    decode::ToolCallEvents rest = parser_->finish();
    calls.content += rest.content;
    calls.deltas.insert(calls.deltas.end(), rest.deltas.begin(), rest.deltas.end());
  }
  out.content = std::move(calls.content);
  out.calls = std::move(calls.deltas);
  return out;
}

ReplyEvents ReplyReader::feed(const std::string& text) { return answer(splitter_.feed(text), false); }

ReplyEvents ReplyReader::finish() { return answer(splitter_.finish(), true); }

const std::string& ReplyReader::content() const {
  return parser_ ? parser_->content() : splitter_.content();
}

const std::vector<decode::ToolCall>& ReplyReader::tool_calls() const {
  static const std::vector<decode::ToolCall> none;
  return parser_ ? parser_->tool_calls() : none;
}

}  // namespace strata::server
