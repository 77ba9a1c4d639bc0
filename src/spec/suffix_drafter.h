// The suffix drafter (prompt lookup): finds the longest suffix of the tokens so far (prompt and
// output) that occurred earlier in them and proposes what followed that earlier occurrence. A
// suffix automaton over the token sequence keeps this O(1) amortized per appended token: the
// longest repeated suffix is the suffix link of the automaton's last state, and each state
// remembers where its strings first ended, which is where the continuation starts.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace strata::spec {

class SuffixDrafter {
 public:
  // Matches shorter than min_match tokens propose nothing (a single repeated token is weak
  // evidence).
  explicit SuffixDrafter(int64_t min_match = 2);

  void reset();
  void append(int32_t token);
  void append(std::span<const int32_t> tokens);

  // Up to max_tokens tokens that followed the first earlier occurrence of the longest repeated
  // suffix; empty when there is none of at least min_match tokens.
  std::vector<int32_t> propose(int64_t max_tokens) const;
  // Length of the longest suffix that occurred earlier (0: none).
  int64_t match_length() const;
  const std::vector<int32_t>& tokens() const { return seq_; }

 private:
  struct Node {
    int32_t len = 0;
    int32_t link = -1;
    int32_t first_end = -1;  // index in seq_ where this state's strings first end
    std::unordered_map<int32_t, int32_t> next;
  };
  int64_t min_match_;
  std::vector<int32_t> seq_;
  std::vector<Node> nodes_;
  int32_t last_ = 0;
};

}  // namespace strata::spec
