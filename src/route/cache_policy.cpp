#include "route/cache_policy.h"

#include "util/error.h"

namespace strata::route {

LayerCache::LayerCache(int n_experts, int slots)
    : n_(n_experts),
      slots_(slots),
      resident_(size_t(n_experts), 0),
      is_pinned_(size_t(n_experts), 0),
      prev_(size_t(n_experts), -1),
      next_(size_t(n_experts), -1) {
  if (n_experts < 1) fail("expert cache: ", n_experts, " experts");
  if (slots < 1 || slots > n_experts) fail("expert cache: ", slots, " slots is outside 1..", n_experts, " experts");
}

int LayerCache::pin(std::span<const int32_t> experts, int reserve) {
  const int room = slots_ - lru_size_ - pinned_ - reserve;
  int done = 0;
  for (int32_t e : experts) {
    if (done >= room) break;
    if (e < 0 || e >= n_) fail("expert cache: pinned expert ", e, " is outside 0..", n_ - 1);
    if (resident_[size_t(e)]) continue;
    resident_[size_t(e)] = 1;
    is_pinned_[size_t(e)] = 1;
    ++pinned_;
    ++done;
  }
  return done;
}

void LayerCache::fill(std::span<const int32_t> order) {
  std::vector<int32_t> loaded;
  for (int32_t e : order) {
    if (size() >= slots_) break;
    if (e < 0 || e >= n_) fail("expert cache: fill expert ", e, " is outside 0..", n_ - 1);
    if (resident_[size_t(e)]) continue;
    resident_[size_t(e)] = 1;
    ++lru_size_;
    loaded.push_back(e);
  }
  // The best entry goes in last so it is the most recently used.
  for (auto it = loaded.rbegin(); it != loaded.rend(); ++it) push_front(*it);
}

void LayerCache::unlink(int32_t e) {
  const int32_t p = prev_[size_t(e)], n = next_[size_t(e)];
  (p >= 0 ? next_[size_t(p)] : head_) = n;
  (n >= 0 ? prev_[size_t(n)] : tail_) = p;
  prev_[size_t(e)] = next_[size_t(e)] = -1;
}

void LayerCache::push_front(int32_t e) {
  prev_[size_t(e)] = -1;
  next_[size_t(e)] = head_;
  if (head_ >= 0) prev_[size_t(head_)] = e;
  head_ = e;
  if (tail_ < 0) tail_ = e;
}

int LayerCache::access(std::span<const int32_t> experts) {
  if (int(experts.size()) > slots_ - pinned_)
    fail("expert cache: a token routes ", experts.size(), " experts but only ", slots_ - pinned_,
         " unpinned slots exist");
  int hits = 0;
  for (int32_t e : experts) {
    if (e < 0 || e >= n_) fail("expert cache: expert ", e, " is outside 0..", n_ - 1);
    if (resident_[size_t(e)]) {
      ++hits;
      if (is_pinned_[size_t(e)]) continue;
      unlink(e);
      push_front(e);
      continue;
    }
    if (pinned_ + lru_size_ == slots_) {
      const int32_t victim = tail_;
      unlink(victim);
      resident_[size_t(victim)] = 0;
      --lru_size_;
    }
    resident_[size_t(e)] = 1;
    ++lru_size_;
    push_front(e);
  }
  return hits;
}

}  // namespace strata::route
