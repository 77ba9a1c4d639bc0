#include "server/anthropic_api.h"

#include "server/anthropic_request.h"
#include "server/encode.h"

namespace strata::server {

namespace {

// Our tool-call ids are "call_" + 16 hex digits; Anthropic's clients expect "toolu_".
std::string tool_use_id(const std::string& call_id) {
  return "toolu_" + (call_id.rfind("call_", 0) == 0 ? call_id.substr(5) : call_id);
}

std::string stop_reason(const decode::GenerateResult& r, bool tool_calls) {
  if (tool_calls) return "tool_use";
  switch (r.finish) {
    case decode::FinishReason::Eos: return "end_turn";
    case decode::FinishReason::Stop: return "stop_sequence";
    case decode::FinishReason::Length:
    case decode::FinishReason::Cancelled: return "max_tokens";
  }
  return "end_turn";
}

Json stop_sequence(const decode::GenerateResult& r) {
  return r.finish == decode::FinishReason::Stop ? Json(r.stop_sequence) : Json();
}

// Anthropic counts the prompt tokens read from the cache apart from input_tokens.
Json usage(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.cached_tokens},
          {"output_tokens", u.completion_tokens}};
}

Json arguments_object(const std::string& text) {
  Json input = Json::parse(text, nullptr, false);
  return input.is_object() ? input : Json::object();
}

Json message(const ResponseHeader& head, const ReplyReader& reader, const decode::GenerateResult& result) {
  Json content = Json::array();
  if (!reader.reasoning().empty())
    content.push_back({{"type", "thinking"}, {"thinking", reader.reasoning()}, {"signature", ""}});
  if (!reader.content().empty() || (reader.reasoning().empty() && !reader.has_tool_calls()))
    content.push_back({{"type", "text"}, {"text", reader.content()}});
  for (const auto& call : reader.tool_calls())
    content.push_back({{"type", "tool_use"},
                       {"id", tool_use_id(call.id)},
                       {"name", call.name},
                       {"input", arguments_object(call.arguments)}});
  return {{"id", head.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", head.model},
          {"content", std::move(content)},
          {"stop_reason", stop_reason(result, reader.has_tool_calls())},
          {"stop_sequence", stop_sequence(result)},
          {"usage", usage(usage_of(result.telemetry))}};
}

// The content-block events of one streamed reply: a block opens when its kind of text first
// arrives (closing the one before) and closes when another kind follows or the reply ends.
class BlockStream {
 public:
  std::string events(const ReplyEvents& e) {
    std::string out;
    if (!e.reasoning.empty()) {
      if (open_ != Block::Thinking)
        out += start(Block::Thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      out += delta({{"type", "thinking_delta"}, {"thinking", e.reasoning}});
    }
    if (!e.content.empty()) {
      if (open_ != Block::Text) out += start(Block::Text, {{"type", "text"}, {"text", ""}});
      out += delta({{"type", "text_delta"}, {"text", e.content}});
    }
    for (const auto& d : e.calls) {
      if (!d.id.empty())
        out += start(Block::ToolUse, {{"type", "tool_use"},
                                      {"id", tool_use_id(d.id)},
                                      {"name", d.name},
                                      {"input", Json::object()}});
      if (!d.arguments.empty()) out += delta({{"type", "input_json_delta"}, {"partial_json", d.arguments}});
    }
    return out;
  }

  // Closes the open block; a reply with no block at all gets an empty text block.
  std::string close() {
    std::string out;
    if (index_ < 0) out += start(Block::Text, {{"type", "text"}, {"text", ""}});
    if (open_ != Block::None)
      out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    open_ = Block::None;
    return out;
  }

 private:
  enum class Block { None, Thinking, Text, ToolUse };

  std::string start(Block kind, Json block) {
    std::string out = close_open();
    open_ = kind;
    ++index_;
    return out + sse_event("content_block_start",
                           {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
  }
  std::string close_open() {
    if (open_ == Block::None) return "";
    open_ = Block::None;
    return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  }
  std::string delta(Json d) {
    return sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}});
  }

  Block open_ = Block::None;
  int index_ = -1;
};

const std::string kPing = sse_event("ping", Json{{"type", "ping"}});

}  // namespace

Json anthropic_error_body(const ApiError& e) {
  const Json body = error_body(e);  // the message made valid UTF-8
  std::string type = "invalid_request_error";
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: type = e.status >= 500 ? "api_error" : "invalid_request_error";
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", body["error"]["message"]}}}};
}

int anthropic_status(const ApiError& e) { return e.status == 422 ? 400 : e.status; }

void AnthropicApi::messages(const httplib::Request& req, httplib::Response& res) {
  const auto until = generation_.deadline();
  const ChatRequest r = parse_anthropic_messages(req.body, generation_.limits());
  const StartedChat started = generation_.start_chat(r, until);
  const auto reader = started.reader;
  const ResponseHeader head = new_header("msg_", generation_.model_id());
  if (!r.stream) {
    hold_status(*started.job);
    respond(res, started.job, json_writer([head, reader](const decode::GenerateResult& result) {
              reader->feed(result.text);
              reader->finish();
              return message(head, *reader, result);
            }, anthropic_error_body));
    return;
  }
  const Json opening = {{"type", "message_start"},
                        {"message",
                         {{"id", head.id},
                          {"type", "message"},
                          {"role", "assistant"},
                          {"model", head.model},
                          {"content", Json::array()},
                          {"stop_reason", nullptr},
                          {"stop_sequence", nullptr},
                          {"usage", usage({.prompt_tokens = started.prompt_tokens})}}}};
  auto blocks = std::make_shared<BlockStream>();
  respond(res, started.job,
          Writer{kSseType, sse_event("message_start", opening) + kPing, kPing,
                 [reader, blocks](const std::string& text) { return blocks->events(reader->feed(text)); },
                 [reader, blocks](const Job& done) {
                   if (!done.result())
                     return sse_event("error", anthropic_error_body(internal_error(done.error())));
                   const auto& result = *done.result();
                   std::string out = blocks->events(reader->finish());
                   out += blocks->close();
                   out += sse_event("message_delta",
                                    {{"type", "message_delta"},
                                     {"delta",
                                      {{"stop_reason", stop_reason(result, reader->has_tool_calls())},
                                       {"stop_sequence", stop_sequence(result)}}},
                                     {"usage", usage(usage_of(result.telemetry))}});
                   return out + sse_event("message_stop", {{"type", "message_stop"}});
                 }});
}

void AnthropicApi::count_tokens(const httplib::Request& req, httplib::Response& res) {
  const ChatRequest r = parse_anthropic_count_tokens(req.body, generation_.limits());
  res.set_content(to_text({{"input_tokens", generation_.count_chat_tokens(r)}}), "application/json");
}

}  // namespace strata::server
