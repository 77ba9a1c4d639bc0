#include "server/request.h"

#include <cctype>

#include "server/json_fields.h"
#include "util/error.h"

namespace strata::server {

namespace {

// More stop strings than OpenAI's four: local clients (agents, chat UIs) often send a handful
// of role markers.
constexpr size_t kMaxStops = 16;
// OpenAI's limit. Every tool is rendered into the prompt, so thousands of them would only make a
// prompt no context holds, after rendering them all.
constexpr size_t kMaxTools = 128;

[[noreturn]] void unsupported(const std::string& param, const std::string& what) {
  throw ApiError(422, cat(what, " is not supported by this server."), param, "unsupported_value");
}

void parse_model(const Fields& f, const RequestLimits& limits) {
  const Json& model = f.require("model");
  if (!model.is_string()) throw_invalid_type("model", model, "a string");
  const auto name = model.get<std::string>();
  if (name != limits.model_id)
    throw ApiError(404,
                   cat("The model '", name, "' does not exist; this server serves '",
                       limits.model_id, "'."),
                   "model", "model_not_found");
}

std::vector<std::string> parse_stop(const Fields& f) {
  const Json* stop = f.find("stop");
  if (!stop) return {};
  std::vector<std::string> stops;
  if (stop->is_string()) {
    stops.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    if (stop->size() > kMaxStops)
      throw ApiError(400, cat("Invalid 'stop': at most ", kMaxStops, " stop strings, got ",
                              stop->size(), "."),
                     "stop", "array_above_max_length");
    for (size_t i = 0; i < stop->size(); ++i) {
      const Json& s = (*stop)[i];
      if (!s.is_string()) throw_invalid_type(cat("stop[", i, "]"), s, "a string");
      stops.push_back(s.get<std::string>());
    }
  } else {
    throw_invalid_type("stop", *stop, "a string or an array of strings");
  }
  for (size_t i = 0; i < stops.size(); ++i)
    if (stops[i].empty())
      throw ApiError(400, "Invalid 'stop': a stop string must not be empty.", cat("stop[", i, "]"),
                     "empty_string");
  return stops;
}

std::vector<std::pair<int32_t, float>> parse_logit_bias(const Fields& f, int64_t n_vocab) {
  const Json* bias = f.object("logit_bias");
  if (!bias) return {};
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, value] : bias->items()) {
    const std::string path = cat("logit_bias.", key);
    int64_t id = -1;
    if (!key.empty() && key.size() <= 10 &&
        key.find_first_not_of("0123456789") == std::string::npos)
      id = std::stoll(key);
    if (id < 0 || id >= n_vocab)
      throw ApiError(400, cat("Invalid 'logit_bias': '", key, "' is not a token id below ",
                              n_vocab, "."),
                     "logit_bias", "invalid_value");
    const auto b = Fields(*bias, "logit_bias.").number(key, -100, 100);
    if (!b) throw_invalid_type(path, value, "a number");
    out.emplace_back(int32_t(id), float(*b));
  }
  return out;
}

// Fields both endpoints read: sampling, length, stop and streaming.
void parse_generation(const Fields& f, GenerationRequest& r, int64_t n_vocab) {
  auto& s = r.gen.sampling;
  if (auto t = f.number("temperature", 0, 2)) s.temperature = float(*t);
  if (auto p = f.number("top_p", 0, 1)) {
    // OpenAI accepts top_p = 0, meaning only the most likely token: that is greedy.
    if (*p == 0)
      s.temperature = 0;
    else
      s.top_p = float(*p);
  }
  if (auto v = f.number("presence_penalty", -2, 2)) s.presence_penalty = float(*v);
  if (auto v = f.number("frequency_penalty", -2, 2)) s.frequency_penalty = float(*v);
  if (auto v = f.integer("top_k", 0, INT32_MAX)) s.top_k = int32_t(*v);
  if (auto v = f.number("min_p", 0, 1)) s.min_p = float(*v);
  if (auto v = f.number("repetition_penalty", 1e-3, 100)) s.repetition_penalty = float(*v);
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) r.seed = uint64_t(*v);
  if (auto n = f.integer("n", 1, INT64_MAX); n && *n > 1)
    unsupported("n", "More than one choice per request (n > 1)");

  r.logit_bias = parse_logit_bias(f, n_vocab);
  r.gen.stop = parse_stop(f);
  r.stream = f.boolean("stream").value_or(false);
  if (const Json* so = f.object("stream_options")) {
    if (!r.stream)
      throw ApiError(400, "Invalid 'stream_options': only allowed when 'stream' is true.",
                     "stream_options", "invalid_value");
    const Fields opts(*so, "stream_options.");
    opts.reject_unknown({"include_usage", "include_obfuscation"});
    r.include_usage = opts.boolean("include_usage").value_or(false);
  }
}

