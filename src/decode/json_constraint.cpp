#include "decode/json_constraint.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "util/error.h"

namespace strata::decode {

namespace {

// Parses alive at once. Only anyOf alternatives sharing a first byte fork (n tools forced at
// once start n parses), and finished alternatives merge again; past the cap the latest forks are
// dropped, which narrows what the model may write but never lets an invalid document through.
constexpr size_t kMaxStacks = 64;

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

void set_bit(std::vector<uint64_t>& bits, size_t i) { bits[i / 64] |= uint64_t(1) << (i % 64); }

void dedupe(std::vector<Stack>& stacks) {
  std::vector<Stack> unique;
  for (auto& s : stacks)
    if (unique.size() < kMaxStacks && std::find(unique.begin(), unique.end(), s) == unique.end())
      unique.push_back(std::move(s));
  stacks = std::move(unique);
}

std::string describe(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out += char(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    }
  }
  return out;
}

}  // namespace

JsonVocab::JsonVocab(const tokenizer::Tokenizer& tokenizer) : n_tokens_(tokenizer.size()) {
  const auto& vocab = tokenizer.vocab();
  bytes_.resize(n_tokens_);
  text_token_.assign(n_tokens_, 0);
  for (const auto& id : {vocab.eos, vocab.find("<|im_end|>"), vocab.find("<|endoftext|>")})
    if (id && !is_end(int32_t(*id))) end_tokens_.push_back(int32_t(*id));

  std::vector<int32_t> normal;
  for (size_t id = 0; id < n_tokens_; ++id) {
    if (vocab.types[id] == tokenizer::TokenType::Normal) {
      bytes_[id] = tokenizer.piece(uint32_t(id));
      normal.push_back(int32_t(id));
    } else if (vocab.types[id] == tokenizer::TokenType::UserDefined) {
      bytes_[id] = tokenizer.piece(uint32_t(id));
      text_tokens_.emplace_back(int32_t(id), bytes_[id]);
      text_token_[id] = 1;
    }
  }

  // The trie, in preorder, from the tokens sorted by their bytes: each token shares its
  // longest common prefix with the one before it.
  std::sort(normal.begin(), normal.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  auto add_node = [&](uint8_t byte, size_t depth) {
    trie_.byte.push_back(byte);
    trie_.depth.push_back(uint16_t(depth));
    trie_.token.push_back(-1);
    trie_.end.push_back(0);
    trie_.quote_below.push_back(0);
    return uint32_t(trie_.byte.size() - 1);
  };
  std::vector<uint32_t> path = {add_node(0, 0)};
  const std::string* previous = nullptr;
  for (int32_t id : normal) {
    const std::string& b = bytes_[id];
    if (b.size() >= std::numeric_limits<uint16_t>::max())
      fail("vocab: token ", id, " is ", b.size(), " bytes long");
    size_t common = 0;
    if (previous)
      while (common < b.size() && common < previous->size() && b[common] == (*previous)[common]) ++common;
    for (; path.size() > common + 1; path.pop_back()) trie_.end[path.back()] = uint32_t(trie_.byte.size());
    for (size_t k = common; k < b.size(); ++k) path.push_back(add_node(uint8_t(b[k]), k + 1));
    trie_.token[path.back()] = id;
    if (b.find_first_of("\"\\") != std::string::npos)
      for (uint32_t node : path) trie_.quote_below[node] = 1;
    previous = &b;
  }
  for (uint32_t node : path) trie_.end[node] = uint32_t(trie_.byte.size());

  for (uint8_t u = 0; u < 8; ++u) {
    body_bits_[u].assign((n_tokens_ + 63) / 64, 0);
    for (int32_t id : normal) {
      int state = u;
      uint32_t chars = 0;
      for (unsigned char c : bytes_[id]) {
        if (state == 0) ++chars;
        state = c == '"' || c == '\\' || c < 0x20 ? -1 : utf8_step(uint8_t(state), c);
        if (state < 0) break;
      }
      if (state < 0) continue;
      set_bit(body_bits_[u], size_t(id));
      body_by_chars_[u].push_back({chars, id});
    }
    std::stable_sort(body_by_chars_[u].begin(), body_by_chars_[u].end(),
                     [](const TokenChars& a, const TokenChars& b) { return a.chars < b.chars; });
  }
}

bool JsonVocab::is_end(int32_t id) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), id) != end_tokens_.end();
}

