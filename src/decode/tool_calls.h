// Tool calls out of the model's text. Qwen's chat template asks for
//   <tool_call>
//   {"name": <function-name>, "arguments": <args-json-object>}
//   </tool_call>
// blocks (several, separated by newlines, for parallel calls). ToolCallParser is fed the
// generated text piece by piece, as the generation loop streams it, and splits it into ordinary
// content and OpenAI-format tool calls, with the incremental deltas a streaming response sends.
// How pieces are cut never changes the result.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::decode {

// One finished call, as OpenAI's message.tool_calls[i] (type "function").
struct ToolCall {
  size_t index = 0;  // position among the calls of this reply (as streamed)
  std::string id;    // "call_" + 16 hex digits
  std::string name;
  std::string arguments;  // JSON text of an object, exactly as the model wrote it
};

// One streaming delta, as OpenAI's delta.tool_calls[i]: a call's first delta carries its id and
// name (and type "function"); later ones only argument text. Concatenating the argument pieces
// of an index gives ToolCall::arguments.
struct ToolCallDelta {
  size_t index = 0;
  std::string id, name;  // non-empty only in the call's first delta
  std::string arguments;
};

struct ToolCallEvents {
  std::string content;  // ordinary text safe to show now
  std::vector<ToolCallDelta> deltas;
};

class ToolCallParser {
 public:
  // id_salt goes into every call id, so that calls in different replies get different ids
  // (the server passes a per-request number); the same salt and text give the same ids.
  explicit ToolCallParser(uint64_t id_salt = 0) : salt_(id_salt) {}

  // Feeds the next piece of generated text.
  ToolCallEvents feed(std::string_view text);
  // The generation ended: flushes held-back text; an unterminated <tool_call> block whose JSON
  // is complete still counts as a call, anything else in it becomes content.
  ToolCallEvents finish();

  // Everything so far (after finish(): the whole reply).
  const std::string& content() const { return content_; }
  const std::vector<ToolCall>& tool_calls() const { return calls_; }
  // Some <tool_call> block was malformed (bad JSON, no name, arguments not an object,
  // unterminated): its text went to content. Deltas it had streamed (a call whose name had
  // been seen) are not retracted; that call is missing from tool_calls().
  bool malformed() const { return malformed_; }

 private:
  // Tracks the top level of a call's JSON as it arrives: where the "name" and "arguments"
  // values start and end. Not a validator; the finished block is parsed with nlohmann::json.
  struct Scan {
    size_t pos = 0;  // bytes of body_ scanned
    int depth = 0;
    bool in_string = false, escape = false;
    enum class Top { Key, Colon, Value, InValue, After } top = Top::Key;
    size_t key_start = 0, value_start = 0;
    std::string key;
    std::optional<std::pair<size_t, size_t>> name, arguments;  // [start, end) in body_
    bool duplicate = false;
  };

  void scan(ToolCallEvents& out);
  void end_value(size_t end);
  void stream_call(ToolCallEvents& out);
  void close_call(ToolCallEvents& out, bool terminated);
  void emit_content(ToolCallEvents& out, std::string_view text);
  std::string call_id(size_t index, const std::string& name) const;

  uint64_t salt_;
  std::string pending_;  // text not yet classified (a possible tag start, held whitespace)
  bool in_call_ = false;
  bool after_call_ = false;  // whitespace right after a block is dropped
  std::string body_;         // the current block's text after <tool_call>
  Scan scan_;
  std::optional<size_t> streamed_index_;  // the current block's index once its name is out
  size_t args_streamed_ = 0;              // bytes of the arguments value already sent
  size_t next_index_ = 0;
  std::string content_;
  std::vector<ToolCall> calls_;
  bool malformed_ = false;
};

}  // namespace strata::decode
