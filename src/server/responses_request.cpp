#include "server/responses_request.h"

#include <utility>

#include "server/json_fields.h"
#include "util/error.h"

namespace strata::server {

namespace {

[[noreturn]] void unsupported(const std::string& param, const std::string& what) {
  throw ApiError(422, cat(what, " is not supported by this server."), param, "unsupported_value");
}

[[noreturn]] void invalid(const std::string& param, const std::string& what) {
  throw ApiError(400, cat("Invalid '", param, "': ", what), param, "invalid_value");
}

const Json& require_string(const Fields& f, std::string_view key) {
  const Json& v = f.require(key);
  if (!v.is_string()) throw_invalid_type(f.path(key), v, "a string");
  return v;
}

// A message's content: a string, or parts of the given kinds joined.
std::string content_text(const Json& content, const std::string& path) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw_invalid_type(path, content, "a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = cat(path, "[", i, "]");
    const Json& part = content[i];
    if (!part.is_object()) throw_invalid_type(at, part, "an object");
    const Fields pf(part, at + ".");
    const std::string type = require_string(pf, "type").get<std::string>();
    if (type == "input_text" || type == "output_text") {
      pf.reject_unknown({"type", "text", "annotations", "logprobs"});
      text += require_string(pf, "text").get<std::string>();
    } else if (type == "refusal") {
      pf.reject_unknown({"type", "refusal"});
      text += require_string(pf, "refusal").get<std::string>();
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      unsupported(pf.path("type"), cat("Content of type '", type, "'"));
    } else {
      invalid(pf.path("type"), cat("'", type, "' is not a content part type"));
    }
  }
  return text;
}

// The items of `input` -> the template's messages. Function calls join the assistant message
// before them (parallel calls); a reasoning item goes with the next assistant turn.
void parse_items(const Json& input, Json& out) {
  std::string reasoning;
  const auto assistant = [&]() -> Json& {
    if (out.empty() || out.back()["role"] != "assistant") out.push_back({{"role", "assistant"}, {"content", ""}});
    Json& m = out.back();
    if (!reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, "");
    return m;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string at = cat("input[", i, "]");
    const Json& item = input[i];
    if (!item.is_object()) throw_invalid_type(at, item, "an object");
    const Fields f(item, at + ".");
    const auto type = f.string("type").value_or("message");
    if (type == "message") {
      f.reject_unknown({"type", "role", "content", "id", "status"});
      std::string role = require_string(f, "role").get<std::string>();
      if (role == "developer") role = "system";
      if (role != "user" && role != "assistant" && role != "system")
        invalid(f.path("role"), cat("'", role, "'; expected 'user', 'assistant', 'system' or 'developer'"));
      const std::string text = content_text(f.require("content"), f.path("content"));
      f.string("id");
      f.string("status");
      if (role == "assistant") {
        Json& m = assistant();
        m["content"] = m["content"].get<std::string>() + text;
      } else {
        out.push_back({{"role", role}, {"content", text}});
      }
    } else if (type == "function_call") {
      f.reject_unknown({"type", "call_id", "name", "arguments", "id", "status"});
      const Json& call_id = require_string(f, "call_id");
      const Json& name = require_string(f, "name");
      const Json& arguments = require_string(f, "arguments");
      f.string("id");
      f.string("status");
      Json& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = Json::array();
      m["tool_calls"].push_back(
          {{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
    } else if (type == "function_call_output") {
      f.reject_unknown({"type", "call_id", "output", "id", "status"});
      const Json& call_id = require_string(f, "call_id");
      const std::string output = content_text(f.require("output"), f.path("output"));
      f.string("id");
      f.string("status");
      out.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", output}});
    } else if (type == "reasoning") {
      f.reject_unknown({"type", "id", "summary", "content", "encrypted_content", "status"});
      f.string("id");
      f.string("status");
      f.string("encrypted_content");
      for (const char* key : {"summary", "content"}) {
        const Json* parts = f.array(key);
        if (!parts) continue;
        for (size_t k = 0; k < parts->size(); ++k) {
          const std::string part_at = cat(f.path(key), "[", k, "]");
          const Json& part = (*parts)[k];
          if (!part.is_object()) throw_invalid_type(part_at, part, "an object");
          const Fields pf(part, part_at + ".");
          pf.reject_unknown({"type", "text"});
          require_string(pf, "type");
          // The reasoning text itself, or its summary when that is all the client kept.
          if (std::string_view(key) == "content" || !item.contains("content"))
            reasoning += require_string(pf, "text").get<std::string>();
        }
      }
    } else if (type == "item_reference") {
      unsupported(f.path("type"), "An item_reference (this server stores no responses)");
    } else {
      invalid(f.path("type"), cat("'", type, "' is not an input item type"));
    }
  }
}

Json parse_tools(const Fields& f) {
  const Json* tools = f.array("tools");
  if (!tools || tools->empty()) return nullptr;
  Json out = Json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string at = cat("tools[", i, "]");
    const Json& t = (*tools)[i];
    if (!t.is_object()) throw_invalid_type(at, t, "an object");
    const Fields tf(t, at + ".");
    const std::string type = require_string(tf, "type").get<std::string>();
    if (type != "function") unsupported(tf.path("type"), cat("The built-in tool '", type, "'"));
    tf.reject_unknown({"type", "name", "description", "parameters", "strict"});
    Json fn = {{"name", require_string(tf, "name")}};
    if (auto d = tf.string("description")) fn["description"] = *d;
    if (const Json* p = tf.object("parameters")) fn["parameters"] = *p;
    tf.boolean("strict");
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

ToolChoice parse_tool_choice(const Fields& f, const Json& tools) {
  const Json* choice = f.find("tool_choice");
  if (!choice) return {};
  if (choice->is_string()) {
    const std::string s = choice->get<std::string>();
    if (s == "none") return {ToolChoiceMode::None, {}};
    if (tools.is_null()) invalid("tool_choice", "only allowed when 'tools' are given");
    if (s == "auto") return {ToolChoiceMode::Auto, {}};
    if (s == "required") return {ToolChoiceMode::Required, {}};
    invalid("tool_choice", cat("'", s, "'; expected 'none', 'auto', 'required' or a function"));
  }
  if (!choice->is_object()) throw_invalid_type("tool_choice", *choice, "a string or an object");
  const Fields cf(*choice, "tool_choice.");
  const std::string type = require_string(cf, "type").get<std::string>();
  if (type != "function") unsupported("tool_choice.type", cat("tool_choice of type '", type, "'"));
  cf.reject_unknown({"type", "name"});
  const std::string name = require_string(cf, "name").get<std::string>();
  if (!tools.is_null())
    for (const auto& t : tools)
      if (t["function"]["name"] == name) return {ToolChoiceMode::Function, name};
  invalid("tool_choice.name", cat("no tool named '", name, "' in tools"));
}

ResponseFormat parse_text(const Fields& f, Json& echo) {
  echo = {{"type", "text"}};
  const Json* text = f.object("text");
  if (!text) return {};
  const Fields tf(*text, "text.");
  tf.reject_unknown({"format", "verbosity"});
  tf.string("verbosity");
  const Json* format = tf.object("format");
  if (!format) return {};
  echo = *format;
  const Fields ff(*format, "text.format.");
  const std::string type = require_string(ff, "type").get<std::string>();
  ResponseFormat out;
  if (type == "text") {
    ff.reject_unknown({"type"});
  } else if (type == "json_object") {
    ff.reject_unknown({"type"});
    out.type = ResponseFormatType::JsonObject;
  } else if (type == "json_schema") {
    ff.reject_unknown({"type", "name", "schema", "description", "strict"});
    out.type = ResponseFormatType::JsonSchema;
    out.name = require_string(ff, "name").get<std::string>();
    const Json* schema = ff.object("schema");
    if (!schema)
      throw ApiError(400, "Missing required parameter: 'text.format.schema'.", "text.format.schema",
                     "missing_required_parameter");
    out.schema = *schema;
    ff.string("description");
    out.strict = ff.boolean("strict").value_or(false);
  } else {
    invalid("text.format.type", cat("'", type, "'; expected 'text', 'json_object' or 'json_schema'"));
  }
  return out;
}

}  // namespace

ResponsesRequest parse_responses_request(std::string_view body, const RequestLimits& limits) {
  const Json doc = parse_body(body, kMaxJsonDepth);
  const Fields f(doc, "");
  f.reject_unknown({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                    "reasoning", "max_output_tokens", "temperature", "top_p", "stream", "stream_options", "store",
                    "metadata", "user", "safety_identifier", "prompt_cache_key", "service_tier", "truncation",
                    "include", "previous_response_id", "background", "conversation", "prompt", "top_logprobs",
                    "max_tool_calls"});
  const Json& model = f.require("model");
  if (!model.is_string()) throw_invalid_type("model", model, "a string");
  if (model.get<std::string>() != limits.model_id)
    throw ApiError(404,
                   cat("The model '", model.get<std::string>(), "' does not exist; this server serves '",
                       limits.model_id, "'."),
                   "model", "model_not_found");
  for (const char* stateful : {"previous_response_id", "conversation", "prompt"})
    if (f.find(stateful)) unsupported(stateful, cat("'", stateful, "' (this server stores no responses or prompts)"));
  if (f.boolean("background").value_or(false)) unsupported("background", "Background responses");
  if (f.integer("top_logprobs", 0, 20).value_or(0) > 0) unsupported("top_logprobs", "top_logprobs");

  ResponsesRequest out;
  ChatRequest& r = out.chat;
  Json messages = Json::array();
  if (auto instructions = f.string("instructions")) {
    out.instructions = *instructions;
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  }
  const Json& input = f.require("input");
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    parse_items(input, messages);
  } else {
    throw_invalid_type("input", input, "a string or an array of input items");
  }
  if (messages.empty()) throw ApiError(400, "Invalid 'input': empty array.", "input", "empty_array");
  r.messages = std::move(messages);

  r.tools = parse_tools(f);
  out.tools = f.array("tools") ? *f.array("tools") : Json::array();
  r.tool_choice = parse_tool_choice(f, r.tools);
  out.tool_choice = f.find("tool_choice") ? *f.find("tool_choice") : Json("auto");
  r.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
  r.response_format = parse_text(f, out.text_format);

  out.reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  if (const Json* reasoning = f.object("reasoning")) {
    const Fields rf(*reasoning, "reasoning.");
    rf.reject_unknown({"effort", "summary", "generate_summary"});
    if (auto effort = rf.string("effort")) {
      if (*effort != "none" && *effort != "minimal" && *effort != "low" && *effort != "medium" &&
          *effort != "high")
        invalid("reasoning.effort", cat("'", *effort, "'; expected none, minimal, low, medium or high"));
      out.reasoning["effort"] = *effort;
      r.template_kwargs["enable_thinking"] = *effort != "none";
    }
    if (auto summary = rf.string("summary")) out.reasoning["summary"] = *summary;
    rf.string("generate_summary");
  }

  // The server's default is greedy decoding, as on /v1/chat/completions.
  r.gen.max_tokens = INT64_MAX;
  if (auto m = f.integer("max_output_tokens", 1, INT64_MAX)) {
    r.gen.max_tokens = *m;
    r.max_tokens_given = true;
    out.max_output_tokens = *m;
  }
  out.temperature = f.number("temperature", 0, 2).value_or(0);
  r.gen.sampling.temperature = float(out.temperature);
  if (auto p = f.number("top_p", 0, 1)) {
    out.top_p = *p;
    if (*p == 0)
      r.gen.sampling.temperature = 0;
    else
      r.gen.sampling.top_p = float(*p);
  }
  r.stream = f.boolean("stream").value_or(false);
  if (const Json* so = f.object("stream_options")) {
    if (!r.stream) invalid("stream_options", "only allowed when 'stream' is true");
    const Fields opts(*so, "stream_options.");
    opts.reject_unknown({"include_obfuscation"});
    opts.boolean("include_obfuscation");
  }
  f.boolean("store");
  out.metadata = f.object("metadata") ? *f.object("metadata") : Json::object();
  for (const char* key : {"user", "safety_identifier", "prompt_cache_key", "service_tier"}) f.string(key);
  if (auto t = f.string("truncation"); t && *t != "auto" && *t != "disabled")
    invalid("truncation", "expected 'auto' or 'disabled'");
  if (const Json* include = f.array("include"))
    for (size_t i = 0; i < include->size(); ++i)
      if (!(*include)[i].is_string()) throw_invalid_type(cat("include[", i, "]"), (*include)[i], "a string");
  f.integer("max_tool_calls", 1, INT64_MAX);
  return out;
}

}  // namespace strata::server