void set_max_tokens(GenerationRequest& r, std::optional<int64_t> max_tokens) {
  if (!max_tokens) return;
  r.gen.max_tokens = *max_tokens;
  r.max_tokens_given = true;
}

// A message's content as one string: a string, null (only where allowed) or text parts.
std::string parse_content(const Json& msg, const std::string& path, bool null_ok) {
  const auto it = msg.find("content");
  const std::string where = path + ".content";
  if (it == msg.end() || it->is_null()) {
    if (null_ok) return "";
    throw ApiError(400, cat("Missing required parameter: '", where, "'."), where,
                   "missing_required_parameter");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw_invalid_type(where, *it, "a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& part = (*it)[i];
    const std::string part_path = cat(where, "[", i, "]");
    if (!part.is_object()) throw_invalid_type(part_path, part, "an object");
    const Fields pf(part, part_path + ".");
    const auto type = pf.string("type");
    if (type != "text") {
      if (type == "image_url" || type == "input_audio" || type == "file")
        unsupported(part_path + ".type", cat("Content of type '", *type, "'"));
      throw ApiError(400, cat("Invalid '", part_path, ".type': expected 'text'."),
                     part_path + ".type", "invalid_value");
    }
    const Json& t = pf.require("text");
    if (!t.is_string()) throw_invalid_type(part_path + ".text", t, "a string");
    text += t.get<std::string>();
  }
  return text;
}

Json parse_tool_calls(const Json& calls, const std::string& path) {
  if (!calls.is_array()) throw_invalid_type(path, calls, "an array");
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string call_path = cat(path, "[", i, "]");
    if (!calls[i].is_object()) throw_invalid_type(call_path, calls[i], "an object");
    const Fields cf(calls[i], call_path + ".");
    cf.string("id");
    if (const auto type = cf.string("type"); type && *type != "function")
      throw ApiError(400, cat("Invalid '", call_path, ".type': expected 'function'."),
                     call_path + ".type", "invalid_value");
    const Json& fn = cf.require("function");
    if (!fn.is_object()) throw_invalid_type(call_path + ".function", fn, "an object");
    const Fields ff(fn, call_path + ".function.");
    if (!ff.require("name").is_string())
      throw_invalid_type(ff.path("name"), fn["name"], "a string");
    const Json& args = ff.require("arguments");
    if (!args.is_string() && !args.is_object())
      throw_invalid_type(ff.path("arguments"), args, "a string");
  }
  return calls;
}

Json parse_messages(const Fields& f) {
  const Json* messages = f.array("messages");
  if (!messages)
    throw ApiError(400, "Missing required parameter: 'messages'.", "messages",
                   "missing_required_parameter");
  if (messages->empty())
    throw ApiError(400,
                   "Invalid 'messages': empty array. Expected an array with at least one "
                   "message.",
                   "messages", "empty_array");
  Json out = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string path = cat("messages[", i, "]");
    if (!m.is_object()) throw_invalid_type(path, m, "an object");
    const Fields mf(m, path + ".");
    const Json& role_value = mf.require("role");
    if (!role_value.is_string()) throw_invalid_type(mf.path("role"), role_value, "a string");
    std::string role = role_value.get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      throw ApiError(400,
                     cat("Invalid value: '", role, "'. Supported values are: 'system', "
                         "'developer', 'user', 'assistant' and 'tool'."),
                     mf.path("role"), "invalid_value");
    Json msg = {{"role", role}};
    const Json* calls = role == "assistant" ? mf.find("tool_calls") : nullptr;
    msg["content"] = parse_content(m, path, role == "assistant");
    if (auto name = mf.string("name")) msg["name"] = *name;
    if (calls) msg["tool_calls"] = parse_tool_calls(*calls, mf.path("tool_calls"));
    if (role == "assistant")
      if (auto reasoning = mf.string("reasoning_content")) msg["reasoning_content"] = *reasoning;
    if (role == "tool") {
      const Json& id = mf.require("tool_call_id");
      if (!id.is_string()) throw_invalid_type(mf.path("tool_call_id"), id, "a string");
      msg["tool_call_id"] = id;
    }
    out.push_back(std::move(msg));
  }
  return out;
}

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-')
      return false;
  return true;
}

