// Splits a Jinja template into text and the tokens inside {{ }} and {% %}, applying whitespace
// control the way Hugging Face configures Jinja (trim_blocks and lstrip_blocks on,
// keep_trailing_newline off): `-` strips all whitespace on its side, `+` disables lstrip/trim
// for its tag, {# #} comments vanish, {% raw %}...{% endraw %} becomes plain text.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata::chat {

enum class Tok {
  Text,
  ExprOpen,   // {{
  ExprClose,  // }}
  StmtOpen,   // {%
  StmtClose,  // %}
  Name,
  String,  // text holds the unescaped value
  Int,
  Float,
  Op,  // punctuation and operators: + - * / // % ** ~ | . , : ( ) [ ] { } = == != < > <= >=
  End,
};

struct Token {
  Tok type;
  std::string text;
  size_t pos;  // byte offset in the template source
};

// Throws strata::Error "chat template L:C: problem" on an unterminated tag, comment or string,
// or a character that starts no token.
std::vector<Token> tokenize(std::string_view source);

// "line:column" (both from 1; columns count code points) of a byte offset.
std::string location(std::string_view source, size_t pos);

// Throws strata::Error "chat template L:C: message".
[[noreturn]] void syntax_error(std::string_view source, size_t pos, const std::string& message);

}  // namespace strata::chat
