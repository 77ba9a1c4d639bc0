#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace strata::tokenizer {

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
  // The loaders have run check_vocab(); Bpe checks the merges. What is left to check is what
  // this class indexes by.
  if (vocab_.types.size() != vocab_.size())
    fail("tokenizer: ", vocab_.size(), " tokens but ", vocab_.types.size(), " token types");
  pieces_.reserve(vocab_.size());
  for (uint32_t id = 0; id < vocab_.size(); ++id) {
    const std::string& token = vocab_.tokens[id];
    const TokenType type = vocab_.types[id];
    if (type == TokenType::Control || type == TokenType::UserDefined) {
      // Added tokens are plain text, not byte-level.
      if (token.empty()) fail("tokenizer: added token ", id, " is empty");
      pieces_.push_back(token);
      added_.push_back({token, id, type == TokenType::Control});
      added_first_byte_[uint8_t(token[0])] = true;
    } else {
      // A token outside the byte-level alphabet ([PAD5] fillers are inside it) decodes as its text.
      pieces_.push_back(token_to_bytes(token).value_or(token));
    }
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const Added& a, const Added& b) { return a.text.size() > b.text.size(); });
  pre_ = std::make_unique<PreTokenizer>(vocab_.pre);
  bpe_ = std::make_unique<Bpe>(vocab_);
}

Tokenizer::~Tokenizer() = default;

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const Added* found = nullptr;
    if (added_first_byte_[uint8_t(text[pos])]) {
      const std::string_view rest = text.substr(pos);
      for (const Added& a : added_) {
        if ((parse_special || !a.control) && rest.starts_with(a.text)) {
          found = &a;
          break;
        }
      }
    }
    if (!found) {
      ++pos;
      continue;
    }
    encode_text(text.substr(start, pos - start), ids);
    ids.push_back(found->id);
    pos += found->text.size();
    start = pos;
  }
  encode_text(text.substr(start), ids);
  return ids;
}

void Tokenizer::encode_text(std::string_view text, std::vector<uint32_t>& ids) const {
  size_t run = 0;
  for (size_t pos = 0; pos < text.size();) {
    if (uint8_t(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t at = pos;
    if (utf8::next(text, pos) != utf8::kInvalid) continue;
    encode_valid(text.substr(run, at - run), ids);
    bpe_->encode(text.substr(at, 1), ids);
    run = pos;
  }
  encode_valid(text.substr(run), ids);
}

void Tokenizer::encode_valid(std::string_view text, std::vector<uint32_t>& ids) const {
  if (text.empty()) return;
  const std::string normalized = normalize_nfc(text);
  std::vector<std::string_view> words;
  pre_->split(normalized, words);
  for (std::string_view word : words) bpe_->encode(word, ids);
}

const std::string& Tokenizer::piece(uint32_t id) const {
  if (id >= pieces_.size())
    fail("tokenizer: token id ", id, " is out of range (the vocab has ", pieces_.size(), " tokens)");
  return pieces_[id];
}

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string text;
  for (uint32_t id : ids) text += piece(id);
  return text;
}

}  // namespace strata::tokenizer
