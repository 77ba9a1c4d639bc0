#include "decode/tool_calls.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include <xxhash.h>
#include <nlohmann/json.hpp>

namespace strata::decode {

namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Length of the longest suffix of `text` that is a proper prefix of `tag`: text that may turn
// into the tag once more arrives.
size_t partial_tag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

std::optional<std::string> json_string(std::string_view text) {
  const auto v = nlohmann::json::parse(text, nullptr, false);
  if (!v.is_string()) return std::nullopt;
  return v.get<std::string>();
}

}  // namespace

std::string ToolCallParser::call_id(size_t index, const std::string& name) const {
  const uint64_t h = XXH64(name.data(), name.size(), salt_ * 0x9E3779B97F4A7C15ull + index);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return "call_" + std::string(hex);
}

void ToolCallParser::emit_content(ToolCallEvents& out, std::string_view text) {
  if (after_call_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    after_call_ = false;
  }
  out.content += text;
  content_ += text;
}

ToolCallEvents ToolCallParser::feed(std::string_view text) {
  ToolCallEvents out;
  pending_ += text;
  for (;;) {
    if (!in_call_) {
      const size_t open = pending_.find(kOpen);
      if (open == std::string::npos) {
        // Hold back a possible tag start and trailing whitespace, which is dropped if a block
        // follows.
        size_t safe = pending_.size() - partial_tag(pending_, kOpen);
        while (safe > 0 && is_space(pending_[safe - 1])) --safe;
        emit_content(out, std::string_view(pending_).substr(0, safe));
        pending_.erase(0, safe);
        return out;
      }
      std::string_view before = std::string_view(pending_).substr(0, open);
      while (!before.empty() && is_space(before.back())) before.remove_suffix(1);
      emit_content(out, before);
      pending_.erase(0, open + kOpen.size());
      in_call_ = true;
      body_.clear();
      scan_ = Scan{};
      streamed_index_.reset();
      args_streamed_ = 0;
      continue;
    }
    const size_t close = pending_.find(kClose);
    const size_t take = close == std::string::npos ? pending_.size() - partial_tag(pending_, kClose) : close;
    body_.append(pending_, 0, take);
    pending_.erase(0, close == std::string::npos ? take : take + kClose.size());
    scan(out);
    if (close == std::string::npos) return out;
    close_call(out, true);
    in_call_ = false;
  }
}

ToolCallEvents ToolCallParser::finish() {
  ToolCallEvents out;
  if (in_call_) {
    body_ += pending_;
    pending_.clear();
    scan(out);
    close_call(out, false);
    in_call_ = false;
  }
  emit_content(out, pending_);
  pending_.clear();
  return out;
}

void ToolCallParser::end_value(size_t end) {
  Scan& s = scan_;
  const auto key = json_string(s.key);
  auto* slot = key == "name" ? &s.name : key == "arguments" ? &s.arguments : nullptr;
  if (slot) {
    // A repeated key makes the block malformed; the first value stays, so what streamed of it
    // stays consistent however the text was cut.
    if (*slot) s.duplicate = true;
    else *slot = std::make_pair(s.value_start, end);
  }
  s.top = Scan::Top::After;
}

