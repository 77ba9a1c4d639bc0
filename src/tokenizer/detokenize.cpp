#include "tokenizer/detokenize.h"

#include <utility>

namespace strata::tokenizer {

namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Bytes in a well-formed sequence led by `lead`, 0 if it cannot lead one (RFC 3629).
int sequence_length(uint8_t lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// The range the byte after `lead` must fall in; it rules out overlongs, surrogates and code
// points past U+10FFFF.
bool valid_second(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return is_continuation(b);
  }
}

}  // namespace

size_t complete_utf8_prefix(std::string_view bytes) {
  const size_t n = bytes.size();
  size_t lead = n;
  while (lead > 0 && n - lead < 3 && is_continuation(uint8_t(bytes[lead - 1]))) --lead;
  if (lead == 0) return n;
  --lead;
  const uint8_t first = uint8_t(bytes[lead]);
  const size_t have = n - lead;
  if (have >= size_t(sequence_length(first))) return n;
  if (have >= 2 && !valid_second(first, uint8_t(bytes[lead + 1]))) return n;
  return lead;
}

std::string StreamDecoder::push(uint32_t id) {
  pending_ += tokenizer_.piece(id);
  const size_t ready = complete_utf8_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() { return std::exchange(pending_, std::string()); }

}  // namespace strata::tokenizer
