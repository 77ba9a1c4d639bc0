#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "util/error.h"

namespace strata::tokenizer {

namespace {

// Words at most this long are cached; the cache is emptied when it reaches kCacheEntries, which
// bounds its memory whatever the input.
constexpr size_t kCacheWordBytes = 128;
constexpr size_t kCacheEntries = size_t(1) << 17;

constexpr uint32_t kDead = UINT32_MAX;

struct Symbol {
  uint32_t id;
  int32_t prev, next;
};

struct Candidate {
  uint32_t rank;
  int32_t left, right;
  uint32_t left_id, right_id, result;
  // The heap's top is the lowest rank, then the leftmost pair.
  bool operator<(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

}  // namespace

Bpe::Bpe(const Vocab& vocab) {
  std::unordered_map<std::string_view, uint32_t> id_of;
  id_of.reserve(vocab.size());
  for (uint32_t id = 0; id < vocab.size(); ++id) id_of.emplace(vocab.tokens[id], id);
  const auto find = [&](std::string_view token) {
    const auto it = id_of.find(token);
    return it == id_of.end() ? kDead : it->second;
  };
  for (int b = 0; b < 256; ++b) {
    byte_token_[b] = find(bytes_to_token(std::string(1, char(b))));
    if (byte_token_[b] == kDead) fail("tokenizer: the vocab has no token for byte ", b);
  }
  merges_.reserve(vocab.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) fail("tokenizer: merge ", rank, " \"", merge, "\" is not \"a b\"");
    const std::string_view left(merge.data(), space), right(merge.data() + space + 1, merge.size() - space - 1);
    joined.assign(left).append(right);
    const uint32_t a = find(left), b = find(right), ab = find(joined);
    if (a == kDead || b == kDead || ab == kDead)
      fail("tokenizer: merge ", rank, " \"", merge, "\" names a token the vocab lacks");
    merges_.emplace(pair_key(a, b), Merge{uint32_t(rank), ab});
  }
}

void Bpe::encode(std::string_view word, std::vector<uint32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_token_[uint8_t(word[0])]);
    return;
  }
  if (word.size() > kCacheWordBytes) {
    merge_word(word, out);
    return;
  }
  {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() >= kCacheEntries) cache_.clear();
  cache_.emplace(std::string(word), std::vector<uint32_t>(out.begin() + long(first), out.end()));
}

void Bpe::merge_word(std::string_view word, std::vector<uint32_t>& out) const {
  const int32_t n = int32_t(word.size());
  std::vector<Symbol> symbols(word.size());
  for (int32_t i = 0; i < n; ++i)
    symbols[size_t(i)] = {byte_token_[uint8_t(word[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<Candidate> heap;
  const auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t a = symbols[size_t(left)].id, b = symbols[size_t(right)].id;
    if (const auto it = merges_.find(pair_key(a, b)); it != merges_.end())
      heap.push({it->second.rank, left, right, a, b, it->second.result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[size_t(c.left)];
    Symbol& right = symbols[size_t(c.right)];
    // Stale: one side merged since the pair was queued (ids only ever change by merging).
    if (left.id != c.left_id || left.next != c.right || right.id != c.right_id) continue;
    left.id = c.result;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = c.left;
    right.id = kDead;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }
  for (int32_t i = 0; i >= 0; i = symbols[size_t(i)].next) out.push_back(symbols[size_t(i)].id);
}

}  // namespace strata::tokenizer