Json parse_tools(const Fields& f) {
  const Json* tools = f.array("tools");
  if (!tools) return nullptr;
  if (tools->empty())
    throw ApiError(400, "Invalid 'tools': empty array. Expected at least one tool.", "tools",
                   "empty_array");
  if (tools->size() > kMaxTools)
    throw ApiError(400, cat("Invalid 'tools': at most ", kMaxTools, " tools, got ", tools->size(),
                            "."),
                   "tools", "array_above_max_length");
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string path = cat("tools[", i, "]");
    const Json& t = (*tools)[i];
    if (!t.is_object()) throw_invalid_type(path, t, "an object");
    const Fields tf(t, path + ".");
    tf.reject_unknown({"type", "function"});
    if (tf.string("type") != "function")
      throw ApiError(400, cat("Invalid '", path, ".type': expected 'function'."), path + ".type",
                     "invalid_value");
    const Json* fn = tf.object("function");
    if (!fn)
      throw ApiError(400, cat("Missing required parameter: '", path, ".function'."),
                     path + ".function", "missing_required_parameter");
    const Fields ff(*fn, path + ".function.");
    ff.reject_unknown({"name", "description", "parameters", "strict"});
    const Json& name = ff.require("name");
    if (!name.is_string()) throw_invalid_type(ff.path("name"), name, "a string");
    if (!valid_function_name(name.get<std::string>()))
      throw ApiError(400,
                     cat("Invalid '", ff.path("name"),
                         "': a function name is 1 to 64 letters, digits, '_', '.' or '-'."),
                     ff.path("name"), "invalid_value");
    ff.string("description");
    ff.object("parameters");
    ff.boolean("strict");
  }
  return *tools;
}

ToolChoice parse_tool_choice(const Fields& f, const Json& tools) {
  const Json* choice = f.find("tool_choice");
  if (!choice) return {};
  if (tools.is_null())
    throw ApiError(400, "Invalid 'tool_choice': only allowed when 'tools' are specified.",
                   "tool_choice", "invalid_value");
  if (choice->is_string()) {
    const auto s = choice->get<std::string>();
    if (s == "none") return {ToolChoiceMode::None, {}};
    if (s == "auto") return {ToolChoiceMode::Auto, {}};
    if (s == "required") return {ToolChoiceMode::Required, {}};
    throw ApiError(400,
                   cat("Invalid 'tool_choice': '", s,
                       "'. Expected 'none', 'auto', 'required' or a function."),
                   "tool_choice", "invalid_value");
  }
  if (!choice->is_object()) throw_invalid_type("tool_choice", *choice, "a string or an object");
  const Fields cf(*choice, "tool_choice.");
  if (cf.string("type") != "function")
    throw ApiError(400, "Invalid 'tool_choice.type': expected 'function'.", "tool_choice.type",
                   "invalid_value");
  const Json* fn = cf.object("function");
  if (!fn)
    throw ApiError(400, "Missing required parameter: 'tool_choice.function'.",
                   "tool_choice.function", "missing_required_parameter");
  const Json& name = Fields(*fn, "tool_choice.function.").require("name");
  if (!name.is_string()) throw_invalid_type("tool_choice.function.name", name, "a string");
  for (const auto& t : tools)
    if (t["function"]["name"] == name) return {ToolChoiceMode::Function, name.get<std::string>()};
  throw ApiError(400, cat("Invalid 'tool_choice': no tool named '", name.get<std::string>(), "'."),
                 "tool_choice.function.name", "invalid_value");
}

ResponseFormat parse_response_format(const Fields& f) {
  const Json* rf = f.object("response_format");
  if (!rf) return {};
  const Fields rff(*rf, "response_format.");
  const Json& type = rff.require("type");
  if (!type.is_string()) throw_invalid_type("response_format.type", type, "a string");
  ResponseFormat out;
  if (type == "text") return out;
  if (type == "json_object") {
    out.type = ResponseFormatType::JsonObject;
    return out;
  }
  if (type != "json_schema")
    throw ApiError(400,
                   cat("Invalid 'response_format.type': '", type.get<std::string>(),
                       "'. Expected 'text', 'json_object' or 'json_schema'."),
                   "response_format.type", "invalid_value");
  out.type = ResponseFormatType::JsonSchema;
  const Json* js = rff.object("json_schema");
  if (!js)
    throw ApiError(400, "Missing required parameter: 'response_format.json_schema'.",
                   "response_format.json_schema", "missing_required_parameter");
  const Fields jf(*js, "response_format.json_schema.");
  jf.reject_unknown({"name", "description", "schema", "strict"});
  const Json& name = jf.require("name");
  if (!name.is_string()) throw_invalid_type(jf.path("name"), name, "a string");
  out.name = name.get<std::string>();
  jf.string("description");
  if (const Json* schema = jf.object("schema")) out.schema = *schema;
  out.strict = jf.boolean("strict").value_or(false);
  return out;
}

void reject_unsupported_chat_options(const Fields& f) {
  if (f.boolean("logprobs").value_or(false)) unsupported("logprobs", "logprobs");
  if (f.integer("top_logprobs", 0, 20).value_or(0) > 0)
    unsupported("top_logprobs", "top_logprobs");
  if (const Json* modalities = f.array("modalities"))
    for (const auto& m : *modalities)
      if (m != "text") unsupported("modalities", "An output modality other than text");
  if (f.find("audio")) unsupported("audio", "Audio output");
  if (f.find("functions") || f.find("function_call"))
    unsupported("functions", "The legacy 'functions' API (use 'tools')");
}

}  // namespace

