// Byte-level BPE on one pre-tokenized word: every byte starts as its own token, then the adjacent
// pair with the lowest merge rank merges (the leftmost among equal ranks) until no pair has a
// merge. A min-heap over a linked list of symbols makes a word of n bytes O(n log n).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/vocab.h"

namespace strata::tokenizer {

class Bpe {
 public:
  // Indexes the vocab's byte tokens and merges. Throws strata::Error naming what is missing: a
  // byte's token, or a merge whose parts or result are not tokens.
  explicit Bpe(const Vocab& vocab);

  // Appends the ids of `word` (raw bytes, any content) to `out`. Thread-safe; results of short
  // words are cached.
  void encode(std::string_view word, std::vector<uint32_t>& out) const;

 private:
  struct Merge {
    uint32_t rank;
    uint32_t result;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Cache = std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>>;

  static uint64_t pair_key(uint32_t left, uint32_t right) { return uint64_t(left) << 32 | right; }
  void merge_word(std::string_view word, std::vector<uint32_t>& out) const;

  uint32_t byte_token_[256];
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank and merged id
  mutable std::mutex cache_mutex_;
  mutable Cache cache_;
};

}  // namespace strata::tokenizer