void ToolCallParser::scan(ToolCallEvents& out) {
  Scan& s = scan_;
  using Top = Scan::Top;
  const auto scalar_value = [&] {
    const char first = body_[s.value_start];
    return first != '"' && first != '{' && first != '[';
  };
  for (; s.pos < body_.size(); ++s.pos) {
    const char c = body_[s.pos];
    if (s.in_string) {
      if (s.escape) {
        s.escape = false;
      } else if (c == '\\') {
        s.escape = true;
      } else if (c == '"') {
        s.in_string = false;
        if (s.depth == 1 && s.top == Top::Key) {
          s.key = body_.substr(s.key_start, s.pos + 1 - s.key_start);
          s.top = Top::Colon;
        } else if (s.depth == 1 && s.top == Top::InValue) {
          end_value(s.pos + 1);
        }
      }
      continue;
    }
    const bool value_starts = s.depth == 1 && s.top == Top::Value && !is_space(c);
    if (value_starts) {
      s.value_start = s.pos;
      s.top = Top::InValue;
    }
    switch (c) {
      case '"':
        s.in_string = true;
        if (s.depth == 1 && s.top == Top::Key) s.key_start = s.pos;
        break;
      case '{':
      case '[':
        ++s.depth;
        break;
      case '}':
      case ']':
        if (s.depth == 1 && s.top == Top::InValue) end_value(s.pos);
        --s.depth;
        if (s.depth == 1 && s.top == Top::InValue) end_value(s.pos + 1);
        break;
      case ',':
        if (s.depth != 1) break;
        if (s.top == Top::InValue) end_value(s.pos);
        s.top = Top::Key;
        break;
      case ':':
        if (s.depth == 1 && s.top == Top::Colon) s.top = Top::Value;
        break;
      default:
        if (is_space(c) && s.depth == 1 && s.top == Top::InValue && scalar_value()) end_value(s.pos);
        break;
    }
  }
  stream_call(out);
}

// Sends what is known of the current block: its id and name once the name value is complete,
// then the arguments object's text as it arrives.
void ToolCallParser::stream_call(ToolCallEvents& out) {
  const Scan& s = scan_;
  if (!streamed_index_) {
    // Not held back for a duplicate key: cut into pieces, the name would have gone out before the
    // duplicate arrived, and whether a block takes an index must not depend on the cut.
    if (!s.name) return;
    const auto name =
        json_string(std::string_view(body_).substr(s.name->first, s.name->second - s.name->first));
    if (!name) return;
    streamed_index_ = next_index_++;
    out.deltas.push_back({*streamed_index_, call_id(*streamed_index_, *name), *name, ""});
  }
  size_t start = 0, end = 0;
  if (s.arguments) {
    std::tie(start, end) = *s.arguments;
  } else if (s.top == Scan::Top::InValue && json_string(s.key) == "arguments") {
    start = s.value_start;
    end = s.pos;
  } else {
    return;
  }
  if (body_[start] != '{' || end <= start + args_streamed_) return;
  out.deltas.push_back(
      {*streamed_index_, "", "", body_.substr(start + args_streamed_, end - start - args_streamed_)});
  args_streamed_ = end - start;
}

void ToolCallParser::close_call(ToolCallEvents& out, bool terminated) {
  const auto call = nlohmann::json::parse(body_, nullptr, false);
  std::optional<std::string> arguments;
  const bool named =
      call.is_object() && call.contains("name") && call["name"].is_string() && !scan_.duplicate;
  if (named) {
    const auto args = call.find("arguments");
    if (args == call.end() || args->is_null()) {
      arguments = "{}";
    } else if (args->is_object()) {
      arguments = scan_.arguments
                      ? body_.substr(scan_.arguments->first, scan_.arguments->second - scan_.arguments->first)
                      : args->dump();
    } else if (args->is_string() &&
               nlohmann::json::parse(args->get<std::string>(), nullptr, false).is_object()) {
      // Some models write the arguments as a JSON string, as OpenAI's API carries them.
      arguments = args->get<std::string>();
    }
  }
  if (!arguments) {
    malformed_ = true;
    after_call_ = false;
    const std::string text = std::string(kOpen) + body_ + (terminated ? std::string(kClose) : "");
    emit_content(out, text);
    return;
  }
  const std::string name = call["name"].get<std::string>();
  const size_t index = streamed_index_ ? *streamed_index_ : next_index_++;
  const std::string id = call_id(index, name);
  if (!streamed_index_) {
    out.deltas.push_back({index, id, name, *arguments});
  } else if (args_streamed_ < arguments->size()) {
    // Only an arguments object streams as it arrives; other forms go out whole here.
    out.deltas.push_back({index, "", "", arguments->substr(args_streamed_)});
  }
  calls_.push_back({index, id, name, *arguments});
  after_call_ = true;
}

}  // namespace strata::decode
