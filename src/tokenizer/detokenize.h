// Streaming detokenization: token ids arrive one at a time (generation), text must leave as
// whole UTF-8 characters, and a character's bytes may be split over several byte-level tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

// The length of the longest prefix of `bytes` that does not end inside a character that the
// following bytes could still complete: a trailing lead byte and its continuation bytes so far,
// if they form the start of a valid sequence. Anything else (ASCII, whole characters, bytes that
// can never become valid UTF-8) counts as complete.
size_t complete_utf8_prefix(std::string_view bytes);

// Decodes ids piece by piece: push() returns only bytes that end on a complete character,
// holding back the start of a multi-byte character until the token that completes it; flush()
// returns what is held. The concatenation of every push() and the final flush() equals
// Tokenizer::decode() of all the ids, invalid UTF-8 included.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Throws strata::Error on an id outside the vocab; nothing is consumed then.
  std::string push(uint32_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace strata::tokenizer
