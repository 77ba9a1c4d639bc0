#include "experts/arena.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "util/error.h"
#include "util/progress.h"

namespace strata::experts {

uint64_t parse_byte_size(std::string_view text) {
  const std::string s(text);
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(s, &used);
  } catch (const std::exception&) {
    fail("'", s, "' is not a size (examples: 8G, 512M, 1.5G, 65536)");
  }
  std::string unit = s.substr(used);
  for (char& ch : unit) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  double scale = 1;
  if (unit == "K")
    scale = 1024.0;
  else if (unit == "M")
    scale = 1024.0 * 1024;
  else if (unit == "G")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    fail("'", s, "' has an unknown unit '", s.substr(used), "' (use K, M, G or T)");
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 0 || bytes >= 1.8e19)
    fail("'", s, "' is not a size in range (examples: 8G, 512M)");
  return uint64_t(bytes);
}

uint64_t default_expert_budget(uint64_t trunk_bytes) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  bool found = false;
  while (meminfo >> key) {
    if (key == "MemAvailable:") {
      found = bool(meminfo >> kib);
      break;
    }
    meminfo.ignore(1 << 12, '\n');
  }
  if (!found)
    fail("/proc/meminfo has no MemAvailable; give the expert cache a size with --expert-budget");
  const uint64_t available = kib * 1024;
  const uint64_t margin = std::max<uint64_t>(uint64_t(1) << 30, available / 10);
  if (available <= trunk_bytes + margin) return 0;
  return available - trunk_bytes - margin;
}

Arena::Arena(const Options& o)
    : n_layers_(o.n_layers),
      n_experts_(o.n_experts),
      slot_bytes_((o.slot_bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment),
      n_slots_(o.n_slots),
      reserve_(o.reserve) {
  if (n_layers_ < 1 || n_experts_ < 1 || o.slot_bytes == 0 || n_slots_ == 0)
    fail("expert arena: bad shape (", n_layers_, " layers, ", n_experts_, " experts, ", n_slots_,
         " slots of ", o.slot_bytes, " bytes)");
  if (reserve_ >= n_slots_)
    fail("expert arena: a reserve of ", reserve_, " slots leaves none of the ", n_slots_,
         " for experts");
  if (n_slots_ > size_t(INT32_MAX)) fail("expert arena: ", n_slots_, " slots is too many");
  smap_.assign(size_t(n_layers_) * size_t(n_experts_), kMiss);
  slots_.resize(n_slots_);
  for (size_t s = 0; s < n_slots_; ++s) free_.push_back(int32_t(s));
}

size_t Arena::index(int layer, int expert) const {
  if (layer < 0 || layer >= n_layers_ || expert < 0 || expert >= n_experts_)
    fail("expert arena: (layer ", layer, ", expert ", expert, ") is outside ", n_layers_,
         " layers x ", n_experts_, " experts");
  return size_t(layer) * size_t(n_experts_) + size_t(expert);
}

void Arena::link_front(int32_t s) {
  Slot& x = slots_[size_t(s)];
  x.prev = kMiss;
  x.next = lru_head_;
  if (lru_head_ != kMiss) slots_[size_t(lru_head_)].prev = s;
  lru_head_ = s;
  if (lru_tail_ == kMiss) lru_tail_ = s;
}

void Arena::unlink(int32_t s) {
  Slot& x = slots_[size_t(s)];
  if (x.prev != kMiss)
    slots_[size_t(x.prev)].next = x.next;
  else
    lru_head_ = x.next;
  if (x.next != kMiss)
    slots_[size_t(x.next)].prev = x.prev;
  else
    lru_tail_ = x.prev;
  x.prev = x.next = kMiss;
}

void Arena::touch(int32_t s) {
  if (slots_[size_t(s)].pinned || lru_head_ == s) return;
  unlink(s);
  link_front(s);
}

void Arena::hold(int32_t s) {
  Slot& x = slots_[size_t(s)];
  if (x.held) return;
  x.held = true;
  held_.push_back(s);
}

void Arena::release_holds() {
  for (int32_t s : held_) slots_[size_t(s)].held = false;
  held_.clear();
}

int32_t Arena::victim() const {
  for (int32_t s = lru_tail_; s != kMiss; s = slots_[size_t(s)].prev)
    if (!slots_[size_t(s)].held) return s;
  return kMiss;
}

void Arena::evict(int32_t s) {
  Slot& x = slots_[size_t(s)];
  unlink(s);
  smap_[index(x.key.layer, x.key.expert)] = kMiss;
  x.used = false;
  --resident_;
  ++evictions_;
  limbo_.push_back(s);
}

void Arena::retire_limbo(const Settle& settle) {
  for (int32_t s : limbo_) {
    if (settle) settle(s);
    free_.push_back(s);
  }
  limbo_.clear();
}

int32_t Arena::assign(int layer, int expert, const Settle& settle) {
  const size_t at = index(layer, expert);
  if (smap_[at] != kMiss)
    fail("expert arena: (layer ", layer, ", expert ", expert, ") is already in slot ", smap_[at]);
  if (free_.empty() && !limbo_.empty()) {
    ++early_retirements_;
    retire_limbo(settle);
  }
  if (free_.empty()) {
    const int32_t v = victim();
    if (v == kMiss) return kMiss;
    evict(v);
    ++early_retirements_;
    retire_limbo(settle);
  }
  const int32_t s = free_.front();
  free_.pop_front();
  Slot& x = slots_[size_t(s)];
  x.key = {int32_t(layer), int32_t(expert)};
  x.used = true;
  smap_[at] = s;
  link_front(s);
  ++resident_;
  while (resident_ > n_slots_ - reserve_) {
    const int32_t v = victim();
    if (v == kMiss || v == s) break;
    evict(v);
  }
  return s;
}

void Arena::drop(int32_t s) {
  Slot& x = slots_[size_t(s)];
  if (!x.used) fail("expert arena: slot ", s, " holds no expert");
  if (x.pinned) {
    x.pinned = false;
    --pinned_;
  } else {
    unlink(s);
  }
  if (x.held) {
    x.held = false;
    held_.erase(std::find(held_.begin(), held_.end(), s));
  }
  smap_[index(x.key.layer, x.key.expert)] = kMiss;
  x.used = false;
  --resident_;
  free_.push_front(s);
}

void Arena::pin(int32_t s) {
  Slot& x = slots_[size_t(s)];
  if (!x.used) fail("expert arena: slot ", s, " holds no expert to pin");
  if (x.pinned) return;
  unlink(s);
  x.pinned = true;
  ++pinned_;
}

void Arena::end_window(const Settle& settle) { retire_limbo(settle); }

}  // namespace strata::experts