JsonConstraint::JsonConstraint(const JsonVocab& vocab, JsonGrammar grammar)
    : vocab_(vocab),
      grammar_(std::move(grammar)),
      automaton_(grammar_),
      closing_(grammar_),
      stacks_{automaton_.start()} {
  const auto& depth = vocab_.trie().depth;
  const size_t deepest = depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end());
  slots_.resize(deepest + 1);
  forks_.resize(deepest + 1);
}

void JsonConstraint::take(int32_t token, const Stack& after, int64_t limit) const {
  if (limit == kNoLimit) {
    set_bit(allowed_, size_t(token));
    return;
  }
  const uint32_t rest = closing_.rest(after);
  best_ = std::min(best_, rest);
  if (int64_t(rest) <= limit) set_bit(allowed_, size_t(token));
}

// Marks every token of the trie that `base` can take (within `limit`), walking the trie in
// preorder and skipping the subtree of any byte the automaton rejects. With quotes_only, `base`
// is inside a string whose quote-free tokens are already marked, so only subtrees holding '"' or
// '\' are visited.
void JsonConstraint::walk(const Stack& base, bool quotes_only, int64_t limit) const {
  const JsonVocab::Trie& t = vocab_.trie();
  slots_[0] = base;
  // A fork (anyOf alternatives sharing the byte) walks its subtree on its own, then the loop
  // goes on with the first alternative.
  auto run = [&](auto& self, uint32_t first, uint32_t last) -> void {
    for (uint32_t i = first; i < last;) {
      if (quotes_only && !t.quote_below[i]) {
        i = t.end[i];
        continue;
      }
      const uint16_t d = t.depth[i];
      Stack& s = slots_[d];
      s = slots_[d - 1];
      std::vector<Stack>& forks = forks_[d];
      forks.clear();
      if (++steps_ > grammar_.limits.max_mask_steps)
        fail("json constraint: a mask took more than ", grammar_.limits.max_mask_steps,
             " automaton steps (the limit); the grammar is too ambiguous to enforce");
      if (!automaton_.step(s, t.byte[i], forks)) {
        i = t.end[i];
        continue;
      }
      if (t.token[i] >= 0) {
        take(t.token[i], s, limit);
        for (const Stack& fork : forks) take(t.token[i], fork, limit);
      }
      if (!forks.empty()) {
        const Stack primary = s;
        for (const Stack& fork : forks) {
          s = fork;
          self(self, i + 1, t.end[i]);
        }
        s = primary;
      }
      ++i;
    }
  };
  run(run, 1, uint32_t(t.byte.size()));
}

bool JsonConstraint::mark(int64_t limit) const {
  allowed_.assign((vocab_.size() + 63) / 64, 0);
  best_ = kUnbounded;
  steps_ = 0;
  if (!finished_) {
    for (const Stack& s : stacks_) {
      uint8_t utf8 = 0;
      uint32_t room = 0;
      // Tokens inside a string change the shortest completion by a few bytes at most (a
      // character cut mid-way needs up to 3 more): they are taken wholesale unless the budget is
      // that close, and then walked one by one.
      const bool in_string = automaton_.string_body(s, utf8, room) &&
                             (limit == kNoLimit || int64_t(closing_.rest(s)) + 3 <= limit);
      if (in_string) {
        const auto& by_chars = vocab_.body_by_chars(utf8);
        if (!by_chars.empty() && room >= by_chars.back().chars) {
          const auto& bits = vocab_.body_bits(utf8);
          for (size_t w = 0; w < bits.size(); ++w) allowed_[w] |= bits[w];
        } else {
          for (const auto& tc : by_chars) {
            if (tc.chars > room) break;
            set_bit(allowed_, size_t(tc.id));
          }
        }
      }
      walk(s, in_string, limit);
      for (const auto& [id, text] : vocab_.text_tokens()) {
        Stack copy = s;
        if (automaton_.step_text(copy, text)) take(id, copy, limit);
      }
    }
  }
  if (finished_ || complete())
    for (int32_t id : vocab_.end_tokens()) set_bit(allowed_, size_t(id));
  return std::any_of(allowed_.begin(), allowed_.end(), [](uint64_t w) { return w != 0; });
}

