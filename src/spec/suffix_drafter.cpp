#include "spec/suffix_drafter.h"

#include <algorithm>

namespace strata::spec {

SuffixDrafter::SuffixDrafter(int64_t min_match) : min_match_(std::max<int64_t>(1, min_match)) {
  reset();
}

void SuffixDrafter::reset() {
  seq_.clear();
  nodes_.assign(1, Node{});
  last_ = 0;
}

void SuffixDrafter::append(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) append(t);
}

// The standard online construction (Blumer et al.): a new state for the whole sequence, then
// walk the suffix links of the previous last state adding the transition, cloning a state when
// its longest string would otherwise be longer than the link requires.
void SuffixDrafter::append(int32_t token) {
  seq_.push_back(token);
  const int32_t cur = int32_t(nodes_.size());
  nodes_.push_back(Node{nodes_[size_t(last_)].len + 1, -1, int32_t(seq_.size()) - 1, {}});
  int32_t p = last_;
  while (p != -1 && !nodes_[size_t(p)].next.contains(token)) {
    nodes_[size_t(p)].next[token] = cur;
    p = nodes_[size_t(p)].link;
  }
  if (p == -1) {
    nodes_[size_t(cur)].link = 0;
  } else {
    const int32_t q = nodes_[size_t(p)].next[token];
    if (nodes_[size_t(p)].len + 1 == nodes_[size_t(q)].len) {
      nodes_[size_t(cur)].link = q;
    } else {
      const int32_t clone = int32_t(nodes_.size());
      Node copy = nodes_[size_t(q)];  // keeps q's transitions, link and first end
      copy.len = nodes_[size_t(p)].len + 1;
      nodes_.push_back(std::move(copy));
      while (p != -1) {
        auto it = nodes_[size_t(p)].next.find(token);
        if (it == nodes_[size_t(p)].next.end() || it->second != q) break;
        it->second = clone;
        p = nodes_[size_t(p)].link;
      }
      nodes_[size_t(q)].link = clone;
      nodes_[size_t(cur)].link = clone;
    }
  }
  last_ = cur;
}

int64_t SuffixDrafter::match_length() const {
  const int32_t u = nodes_[size_t(last_)].link;
  return u <= 0 ? 0 : nodes_[size_t(u)].len;
}

std::vector<int32_t> SuffixDrafter::propose(int64_t max_tokens) const {
  if (match_length() < min_match_ || max_tokens <= 0) return {};
  // The repeated suffix occurs at least twice, so its first end lies before the last token and
  // at least one token follows it.
  const size_t start = size_t(nodes_[size_t(nodes_[size_t(last_)].link)].first_end) + 1;
  const size_t end = std::min(seq_.size(), start + size_t(max_tokens));
  return {seq_.begin() + std::ptrdiff_t(start), seq_.begin() + std::ptrdiff_t(end)};
}

}  // namespace strata::spec
