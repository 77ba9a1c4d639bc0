// The host-RAM tier between a device expert arena and the pack (docs/EXPERT_CACHE.md, "Tiers"):
// a second, larger budget of equal slots in host memory the device copies from fastest (pinned:
// Backend::alloc_host_tier). Records read from the pack land in a tier slot and stay there; a
// device miss whose record the tier holds costs one host-to-device copy straight from it (the copy
// engine, no disk, no staging). Inclusive: what the device arena holds the tier usually holds too,
// so it pays when it is larger than the device arena.
//
// The bookkeeping is the arena's (arena.h: LRU, holds; no reserve), so where a record lands depends
// on the sequence of routings alone, never on I/O timing; an evicted slot takes another record only
// once the copies that read it are done and its read is settled. One caller thread (the forward
// thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "experts/arena.h"
#include "experts/record_io.h"

namespace strata::experts {

class HostTier {
 public:
  struct Counters {
    uint64_t hits = 0;   // device misses the tier held (a copy, no read)
    uint64_t reads = 0;  // device misses and read-ahead guesses read from the pack into the tier
    double stall_seconds = 0;  // waits for those reads
  };

  // `memory`: the tier's slots (host memory: landing(s) is the slot); `io` the pack's reads and
  // `device` the arena's slots the copies go to, both outliving the tier.
  HostTier(int n_layers, int n_experts, std::unique_ptr<backend::ExpertSlots> memory, RecordIo& io,
           backend::ExpertSlots& device);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // A device miss of (layer, expert): its tier slot (a hit, touched) or a newly assigned one with
  // an urgent read queued; held until release_holds(). kMiss when every slot is held (a group
  // larger than the tier): the caller reads the record itself. `was_read_ahead`: the slot was
  // filled by a read-ahead guess no device miss had used yet.
  int32_t acquire(int layer, int expert, bool& was_read_ahead);
  // A read-ahead guess of (layer, expert): a low-priority read into a slot, unless the tier holds
  // the record (or its read) already or no slot is free. Returns whether a read was queued.
  bool read_ahead(int layer, int expert);
  // Waits for slot t's read, if one is pending, adding the wait to the stall counter. A failed read
  // drops the slot and throws, except one nobody waited for when it failed (a read-ahead, or a read
  // a failed window left behind), which is read again first: its failure may be windows old.
  void finish(int32_t t, int layer, int expert);
  // Queues a copy of slot t's record (`bytes`) into the device slot `dst` (ExpertSlots::fill_from).
  void copy_to(int32_t t, int32_t dst, size_t bytes);
  void release_holds() { arena_->release_holds(); }
  void end_window();
  // Start-up fill: reads the records of `keys` the tier lacks, in order, until it is full. A record whose read fails stays out (a window that routes to it reads it
  // again and reports the error to its request).
  struct Loaded {
    size_t records = 0;
    size_t failed = 0;
    std::string first_error;
  };
  Loaded load(std::span<const ExpertKey> keys);

  const Arena& arena() const { return *arena_; }
  Counters counters() const { return counters_; }

 private:
  void settle(int32_t t);

  std::unique_ptr<Arena> arena_;
  std::unique_ptr<backend::ExpertSlots> memory_;
  RecordIo& io_;
  backend::ExpertSlots& device_;
  std::vector<RecordIo::Id> pending_;  // per slot: the read still writing into it, or 0
  std::vector<uint8_t> unseen_;        // per slot: that read's failure would reach nobody yet
  std::vector<uint64_t> copied_;       // per slot: the latest copy reading it (a fill_from ticket)
  std::vector<uint8_t> ahead_unused_;  // per slot: read by a guess, not yet used by a miss
  Arena::Settle settle_fn_;
  Counters counters_;
};

}  // namespace strata::experts