ChatRequest parse_chat_request(std::string_view body, const RequestLimits& limits) {
  const Json doc = parse_body(body, kMaxJsonDepth);
  const Fields f(doc, "");
  f.reject_unknown({"model", "messages", "stream", "stream_options", "max_tokens",
                    "max_completion_tokens", "temperature", "top_p", "seed", "presence_penalty",
                    "frequency_penalty", "stop", "n", "tools", "tool_choice",
                    "parallel_tool_calls", "response_format", "user", "logprobs", "top_logprobs",
                    "logit_bias", "metadata", "store", "service_tier", "reasoning_effort",
                    "modalities", "audio", "functions", "function_call", "top_k", "min_p",
                    "repetition_penalty", "chat_template_kwargs", "thinking_token_budget"});
  parse_model(f, limits);
  ChatRequest r;
  // Without max_tokens a chat reply runs until the model ends it or the context is full.
  r.gen.max_tokens = INT64_MAX;
  r.messages = parse_messages(f);
  parse_generation(f, r, limits.n_vocab);
  set_max_tokens(r, f.integer("max_tokens", 1, INT64_MAX));
  set_max_tokens(r, f.integer("max_completion_tokens", 1, INT64_MAX));
  r.tools = parse_tools(f);
  r.tool_choice = parse_tool_choice(f, r.tools);
  r.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
  r.response_format = parse_response_format(f);
  if (const Json* kwargs = f.object("chat_template_kwargs")) r.template_kwargs = *kwargs;
  r.thinking_budget = f.integer("thinking_token_budget", 0, INT32_MAX);
  f.string("user");
  f.object("metadata");
  f.boolean("store");
  f.string("service_tier");
  f.string("reasoning_effort");
  reject_unsupported_chat_options(f);
  return r;
}

CompletionRequest parse_completion_request(std::string_view body, const RequestLimits& limits) {
  const Json doc = parse_body(body, kMaxJsonDepth);
  const Fields f(doc, "");
  f.reject_unknown({"model", "prompt", "stream", "stream_options", "max_tokens", "temperature",
                    "top_p", "seed", "presence_penalty", "frequency_penalty", "stop", "n", "echo",
                    "best_of", "logprobs", "logit_bias", "suffix", "user", "top_k", "min_p",
                    "repetition_penalty"});
  parse_model(f, limits);
  CompletionRequest r;
  // OpenAI's legacy completions default to 16 tokens.
  r.gen.max_tokens = 16;
  const Json& prompt = f.require("prompt");
  // A one-element batch is the same prompt; larger batches would need n choices.
  const Json& single = prompt.is_array() && prompt.size() == 1 &&
                               (prompt[0].is_string() || prompt[0].is_array())
                           ? prompt[0]
                           : prompt;
  if (single.is_string()) {
    r.prompt = single.get<std::string>();
  } else if (single.is_array() && !single.empty() && single[0].is_number()) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < single.size(); ++i) {
      const Json& id = single[i];
      const std::string path = cat("prompt[", i, "]");
      if (!id.is_number_integer()) throw_invalid_type(path, id, "an integer");
      if (id.is_number_unsigned() ? id.get<uint64_t>() >= uint64_t(limits.n_vocab)
                                  : (id.get<int64_t>() < 0 || id.get<int64_t>() >= limits.n_vocab))
        throw ApiError(400, cat("Invalid '", path, "': token id ", id.dump(),
                                " is outside the vocabulary of ", limits.n_vocab, " tokens."),
                       path, "invalid_value");
      ids.push_back(int32_t(id.get<int64_t>()));
    }
    r.prompt_tokens = std::move(ids);
  } else if (prompt.is_array() && prompt.size() > 1) {
    unsupported("prompt", "A batch of several prompts");
  } else {
    throw_invalid_type("prompt", prompt, "a string or an array of token ids");
  }
  parse_generation(f, r, limits.n_vocab);
  set_max_tokens(r, f.integer("max_tokens", 1, INT64_MAX));
  r.echo = f.boolean("echo").value_or(false);
  if (f.integer("best_of", 1, INT64_MAX).value_or(1) > 1)
    unsupported("best_of", "best_of > 1");
  if (f.integer("logprobs", 0, 5).value_or(0) > 0) unsupported("logprobs", "logprobs");
  if (f.string("suffix")) unsupported("suffix", "suffix (fill-in-the-middle)");
  f.string("user");
  return r;
}

}  // namespace strata::server
