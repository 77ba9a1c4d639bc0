#include "server/responses_api.h"

#include "server/encode.h"
#include "server/responses_request.h"
#include "util/error.h"

namespace strata::server {

namespace {

// Output item ids derive from the response id, so a stream's items and its final response agree.
struct ItemIds {
  std::string base;
  std::string reasoning() const { return "rs_" + base; }
  std::string message() const { return "msg_" + base; }
  std::string call(size_t index) const { return cat("fc_", base, "_", index); }
};

bool cut_short(const decode::GenerateResult& r) {
  return r.finish == decode::FinishReason::Length || r.finish == decode::FinishReason::Cancelled;
}

Json reasoning_item(const ItemIds& ids, const std::string& text) {
  return {{"type", "reasoning"},
          {"id", ids.reasoning()},
          {"summary", Json::array()},
          {"content", Json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

Json text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
}

Json message_item(const ItemIds& ids, const std::string& text, const std::string& status) {
  return {{"type", "message"},
          {"id", ids.message()},
          {"status", status},
          {"role", "assistant"},
          {"content", text.empty() && status == "in_progress" ? Json::array() : Json::array({text_part(text)})}};
}

Json call_item(const ItemIds& ids, size_t index, const std::string& call_id, const std::string& name,
               const std::string& arguments, const std::string& status) {
  return {{"type", "function_call"}, {"id", ids.call(index)}, {"call_id", call_id}, {"name", name},
          {"arguments", arguments},   {"status", status}};
}

// The output of a finished reply: reasoning, the message (when there is text, or no other
// item), the calls.
Json output_items(const ItemIds& ids, const ReplyReader& reader, bool incomplete) {
  Json out = Json::array();
  if (!reader.reasoning().empty()) out.push_back(reasoning_item(ids, reader.reasoning()));
  if (!reader.content().empty() || (!reader.has_tool_calls() && reader.reasoning().empty()))
    out.push_back(message_item(ids, reader.content(), incomplete ? "incomplete" : "completed"));
  for (const auto& c : reader.tool_calls())
    out.push_back(call_item(ids, c.index, c.id, c.name, c.arguments, "completed"));
  return out;
}

// The response object around `output`; status "in_progress" (no usage yet), "completed" or
// "incomplete".
Json response_object(const ResponsesRequest& q, const ResponseHeader& head, const std::string& status,
                     Json output, const Json& usage) {
  Json r = {{"id", head.id},
            {"object", "response"},
            {"created_at", head.created},
            {"status", status},
            {"background", false},
            {"error", nullptr},
            {"incomplete_details", status == "incomplete" ? Json{{"reason", "max_output_tokens"}} : Json()},
            {"instructions", q.instructions},
            {"max_output_tokens", q.max_output_tokens ? Json(*q.max_output_tokens) : Json()},
            {"model", head.model},
            {"output", std::move(output)},
            {"parallel_tool_calls", q.chat.parallel_tool_calls},
            {"previous_response_id", nullptr},
            {"reasoning", q.reasoning},
            {"service_tier", "default"},
            {"store", false},
            {"temperature", q.temperature},
            {"text", {{"format", q.text_format}}},
            {"tool_choice", q.tool_choice},
            {"tools", q.tools},
            {"top_p", q.top_p},
            {"truncation", "disabled"},
            {"usage", usage},
            {"user", nullptr},
            {"metadata", q.metadata}};
  return r;
}

Json usage_json(const Usage& u, int64_t reasoning_tokens) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

// The events of one streamed response: an output item opens when its kind of text first arrives
// and is done when another kind follows or the reply ends. Every event carries the next
// sequence_number.
class ItemStream {
 public:
  explicit ItemStream(ItemIds ids) : ids_(std::move(ids)) {}

  std::string event(const std::string& type, Json data) {
    Json e = {{"type", type}};
    for (auto& [k, v] : data.items()) e[k] = std::move(v);
    e["sequence_number"] = sequence_++;
    return sse_event(type, e);
  }

  std::string events(const ReplyEvents& e) {
    std::string out;
    if (!e.reasoning.empty()) {
      if (open_ != Item::Reasoning) {
        out += open(Item::Reasoning, {{"type", "reasoning"}, {"id", ids_.reasoning()}, {"summary", Json::array()},
                                      {"content", Json::array()}});
        out += event("response.content_part.added",
                     {{"item_id", ids_.reasoning()}, {"output_index", index_}, {"content_index", 0},
                      {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
      }
      text_ += e.reasoning;
      out += event("response.reasoning_text.delta", {{"item_id", ids_.reasoning()}, {"output_index", index_},
                                                     {"content_index", 0}, {"delta", e.reasoning}});
    }
    if (!e.content.empty()) {
      if (open_ != Item::Message) {
        out += open(Item::Message, message_item(ids_, "", "in_progress"));
        out += event("response.content_part.added", {{"item_id", ids_.message()}, {"output_index", index_},
                                                     {"content_index", 0}, {"part", text_part("")}});
      }
      text_ += e.content;
      out += event("response.output_text.delta", {{"item_id", ids_.message()}, {"output_index", index_},
                                                  {"content_index", 0}, {"delta", e.content},
                                                  {"logprobs", Json::array()}});
    }
    for (const auto& d : e.calls) {
      if (!d.id.empty()) {
        out += open(Item::Call, call_item(ids_, d.index, d.id, d.name, "", "in_progress"));
        call_ = {d.index, d.id, d.name};
      }
      text_ += d.arguments;
      if (!d.arguments.empty())
        out += event("response.function_call_arguments.delta",
                     {{"item_id", ids_.call(call_.index)}, {"output_index", index_}, {"delta", d.arguments}});
    }
    return out;
  }

  // Ends the open item. A reply with no item at all gets an empty message.
  std::string close(bool incomplete) {
    std::string out;
    if (index_ < 0) {
      out += open(Item::Message, message_item(ids_, "", "in_progress"));
      out += event("response.content_part.added", {{"item_id", ids_.message()}, {"output_index", index_},
                                                   {"content_index", 0}, {"part", text_part("")}});
    }
    return out + finish_item(incomplete);
  }

 private:
  enum class Item { None, Reasoning, Message, Call };
  struct Call {
    size_t index = 0;
    std::string id, name;
  };

  std::string open(Item kind, Json item) {
    std::string out = finish_item(false);
    open_ = kind;
    ++index_;
    text_.clear();
    return out + event("response.output_item.added", {{"output_index", index_}, {"item", std::move(item)}});
  }

  std::string finish_item(bool incomplete) {
    std::string out;
    const Item kind = std::exchange(open_, Item::None);
    switch (kind) {
      case Item::None:
        return out;
      case Item::Reasoning: {
        const Json part = {{"type", "reasoning_text"}, {"text", text_}};
        out += event("response.reasoning_text.done", {{"item_id", ids_.reasoning()}, {"output_index", index_},
                                                      {"content_index", 0}, {"text", text_}});
        out += event("response.content_part.done", {{"item_id", ids_.reasoning()}, {"output_index", index_},
                                                    {"content_index", 0}, {"part", part}});
        return out + event("response.output_item.done",
                           {{"output_index", index_}, {"item", reasoning_item(ids_, text_)}});
      }
      case Item::Message:
        out += event("response.output_text.done", {{"item_id", ids_.message()}, {"output_index", index_},
                                                   {"content_index", 0}, {"text", text_},
                                                   {"logprobs", Json::array()}});
        out += event("response.content_part.done", {{"item_id", ids_.message()}, {"output_index", index_},
                                                    {"content_index", 0}, {"part", text_part(text_)}});
        return out + event("response.output_item.done",
                           {{"output_index", index_},
                            {"item", message_item(ids_, text_, incomplete ? "incomplete" : "completed")}});
      case Item::Call:
        out += event("response.function_call_arguments.done",
                     {{"item_id", ids_.call(call_.index)}, {"output_index", index_}, {"name", call_.name},
                      {"arguments", text_}});
        return out + event("response.output_item.done",
                           {{"output_index", index_},
                            {"item", call_item(ids_, call_.index, call_.id, call_.name, text_, "completed")}});
    }
    return out;
  }

  ItemIds ids_;
  int64_t sequence_ = 0;
  int index_ = -1;
  Item open_ = Item::None;
  std::string text_;  // the open item's text so far
  Call call_;
};

}  // namespace

void ResponsesApi::create(const httplib::Request& req, httplib::Response& res) {
  const auto until = generation_.deadline();
  auto q = std::make_shared<const ResponsesRequest>(parse_responses_request(req.body, generation_.limits()));
  const StartedChat started = generation_.start_chat(q->chat, until);
  const auto reader = started.reader;
  const ResponseHeader head = new_header("resp_", generation_.model_id());
  const ItemIds ids{head.id.substr(5)};
  decode::LoadedModel& model = generation_.model();
  // What OpenAI reports as reasoning_tokens: the reasoning text's length in tokens.
  const auto finished = [q, head, ids, reader, &model](const decode::GenerateResult& result) {
    const bool incomplete = cut_short(result);
    const int64_t reasoning = int64_t(model.encode(reader->reasoning()).size());
    return response_object(*q, head, incomplete ? "incomplete" : "completed",
                           output_items(ids, *reader, incomplete), usage_json(usage_of(result.telemetry), reasoning));
  };
  if (!q->chat.stream) {
    hold_status(*started.job);
    respond(res, started.job, json_writer([reader, finished](const decode::GenerateResult& result) {
              reader->feed(result.text);
              reader->finish();
              return finished(result);
            }, error_body));
    return;
  }
  auto items = std::make_shared<ItemStream>(ids);
  const Json created = response_object(*q, head, "in_progress", Json::array(), nullptr);
  std::string opening = items->event("response.created", {{"response", created}});
  opening += items->event("response.in_progress", {{"response", created}});
  respond(res, started.job,
          Writer{kSseType, std::move(opening), ": keep-alive\n\n",
                 [reader, items](const std::string& text) { return items->events(reader->feed(text)); },
                 [reader, items, finished](const Job& done) {
                   if (!done.result()) {
                     const ApiError e = internal_error(done.error());
                     return items->event("error", {{"code", e.code}, {"message", e.message}, {"param", nullptr}});
                   }
                   const auto& result = *done.result();
                   std::string out = items->events(reader->finish());
                   out += items->close(cut_short(result));
                   const Json response = finished(result);
                   return out + items->event(response["status"] == "completed" ? "response.completed"
                                                                               : "response.incomplete",
                                             {{"response", response}});
                 }});
}

}  // namespace strata::server
