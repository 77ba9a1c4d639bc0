#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "tokenizer/vocab.h"
#include "util/error.h"

namespace strata::tokenizer {

namespace {

// Unicode White_Space, for \s: PCRE2's own \s adds U+180E, which Unicode dropped from it.
#define WS R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})"

// tokenizer.json's Split regexes for Qwen2/Qwen3 and Qwen3.5, with (?i:'s|...) spelled out in
// ASCII and \s, \S as [WS], [^WS] (see the header).
constexpr const char* kQwen2 =
    R"('(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))"
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+)"
    R"(|\p{N})"
    R"(| ?[^)" WS R"(\p{L}\p{N}]+[\r\n]*)"
    R"(|[)" WS R"(]*[\r\n]+)"
    R"(|[)" WS R"(]+(?![^)" WS R"(]))"
    R"(|[)" WS R"(]+)";
constexpr const char* kQwen35 =
    R"('(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))"
    R"(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+)"
    R"(|\p{N})"
    R"(| ?[^)" WS R"(\p{L}\p{M}\p{N}]+[\r\n]*)"
    R"(|[)" WS R"(]*[\r\n]+)"
    R"(|[)" WS R"(]+(?![^)" WS R"(]))"
    R"(|[)" WS R"(]+)";

#undef WS

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string normalize_nfc(std::string_view valid_utf8) {
  bool ascii = true;
  for (char c : valid_utf8) ascii &= uint8_t(c) < 0x80;
  if (ascii) return std::string(valid_utf8);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid_utf8.data()),
                   utf8proc_ssize_t(valid_utf8.size()), &out, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) fail("NFC normalization: ", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return result;
}

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string_view pre) : compiled_(std::make_unique<Compiled>()) {
  if (pre == kPreQwen2) {
    pattern_ = kQwen2;
  } else if (pre == kPreQwen35) {
    pattern_ = kQwen35;
  } else {
    fail("tokenizer: pre-tokenizer \"", pre, "\" is not supported (known: ", kPreQwen2, ", ",
         kPreQwen35, ")");
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &error, &offset, nullptr);
  if (!compiled_->code)
    fail("tokenizer: pre-tokenizer regex: ", pcre2_message(error), " at offset ", offset);
  // JIT is an optimisation only: where it is unavailable pcre2_match interprets the pattern.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr), &pcre2_match_data_free);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  // Every character starts a match of the Qwen regexes (their alternatives cover all classes), so
  // the pattern is compiled anchored: each match starts where the last one ended, as a search
  // would, and the words tile the text.
  while (pos < text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                               match.get(), nullptr);
    if (rc < 0) fail("tokenizer: pre-tokenizer regex at byte ", pos, ": ", pcre2_message(rc));
    const size_t end = pcre2_get_ovector_pointer(match.get())[1];
    if (end <= pos) fail("tokenizer: pre-tokenizer regex matched nothing at byte ", pos);
    words.push_back(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace strata::tokenizer
