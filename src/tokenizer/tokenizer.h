// Text <-> token ids for a byte-level BPE vocabulary (every Qwen model), matching Hugging Face's
// tokenizer for Qwen's tokenizer.json and llama.cpp for its GGUF metadata. docs/TOKENIZER.md
// describes the pipeline and every choice where the references leave room.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace strata::tokenizer {

class Bpe;
class PreTokenizer;

class Tokenizer {
 public:
  // Throws strata::Error on a vocab it cannot run: an unknown pre-tokenizer (Vocab::pre), a
  // missing byte token, a merge naming tokens the vocab lacks.
  explicit Tokenizer(Vocab vocab);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text (any bytes) -> ids. Added tokens are cut out first by exact text, leftmost then
  // longest: user-defined ones (<think>) always, control ones (<|im_start|>) only when
  // parse_special. Each stretch between them is NFC-normalized, split by the pre-tokenizer
  // regex, and each word BPE-encoded. Bytes that are not valid UTF-8 are kept, each as its byte
  // token, and split the text around them like an added token does, so decode gives them back.
  // No BOS/EOS is added (Qwen adds none). Thread-safe.
  std::vector<uint32_t> encode(std::string_view text, bool parse_special = true) const;

  // Ids -> bytes: normal tokens through the byte-level mapping, added tokens as their text. The
  // result is the text encode() was given (after NFC) whenever the ids came from encode().
  // Throws strata::Error on an id outside the vocab.
  std::string decode(std::span<const uint32_t> ids) const;
  // The bytes of one token (not always valid UTF-8 on its own). Throws like decode().
  const std::string& piece(uint32_t id) const;

  const Vocab& vocab() const { return vocab_; }
  size_t size() const { return vocab_.size(); }

 private:
  struct Added {
    std::string text;
    uint32_t id;
    bool control;
  };
  void encode_text(std::string_view text, std::vector<uint32_t>& ids) const;
  void encode_valid(std::string_view text, std::vector<uint32_t>& ids) const;

  Vocab vocab_;
  std::vector<std::string> pieces_;  // id -> bytes
  std::vector<Added> added_;         // longest first
  bool added_first_byte_[256] = {};
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<Bpe> bpe_;
};

}  // namespace strata::tokenizer
