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
      if (r.tool_choice.mode == ToolChoiceMode::Function)
        return decode::JsonGrammar::tool_calls(plain(r.tools), r.tool_choice.function, false);
      return decode::JsonGrammar::tool_calls(plain(r.tools), std::nullopt, r.parallel_tool_calls);
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
                   "chat_template_kwargs.enable_thinking cannot be true with a JSON "
                   "response_format or a forced tool call: the reasoning block is not JSON.",
                   "chat_template_kwargs.enable_thinking", "invalid_value");
  plan.template_kwargs["enable_thinking"] = false;
  plan.constraint = std::make_shared<decode::JsonConstraint>(vocab, grammar_for(r));
  return plan;
}

ReplyReader::ReplyReader(bool read_tool_calls, uint64_t id_salt)
    : parser_(read_tool_calls ? std::make_unique<decode::ToolCallParser>(id_salt) : nullptr) {}

std::vector<Json> ReplyReader::deltas(const decode::ToolCallEvents& events) {
  std::vector<Json> out;
  if (!events.content.empty()) out.push_back({{"content", events.content}});
  for (const auto& d : events.deltas) {
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

std::vector<Json> ReplyReader::feed(const std::string& text) {
  if (!parser_) {
    text_ += text;
    return {Json{{"content", text}}};
  }
  return deltas(parser_->feed(text));
}

std::vector<Json> ReplyReader::finish() {
  if (!parser_) return {};
  return deltas(parser_->finish());
}

bool ReplyReader::has_tool_calls() const { return parser_ && !parser_->tool_calls().empty(); }

Json ReplyReader::message() const {
  Json m = {{"role", "assistant"}};
  const std::string& content = parser_ ? parser_->content() : text_;
  // OpenAI sends null content beside tool calls when the model said nothing else.
  m["content"] = content.empty() && has_tool_calls() ? Json() : Json(content);
  if (has_tool_calls()) {
    Json calls = Json::array();
    for (const auto& c : parser_->tool_calls())
      calls.push_back({{"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

}  // namespace strata::server