void JsonConstraint::apply(std::span<float> logits) const {
  // After the next token budget_ - 1 remain, one of them for the end token.
  const int64_t limit = budget_ ? *budget_ - 2 : kNoLimit;
  bool any = mark(limit);
  if (!any && budget_ && best_ != kUnbounded) any = mark(best_);
  if (!any) fail("json constraint: no token can continue the document (", stacks_.size(), " parses)");
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(logits.size(), vocab_.size());
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = allowed_[w];
    if (bits == ~uint64_t(0)) continue;
    const size_t end = std::min(n, w * 64 + 64);
    for (size_t i = w * 64; i < end; ++i)
      if (!(bits >> (i - w * 64) & 1)) logits[i] = minus_inf;
  }
  for (size_t i = n; i < logits.size(); ++i) logits[i] = minus_inf;
}

bool JsonConstraint::feed(Stack s, int32_t token, std::vector<Stack>& out) const {
  if (vocab_.is_text_token(token)) {
    if (!automaton_.step_text(s, vocab_.bytes(token))) return false;
    out.push_back(std::move(s));
    return true;
  }
  const std::string& bytes = vocab_.bytes(token);
  if (bytes.empty()) return false;
  std::vector<Stack> current = {std::move(s)}, next, forks;
  for (char c : bytes) {
    next.clear();
    for (Stack& x : current) {
      forks.clear();
      if (automaton_.step(x, uint8_t(c), forks)) next.push_back(std::move(x));
      for (Stack& f : forks) next.push_back(std::move(f));
    }
    dedupe(next);
    std::swap(current, next);
    if (current.empty()) return false;
  }
  out.insert(out.end(), std::make_move_iterator(current.begin()), std::make_move_iterator(current.end()));
  return true;
}

void JsonConstraint::accept(int32_t token) {
  if (token < 0 || size_t(token) >= vocab_.size())
    fail("json constraint: token ", token, " is outside the vocabulary of ", vocab_.size());
  if (finished_) fail("json constraint: token ", token, " after the end of the document");
  if (vocab_.is_end(token)) {
    if (!complete()) fail("json constraint: end token ", token, " before the document is complete");
    finished_ = true;
    if (budget_) --*budget_;
    return;
  }
  std::vector<Stack> next;
  for (const Stack& s : stacks_) feed(s, token, next);
  dedupe(next);
  if (next.empty())
    fail("json constraint: token ", token, " (\"", describe(vocab_.bytes(token)),
         "\") cannot continue the document");
  stacks_ = std::move(next);
  if (budget_) --*budget_;
}

bool JsonConstraint::complete() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [&](const Stack& s) { return automaton_.can_end(s); });
}

bool JsonConstraint::allows(int32_t token) const {
  if (token < 0 || size_t(token) >= vocab_.size()) return false;
  if (vocab_.is_end(token)) return finished_ || complete();
  if (finished_) return false;
  std::vector<Stack> out;
  for (const Stack& s : stacks_)
    if (feed(s, token, out)) return true;
  return false;
}

std::optional<uint32_t> JsonConstraint::closing_after(int32_t token) const {
  if (token < 0 || size_t(token) >= vocab_.size()) return std::nullopt;
  if (vocab_.is_end(token)) return finished_ || complete() ? std::optional<uint32_t>(0) : std::nullopt;
  if (finished_) return std::nullopt;
  std::vector<Stack> out;
  for (const Stack& s : stacks_) feed(s, token, out);
  if (out.empty()) return std::nullopt;
  uint32_t best = kUnbounded;
  for (const Stack& s : out) best = std::min(best, closing_.rest(s));
  return best;
}

}  // namespace strata::decode
