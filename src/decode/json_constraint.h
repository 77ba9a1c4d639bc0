// Constrained decoding: before each sampling step, JsonConstraint::apply sets the logit of every
// token that cannot continue a document of its JsonGrammar to -inf, and accept() advances it by
// the sampled token. How the mask is computed fast (a byte trie over the vocabulary, walked with
// the automaton, and precomputed string-body token sets) is in docs/CONSTRAINED.md.
//
// Plugs into the generation loop's per-step hooks:
//   logits_filter = [&](std::span<float> logits) { constraint.apply(logits); };
//   on_token      = [&](int32_t id) { constraint.accept(id); };
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decode/json_automaton.h"
#include "decode/json_closing.h"
#include "decode/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace strata::decode {

// What the mask needs to know about a vocabulary, built once per tokenizer (about a tenth of a
// second for Qwen's 151k tokens) and shared by every request.
class JsonVocab {
 public:
  explicit JsonVocab(const tokenizer::Tokenizer& tokenizer);

  size_t size() const { return n_tokens_; }

  // The byte trie over the normal tokens in preorder: node i's subtree is [i, end[i]); node 0
  // is the root (no byte).
  struct Trie {
    std::vector<uint8_t> byte;
    std::vector<uint16_t> depth;
    std::vector<int32_t> token;  // the token ending at the node, or -1
    std::vector<uint32_t> end;
    std::vector<uint8_t> quote_below;  // some token in the subtree holds '"' or '\'
  };
  const Trie& trie() const { return trie_; }

  // Tokens that stay inside a JSON string from UTF-8 state u (no '"', '\', control byte, and
  // valid UTF-8 from there): as a bitset, and sorted by code point count for strings with a
  // maxLength.
  struct TokenChars {
    uint32_t chars;
    int32_t id;
  };
  const std::vector<uint64_t>& body_bits(uint8_t u) const { return body_bits_[u]; }
  const std::vector<TokenChars>& body_by_chars(uint8_t u) const { return body_by_chars_[u]; }

  // Tokens that end generation (eos, <|im_end|>, <|endoftext|>), and the other added tokens
  // that are plain text (<tool_call>, ...) with their text.
  const std::vector<int32_t>& end_tokens() const { return end_tokens_; }
  const std::vector<std::pair<int32_t, std::string>>& text_tokens() const { return text_tokens_; }
  bool is_end(int32_t id) const;
  // The bytes of a token, empty for tokens the mask never allows (control, unused).
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool is_text_token(int32_t id) const { return text_token_[size_t(id)] != 0; }

 private:
  size_t n_tokens_ = 0;
  Trie trie_;
  std::array<std::vector<uint64_t>, 8> body_bits_;
  std::array<std::vector<TokenChars>, 8> body_by_chars_;
  std::vector<int32_t> end_tokens_;
  std::vector<std::pair<int32_t, std::string>> text_tokens_;
  std::vector<std::string> bytes_;
  std::vector<uint8_t> text_token_;
};

class JsonConstraint {
 public:
  // `vocab` must outlive the constraint.
  JsonConstraint(const JsonVocab& vocab, JsonGrammar grammar);
  JsonConstraint(const JsonConstraint&) = delete;
  JsonConstraint& operator=(const JsonConstraint&) = delete;

  // -inf on every token that cannot continue the document (and on ids past the vocabulary, as
  // the model's output may be padded); end tokens only once the document is complete. Under a
  // token budget also on every token after which the shortest completion (JsonClosing) and the
  // end token no longer fit the tokens left; when nothing fits any more (a budget too small
  // from the start), only the tokens that leave the shortest completion. Never masks
  // everything: throws strata::Error if it would (a bug, not a user error).
  void apply(std::span<float> logits) const;

  // How many more tokens may be sampled, the end token included (max_tokens, or what the
  // context has left). Steers the reply to a document that ends within them.
  void set_token_budget(int64_t tokens) { budget_ = tokens; }

  // Advances by a sampled token. Throws strata::Error for a token the grammar forbids (the
  // budget is not checked here).
  void accept(int32_t token);

  // Whether the document could end now (an end token is allowed).
  bool complete() const;
  // Whether an end token has been accepted.
  bool finished() const { return finished_; }

  // Whether the grammar allows a token now, the budget aside; apply() computes all of them at
  // once, faster.
  bool allows(int32_t token) const;

  // Fewest bytes that complete the document after `token` (the best of the live parses), or
  // nullopt when the grammar forbids it; for an end token 0 when the document is complete.
  std::optional<uint32_t> closing_after(int32_t token) const;

 private:
  // Marks the tokens whose shortest completion afterwards is at most `limit` bytes (no limit:
  // every token the grammar allows) and lowers best_ to the shortest completion seen. Returns
  // whether any token was marked.
  bool mark(int64_t limit) const;
  void walk(const Stack& base, bool quotes_only, int64_t limit) const;
  bool feed(Stack s, int32_t token, std::vector<Stack>& out) const;
  void take(int32_t token, const Stack& after, int64_t limit) const;

  const JsonVocab& vocab_;
  JsonGrammar grammar_;
  JsonAutomaton automaton_;
  JsonClosing closing_;
  std::vector<Stack> stacks_;  // the parses still alive
  bool finished_ = false;
  std::optional<int64_t> budget_;  // tokens that may still be sampled

  // Scratch for apply(): the allowed set, the shortest completion among the tokens seen, and
  // one stack per trie depth.
  mutable std::vector<uint64_t> allowed_;
  mutable uint32_t best_ = 0;
  mutable std::vector<Stack> slots_;
  mutable std::vector<std::vector<Stack>> forks_;
  mutable uint64_t steps_ = 0;  // automaton steps of the current apply()
};

}  // namespace strata::decode
