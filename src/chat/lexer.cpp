#include "chat/lexer.h"

#include <cctype>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace strata::chat {

std::string location(std::string_view source, size_t pos) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return cat(line, ":", col);
}

void syntax_error(std::string_view source, size_t pos, const std::string& message) {
  fail("chat template ", location(source, pos), ": ", message);
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    // keep_trailing_newline=False: one final newline of the template is dropped.
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    while (true) {
      size_t tag = find_tag(pos);
      std::string_view text = src_.substr(pos, (tag == npos ? src_.size() : tag) - pos);
      if (strip_next_) {
        while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
      } else if (trim_next_ && !text.empty() && text.front() == '\n') {
        text.remove_prefix(1);
      }
      const size_t text_pos = size_t(text.data() - src_.data());
      strip_next_ = trim_next_ = false;
      if (tag == npos) {
        emit_text(text, text_pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
      } else if (kind != '{' && modifier != '+') {
        text = lstrip_block(text, text_pos);
      }
      emit_text(text, text_pos);
      const size_t body = tag + 2 + (modifier == '-' || modifier == '+' ? 1 : 0);
      if (kind == '#') {
        pos = comment(tag, body);
      } else if (kind == '%' && raw_block(tag, body, pos)) {
        continue;
      } else {
        pos = tag_tokens(tag, body, kind);
      }
    }
    tokens_.push_back({Tok::End, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  static constexpr size_t npos = std::string_view::npos;

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != npos && i + 1 < src_.size(); i = src_.find('{', i + 1)) {
      const char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
    }
    return npos;
  }

  void emit_text(std::string_view text, size_t pos) {
    if (!text.empty()) tokens_.push_back({Tok::Text, std::string(text), pos});
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block tag go.
  std::string_view lstrip_block(std::string_view text, size_t text_pos) const {
    const size_t nl = text.rfind('\n');
    const size_t line_start = nl == npos ? 0 : nl + 1;
    if (nl == npos && text_pos != 0 && src_[text_pos - 1] != '\n') return text;
    for (size_t i = line_start; i < text.size(); ++i)
      if (text[i] != ' ' && text[i] != '\t') return text;
    return text.substr(0, line_start);
  }

  // Sets what happens to the text after a closing delimiter with this modifier.
  void after_close(char modifier, bool is_block) {
    if (modifier == '-') strip_next_ = true;
    else if (modifier != '+' && is_block) trim_next_ = true;
  }

  size_t comment(size_t tag, size_t body) {
    const size_t end = src_.find("#}", body);
    if (end == npos) syntax_error(src_, tag, "unterminated comment: '{#' has no matching '#}'");
    after_close(end > body ? src_[end - 1] : '\0', true);
    return end + 2;
  }

  // {% raw %}...{% endraw %}: the content is text, unparsed.
  bool raw_block(size_t tag, size_t body, size_t& pos) {
    size_t p = skip_space(body);
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
    p = skip_space(p + 3);
    const char open_mod = src_[p] == '-' || src_[p] == '+' ? src_[p] : '\0';
    if (open_mod) ++p;
    if (src_.compare(p, 2, "%}") != 0) syntax_error(src_, p, "expected '%}' after 'raw'");
    size_t content = p + 2;
    if (open_mod == '-') content = skip_space(content);
    else if (open_mod != '+' && content < src_.size() && src_[content] == '\n') ++content;
    for (size_t at = src_.find("{%", content); at != npos; at = src_.find("{%", at + 2)) {
      size_t q = at + 2;
      const bool strip_before = q < src_.size() && src_[q] == '-';
      if (strip_before || (q < src_.size() && src_[q] == '+')) ++q;
      q = skip_space(q);
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q = skip_space(q + 6);
      const char close_mod = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : '\0';
      if (close_mod) ++q;
      if (src_.compare(q, 2, "%}") != 0) syntax_error(src_, q, "expected '%}' after 'endraw'");
      std::string_view text = src_.substr(content, at - content);
      if (strip_before)
        while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
      emit_text(text, content);
      after_close(close_mod, true);
      pos = q + 2;
      return true;
    }
    syntax_error(src_, tag, "'{% raw %}' has no matching '{% endraw %}'");
  }

  size_t skip_space(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    return p;
  }

  size_t tag_tokens(size_t tag, size_t p, char kind) {
    const bool expr = kind == '{';
    tokens_.push_back({expr ? Tok::ExprOpen : Tok::StmtOpen, expr ? "{{" : "{%", tag});
    int depth = 0;
    while (true) {
      p = skip_space(p);
      if (p >= src_.size())
        syntax_error(src_, tag, cat("unterminated '", expr ? "{{" : "{%", "': no matching '", expr ? "}}" : "%}", "'"));
      const char c = src_[p];
      const char close = expr ? '}' : '%';
      const char mod = c == '-' || c == '+' ? c : '\0';
      const size_t q = p + (mod ? 1 : 0);
      if (q + 1 < src_.size() && src_[q] == close && src_[q + 1] == '}' && !(expr && (depth > 0 || mod == '+'))) {
        tokens_.push_back({expr ? Tok::ExprClose : Tok::StmtClose, expr ? "}}" : "%}", p});
        after_close(mod, !expr);
        return q + 2;
      }
      if (is_name_start(c)) {
        size_t e = p;
        while (e < src_.size() && is_name_char(src_[e])) ++e;
        tokens_.push_back({Tok::Name, std::string(src_.substr(p, e - p)), p});
        p = e;
      } else if (is_digit(c)) {
        p = number(p);
      } else if (c == '\'' || c == '"') {
        p = string(p);
      } else {
        p = op(p, depth);
      }
    }
  }

  size_t number(size_t p) {
    size_t e = p;
    while (e < src_.size() && is_digit(src_[e])) ++e;
    bool is_float = false;
    const bool after_dot = !tokens_.empty() && tokens_.back().type == Tok::Op && tokens_.back().text == ".";
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      for (++e; e < src_.size() && is_digit(src_[e]);) ++e;
    }
    if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && is_digit(src_[x])) {
        is_float = true;
        for (e = x; e < src_.size() && is_digit(src_[e]);) ++e;
      }
    }
    tokens_.push_back({is_float ? Tok::Float : Tok::Int, std::string(src_.substr(p, e - p)), p});
    return e;
  }

  // Python string literal escapes; an unknown escape keeps its backslash, as Python does.
  size_t string(size_t start) {
    const char quote = src_[start];
    std::string value;
    size_t p = start + 1;
    while (true) {
      if (p >= src_.size()) syntax_error(src_, start, "unterminated string literal");
      const char c = src_[p++];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (p >= src_.size()) syntax_error(src_, start, "unterminated string literal");
      const char e = src_[p++];
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '0': value += '\0'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t i = 0; i < n; ++i, ++p) {
            if (p >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[p])))
              syntax_error(src_, p, cat("invalid \\", e, " escape: expected ", n, " hex digits"));
            const char h = src_[p];
            cp = cp * 16 + uint32_t(is_digit(h) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF) syntax_error(src_, p, "escape beyond U+10FFFF");
          tokenizer::utf8::append(value, cp);
          break;
        }
        default:
          value += '\\';
          value += e;
      }
    }
    tokens_.push_back({Tok::String, std::move(value), start});
    return p;
  }

  size_t op(size_t p, int& depth) {
    static constexpr std::string_view two[] = {"**", "//", "==", "!=", "<=", ">="};
    for (std::string_view t : two)
      if (src_.compare(p, 2, t) == 0) {
        tokens_.push_back({Tok::Op, std::string(t), p});
        return p + 2;
      }
    const char c = src_[p];
    if (std::string_view("+-*/%~|.,:()[]{}=<>").find(c) == npos) {
      const bool printable = static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
      syntax_error(src_, p, printable ? cat("unexpected character '", c, "'")
                                      : cat("unexpected byte 0x", std::hex, int(static_cast<unsigned char>(c))));
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
    tokens_.push_back({Tok::Op, std::string(1, c), p});
    return p + 1;
  }

  std::string_view src_;
  std::vector<Token> tokens_;
  bool strip_next_ = false;  // a `-` closed the last tag: strip the next text's leading whitespace
  bool trim_next_ = false;   // trim_blocks: drop one newline after a block or comment tag
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace strata::chat
