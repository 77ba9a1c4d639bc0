// The text stages before BPE: NFC normalization (utf8proc) and the pre-tokenizer regex (PCRE2)
// that cuts text into words, each of which BPE then encodes on its own.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tokenizer {

// NFC form of valid UTF-8 (Qwen's tokenizer.json normalizer). ASCII is returned as is.
std::string normalize_nfc(std::string_view valid_utf8);

// Splits text with the regex of a tokenizer.ggml.pre name ("qwen2" or "qwen35"; anything else
// throws strata::Error). The regex is Qwen's, with two deliberate spellings (docs/TOKENIZER.md):
// the contractions are ASCII-only as llama.cpp and transformers.js write them, and \s is Unicode
// White_Space, as Hugging Face tokenizers and llama.cpp use it (PCRE2's \s also takes U+180E).
class PreTokenizer {
 public:
  explicit PreTokenizer(std::string_view pre);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the words of `valid_utf8` to `words`, as views into it, in order; together they
  // cover the whole text. Thread-safe. Throws strata::Error if PCRE2 fails (a resource limit).
  void split(std::string_view valid_utf8, std::vector<std::string_view>& words) const;

  // The PCRE2 pattern in use.
  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace strata::tokenizer
