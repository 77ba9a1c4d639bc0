#include "server/anthropic_request.h"

#include <cctype>

#include "server/json_fields.h"
#include "util/error.h"

namespace strata::server {

namespace {

constexpr size_t kMaxStops = 16;

[[noreturn]] void invalid(const std::string& path, const std::string& what) {
  throw ApiError(400, cat(path, ": ", what), path, "invalid_value");
}

[[noreturn]] void unsupported(const std::string& path, const std::string& what) {
  throw ApiError(400, cat(path, ": ", what, " is not supported by this server."), path, "unsupported_value");
}

void parse_model(const Fields& f, const RequestLimits& limits) {
  const Json& model = f.require("model");
  if (!model.is_string()) throw_invalid_type("model", model, "a string");
  if (model.get<std::string>() != limits.model_id)
    throw ApiError(404,
                   cat("model: '", model.get<std::string>(), "' does not exist; this server serves '",
                       limits.model_id, "'."),
                   "model", "model_not_found");
}

// A text block's text (the caller has read its type).
std::string block_text(const Fields& bf) {
  bf.reject_unknown({"type", "text", "cache_control", "citations"});
  const Json& t = bf.require("text");
  if (!t.is_string()) throw_invalid_type(bf.path("text"), t, "a string");
  return t.get<std::string>();
}

// The text of a string, or of an array of text blocks (system, tool_result content), joined by
// newlines.
std::string text_of(const Json& value, const std::string& path) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) throw_invalid_type(path, value, "a string or an array of text blocks");
  std::string text;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string at = cat(path, ".", i);
    const Json& block = value[i];
    if (!block.is_object()) throw_invalid_type(at, block, "an object");
    const Fields bf(block, at + ".");
    const auto type = bf.string("type");
    if (type == "image" || type == "document" || type == "search_result")
      unsupported(at + ".type", cat("A content block of type '", *type, "'"));
    if (type != "text") invalid(at + ".type", "expected 'text'");
    if (!text.empty()) text += "\n";
    text += block_text(bf);
  }
  return text;
}

Json tool_call(const Fields& bf) {
  bf.reject_unknown({"type", "id", "name", "input", "cache_control"});
  const Json& id = bf.require("id");
  if (!id.is_string()) throw_invalid_type(bf.path("id"), id, "a string");
  const Json& name = bf.require("name");
  if (!name.is_string()) throw_invalid_type(bf.path("name"), name, "a string");
  const Json* input = bf.object("input");
  if (!input) throw ApiError(400, cat(bf.path("input"), ": Field required"), bf.path("input"),
                             "missing_required_parameter");
  if (!input->is_object()) throw_invalid_type(bf.path("input"), *input, "an object");
  return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", *input}}}};
}

// One Anthropic message -> the template's messages: tool_result blocks become tool messages,
// the other blocks of a turn one user or assistant message.
void add_message(const Json& m, const std::string& path, Json& out) {
  if (!m.is_object()) throw_invalid_type(path, m, "an object");
  const Fields mf(m, path + ".");
  mf.reject_unknown({"role", "content"});
  const Json& role_value = mf.require("role");
  if (!role_value.is_string()) throw_invalid_type(mf.path("role"), role_value, "a string");
  const std::string role = role_value.get<std::string>();
  if (role != "user" && role != "assistant") invalid(mf.path("role"), "expected 'user' or 'assistant'");
  const Json& content = mf.require("content");
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return;
  }
  if (!content.is_array()) throw_invalid_type(mf.path("content"), content, "a string or an array of content blocks");
  std::string text, reasoning;
  Json calls = Json::array();
  const auto flush_user_text = [&] {
    if (role == "user" && !text.empty()) out.push_back({{"role", "user"}, {"content", text}});
    if (role == "user") text.clear();
  };
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = cat(mf.path("content"), ".", i);
    const Json& block = content[i];
    if (!block.is_object()) throw_invalid_type(at, block, "an object");
    const Fields bf(block, at + ".");
    const Json& type_value = bf.require("type");
    if (!type_value.is_string()) throw_invalid_type(bf.path("type"), type_value, "a string");
    const std::string type = type_value.get<std::string>();
    if (type == "text") {
      if (!text.empty()) text += "\n";
      text += block_text(bf);
    } else if (type == "tool_use" && role == "assistant") {
      calls.push_back(tool_call(bf));
    } else if (type == "tool_result" && role == "user") {
      bf.reject_unknown({"type", "tool_use_id", "content", "is_error", "cache_control"});
      const Json& id = bf.require("tool_use_id");
      if (!id.is_string()) throw_invalid_type(bf.path("tool_use_id"), id, "a string");
      bf.boolean("is_error");
      const Json* result = bf.find("content");
      flush_user_text();
      out.push_back({{"role", "tool"},
                     {"tool_call_id", id},
                     {"content", result ? text_of(*result, bf.path("content")) : ""}});
    } else if (type == "thinking" && role == "assistant") {
      bf.reject_unknown({"type", "thinking", "signature"});
      const Json& thought = bf.require("thinking");
      if (!thought.is_string()) throw_invalid_type(bf.path("thinking"), thought, "a string");
      bf.string("signature");
      reasoning += thought.get<std::string>();
    } else if (type == "redacted_thinking" && role == "assistant") {
      bf.reject_unknown({"type", "data"});
    } else if (type == "image" || type == "document" || type == "search_result" || type == "server_tool_use" ||
               type == "web_search_tool_result" || type == "container_upload") {
      unsupported(bf.path("type"), cat("A content block of type '", type, "'"));
    } else {
      invalid(bf.path("type"), cat("'", type, "' is not a content block a ", role, " message may hold"));
    }
  }
  if (role == "user") {
    flush_user_text();
    return;
  }
  Json msg = {{"role", "assistant"}, {"content", text}};
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  out.push_back(std::move(msg));
}

