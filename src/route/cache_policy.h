// A simulated per-layer expert cache for replay and calibration: `slots` expert slots, a pinned
// set that is never evicted, and LRU over the rest. One access() is one token's routed experts:
// the hits are the experts resident before the token; misses are loaded and the least recently
// used unpinned experts evicted. This models the arena's slot accounting only (no I/O timing).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata::route {

class LayerCache {
 public:
  // Throws strata::Error unless 1 <= slots <= n_experts.
  LayerCache(int n_experts, int slots);

  // Pins `experts` (at most slots - reserve of them, where reserve is the LRU room a token needs)
  // and returns how many were pinned. Call before fill()/access().
  int pin(std::span<const int32_t> experts, int reserve);
  // Warm start: loads `order` (best first) into the free slots; the first entries end up most
  // recently used. Loads are not counted as misses.
  void fill(std::span<const int32_t> order);

  bool resident(int32_t expert) const { return resident_[size_t(expert)] != 0; }
  // resident()[e] != 0 for each cached expert: the predicate cache-conditional routing reads.
  std::span<const uint8_t> residency() const { return resident_; }

  // One token's experts (distinct, at most the LRU room): returns the hits. Experts are touched in
  // the order given, so after the call they are the most recently used.
  int access(std::span<const int32_t> experts);

  int slots() const { return slots_; }
  int pinned() const { return pinned_; }
  int size() const { return pinned_ + lru_size_; }

 private:
  void unlink(int32_t e);
  void push_front(int32_t e);

  int n_;
  int slots_;
  int pinned_ = 0;
  int lru_size_ = 0;
  std::vector<uint8_t> resident_;
  std::vector<uint8_t> is_pinned_;
  // Doubly linked LRU list over expert ids; head_ is the most recently used.
  std::vector<int32_t> prev_, next_;
  int32_t head_ = -1, tail_ = -1;
};

}  // namespace strata::route
