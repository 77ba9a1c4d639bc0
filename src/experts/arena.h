// The expert arena: the bookkeeping of a fixed byte budget cut into equal slots, each able to hold
// one pack record: which (layer, expert) sits in which slot (docs/DESIGN.md, "Expert arena, tiers
// and I/O"; docs/EXPERT_CACHE.md). The slots' memory belongs to the backend
// (backend::ExpertSlots: host memory on the CPU, device memory on CUDA); this bookkeeping is the
// same for every backend.
//
// - smap[layer][expert] = slot or kMiss: the table the kernels' weights are built from.
// - LRU over the resident, unpinned slots; a pinned hot set that is never evicted; "held" slots
//   (the experts a group of routed pairs is computing from) are never evicted either.
// - Limbo: an evicted slot is not reused at once. It waits in limbo until the window boundary
//   (end_window), then retires to the free list in eviction order, after the owner settled any
//   read still landing in it. A window that needs more slots than the free list holds retires
//   limbo early, at the allocation that found the free list empty: a point fixed by the sequence
//   of routings, never by I/O timing, so where each expert lands is deterministic.
// - `reserve` slots are kept out of the LRU's reach (free or in limbo) once the arena is full, so
//   a window's misses usually take slots freed in earlier windows.
//
// Bookkeeping only: no I/O and no memory of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string_view>
#include <vector>

namespace strata::experts {

struct ExpertKey {
  int32_t layer = 0;
  int32_t expert = 0;
  bool operator==(const ExpertKey&) const = default;
};

// "8G", "512M", "1.5G", "64K", "4096" (bytes; K/M/G/T are powers of 1024, an optional trailing
// "B" or "iB" is accepted). Throws strata::Error quoting the text.
uint64_t parse_byte_size(std::string_view text);

// The default budget: MemAvailable (from /proc/meminfo) minus the trunk minus a margin of
// max(1 GiB, MemAvailable / 10) for activations, the KV cache and the rest of the system.
// 0 when that leaves nothing. Throws when /proc/meminfo has no MemAvailable.
uint64_t default_expert_budget(uint64_t trunk_bytes);

class Arena {
 public:
  static constexpr int32_t kMiss = -1;
  static constexpr size_t kSlotAlignment = 4096;

  struct Options {
    int n_layers = 0;
    int n_experts = 0;
    size_t slot_bytes = 0;  // rounded up to kSlotAlignment
    size_t n_slots = 0;
    size_t reserve = 0;  // < n_slots
  };
  // Throws strata::Error on a bad shape.
  explicit Arena(const Options& options);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Receives each slot about to leave limbo for the free list; the owner cancels or waits for
  // any read still writing into it.
  using Settle = std::function<void(int32_t slot)>;

  size_t n_slots() const { return n_slots_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t reserve() const { return reserve_; }

  int32_t slot_of(int layer, int expert) const { return smap_[index(layer, expert)]; }
  ExpertKey key_of(int32_t slot) const { return slots_[size_t(slot)].key; }
  bool pinned(int32_t slot) const { return slots_[size_t(slot)].pinned; }

  // A hit: the slot becomes the most recently used.
  void touch(int32_t slot);
  // Held slots are never evicted until release_holds().
  void hold(int32_t slot);
  void release_holds();
  size_t held() const { return held_.size(); }

  // Gives (layer, expert), which must be a miss, a slot and makes it the most recently used:
  // a free slot; else limbo retires early and a free slot is taken; else the least recently used
  // unheld, unpinned slot is evicted and retired at once. Then, while more than
  // n_slots - reserve experts are resident, least recently used ones are evicted into limbo.
  // Returns kMiss when every slot is held or pinned.
  int32_t assign(int layer, int expert, const Settle& settle);
  // Removes a resident expert whose bytes never became valid (its read failed): the slot goes
  // straight back to the free list. The owner has no read in flight into it.
  void drop(int32_t slot);
  // Pins a resident slot (it leaves the LRU for good).
  void pin(int32_t slot);

  // The window boundary: limbo retires to the free list in eviction order.
  void end_window(const Settle& settle);

  size_t resident() const { return resident_; }
  size_t pinned_count() const { return pinned_; }
  size_t free_count() const { return free_.size(); }
  size_t limbo_count() const { return limbo_.size(); }
  uint64_t evictions() const { return evictions_; }
  uint64_t early_retirements() const { return early_retirements_; }

 private:
  struct Slot {
    ExpertKey key;
    bool used = false;  // holds an expert (resident)
    bool pinned = false;
    bool held = false;
    int32_t prev = kMiss, next = kMiss;  // LRU links (resident, unpinned slots only)
  };

  size_t index(int layer, int expert) const;
  void link_front(int32_t slot);
  void unlink(int32_t slot);
  int32_t victim() const;
  void evict(int32_t slot);
  void retire_limbo(const Settle& settle);

  int n_layers_, n_experts_;
  size_t slot_bytes_, n_slots_, reserve_;
  std::vector<int32_t> smap_;
  std::vector<Slot> slots_;
  int32_t lru_head_ = kMiss, lru_tail_ = kMiss;  // head: most recently used
  std::deque<int32_t> free_;
  std::vector<int32_t> limbo_;  // eviction order
  std::vector<int32_t> held_;
  size_t resident_ = 0, pinned_ = 0;
  uint64_t evictions_ = 0, early_retirements_ = 0;
};

}  // namespace strata::experts