Json parse_messages(const Fields& f) {
  const Json* system = f.find("system");
  const Json* messages = f.array("messages");
  if (!messages) throw ApiError(400, "messages: Field required", "messages", "missing_required_parameter");
  if (messages->empty()) throw ApiError(400, "messages: at least one message is required", "messages", "empty_array");
  Json out = Json::array();
  if (system) out.push_back({{"role", "system"}, {"content", text_of(*system, "system")}});
  for (size_t i = 0; i < messages->size(); ++i) add_message((*messages)[i], cat("messages.", i), out);
  return out;
}

bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

Json parse_tools(const Fields& f) {
  const Json* tools = f.array("tools");
  if (!tools || tools->empty()) return nullptr;
  Json out = Json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string at = cat("tools.", i);
    const Json& t = (*tools)[i];
    if (!t.is_object()) throw_invalid_type(at, t, "an object");
    const Fields tf(t, at + ".");
    if (const auto type = tf.string("type"); type && *type != "custom")
      unsupported(tf.path("type"), cat("The server tool '", *type, "'"));
    tf.reject_unknown({"type", "name", "description", "input_schema", "cache_control"});
    const Json& name = tf.require("name");
    if (!name.is_string()) throw_invalid_type(tf.path("name"), name, "a string");
    if (!valid_tool_name(name.get<std::string>()))
      invalid(tf.path("name"), "a tool name is 1 to 64 letters, digits, '_' or '-'");
    const Json* schema = tf.object("input_schema");
    if (!schema) throw ApiError(400, cat(tf.path("input_schema"), ": Field required"), tf.path("input_schema"),
                                "missing_required_parameter");
    if (!schema->is_object()) throw_invalid_type(tf.path("input_schema"), *schema, "an object");
    Json fn = {{"name", name}};
    if (auto d = tf.string("description")) fn["description"] = *d;
    fn["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

void parse_tool_choice(const Fields& f, ChatRequest& r) {
  const Json* choice = f.object("tool_choice");
  if (!choice) return;
  const Fields cf(*choice, "tool_choice.");
  cf.reject_unknown({"type", "name", "disable_parallel_tool_use"});
  const auto type = cf.string("type");
  if (!type) throw ApiError(400, "tool_choice.type: Field required", "tool_choice.type", "missing_required_parameter");
  r.parallel_tool_calls = !cf.boolean("disable_parallel_tool_use").value_or(false);
  if (*type == "none") {
    r.tool_choice = {ToolChoiceMode::None, {}};
    return;
  }
  if (r.tools.is_null()) invalid("tool_choice", "only allowed when 'tools' are given");
  if (*type == "auto") {
    r.tool_choice = {ToolChoiceMode::Auto, {}};
  } else if (*type == "any") {
    r.tool_choice = {ToolChoiceMode::Required, {}};
  } else if (*type == "tool") {
    const auto name = cf.string("name");
    if (!name) throw ApiError(400, "tool_choice.name: Field required", "tool_choice.name", "missing_required_parameter");
    bool known = false;
    for (const auto& t : r.tools) known |= t["function"]["name"] == *name;
    if (!known) invalid("tool_choice.name", cat("no tool named '", *name, "' in tools"));
    r.tool_choice = {ToolChoiceMode::Function, *name};
  } else {
    invalid("tool_choice.type", cat("'", *type, "'; expected 'auto', 'any', 'tool' or 'none'"));
  }
}

// `thinking`: enabled with a budget, or disabled (also when absent: Anthropic's models only think
// when asked, so a thinking template is rendered with enable_thinking=false).
void parse_thinking(const Fields& f, ChatRequest& r) {
  bool enabled = false;
  if (const Json* thinking = f.object("thinking")) {
    const Fields tf(*thinking, "thinking.");
    tf.reject_unknown({"type", "budget_tokens"});
    const auto type = tf.string("type");
    if (type == "enabled") {
      enabled = true;
      const auto budget = tf.integer("budget_tokens", 1, INT32_MAX);
      if (!budget)
        throw ApiError(400, "thinking.budget_tokens: Field required", "thinking.budget_tokens",
                       "missing_required_parameter");
      if (r.max_tokens_given && *budget >= r.gen.max_tokens)
        invalid("thinking.budget_tokens", "must be less than max_tokens");
      r.thinking_budget = budget;
    } else if (type != "disabled") {
      invalid("thinking.type", "expected 'enabled' or 'disabled'");
    }
  }
  r.template_kwargs["enable_thinking"] = enabled;
}

// What both routes read: model, system, messages, tools, tool_choice, thinking.
ChatRequest parse_common(const Fields& f, const RequestLimits& limits) {
  parse_model(f, limits);
  ChatRequest r;
  r.messages = parse_messages(f);
  r.tools = parse_tools(f);
  parse_tool_choice(f, r);
  return r;
}

}  // namespace

ChatRequest parse_anthropic_messages(std::string_view body, const RequestLimits& limits) {
  const Json doc = parse_body(body, kMaxJsonDepth);
  const Fields f(doc, "");
  f.reject_unknown({"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
                    "top_p", "top_k", "tools", "tool_choice", "thinking", "metadata", "service_tier"});
  ChatRequest r = parse_common(f, limits);
  const auto max_tokens = f.integer("max_tokens", 1, INT32_MAX);
  if (!max_tokens) throw ApiError(400, "max_tokens: Field required", "max_tokens", "missing_required_parameter");
  r.gen.max_tokens = *max_tokens;
  r.max_tokens_given = true;
  parse_thinking(f, r);
  // The server's default is greedy decoding, as on /v1/chat/completions (Anthropic's is 1).
  r.gen.sampling.temperature = float(f.number("temperature", 0, 1).value_or(0));
  if (auto p = f.number("top_p", 0, 1)) {
    if (*p == 0)
      r.gen.sampling.temperature = 0;
    else
      r.gen.sampling.top_p = float(*p);
  }
  if (auto k = f.integer("top_k", 0, INT32_MAX)) r.gen.sampling.top_k = int32_t(*k);
  if (const Json* stops = f.array("stop_sequences")) {
    if (stops->size() > kMaxStops) invalid("stop_sequences", cat("at most ", kMaxStops, " stop sequences"));
    for (size_t i = 0; i < stops->size(); ++i) {
      const Json& s = (*stops)[i];
      const std::string at = cat("stop_sequences.", i);
      if (!s.is_string()) throw_invalid_type(at, s, "a string");
      if (s.get<std::string>().empty()) invalid(at, "a stop sequence must not be empty");
      r.gen.stop.push_back(s.get<std::string>());
    }
  }
  r.stream = f.boolean("stream").value_or(false);
  if (const Json* metadata = f.object("metadata")) {
    const Fields mf(*metadata, "metadata.");
    mf.reject_unknown({"user_id"});
    mf.string("user_id");
  }
  f.string("service_tier");
  return r;
}

ChatRequest parse_anthropic_count_tokens(std::string_view body, const RequestLimits& limits) {
  const Json doc = parse_body(body, kMaxJsonDepth);
  const Fields f(doc, "");
  f.reject_unknown({"model", "messages", "system", "tools", "tool_choice", "thinking"});
  ChatRequest r = parse_common(f, limits);
  parse_thinking(f, r);
  return r;
}

}  // namespace strata::server
