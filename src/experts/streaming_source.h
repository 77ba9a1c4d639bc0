// The streaming expert source: routed experts live in the .experts pack and are read on demand
// into the arena (arena.h), a fixed byte budget of slots; the kernels compute from the slots
// (docs/EXPERT_CACHE.md).
//
// Per layer of a window: the distinct experts the routing names are looked up in smap; hits are
// touched in the LRU, misses get a slot and an urgent read, and the forward waits for them (the
// handshake); when some are resident and the rest fit too, the residents are computed while the
// misses are read. With a host tier (host_tier.h) a miss is copied from it, and read from the pack
// into it when it lacks the record. When the budget cannot hold them all at once (a long prefill window touching
// every expert of a layer), they are handed out in groups that fit; the model computes each group's
// pairs and combines all pairs afterwards in rank order, so the output is bitwise the
// all-resident output. Read-ahead guesses (the next layer's router on this layer's input) become
// low-priority reads. Every residency decision is made on the forward thread in routing order,
// never on I/O completion, so neither results nor where experts land depend on I/O timing.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "experts/arena.h"
#include "experts/expert_reader.h"
#include "experts/expert_source.h"
#include "experts/host_tier.h"
#include "experts/pack.h"
#include "experts/record_io.h"

namespace strata::experts {

struct StreamingOptions {
  uint64_t budget_bytes = 0;  // the arena; at least one record
  // Whose memory the slots are (Backend::alloc_expert_slots; it must outlive the source); null:
  // host memory (backend::make_host_expert_slots).
  backend::Backend* backend = nullptr;
  // The host tier between the arena and the pack (host_tier.h), in the backend's host memory
  // (Backend::alloc_host_tier); 0: none. At most one slot per record is made.
  uint64_t host_budget_bytes = 0;
  bool read_ahead = true;
  // Slots kept free or in limbo once the arena is full; default n_slots / 32.
  std::optional<size_t> reserve;
  ReaderOptions reader;
};

class StreamingSource : public ExpertSource {
 public:
  // `layouts` per layer (a pack's), records up to `max_record_bytes`. Throws strata::Error when
  // the budget is below one record.
  StreamingSource(std::vector<Layout> layouts, int n_experts, uint64_t max_record_bytes,
                  std::unique_ptr<RecordIo> io, const StreamingOptions& options);
  // Over an opened pack, read by an ExpertReader with options.reader.
  StreamingSource(std::unique_ptr<Pack> pack, const StreamingOptions& options);
  ~StreamingSource() override;

  void begin_window() override;
  void end_window() override;
  void layer(int layer, const backend::Routing& routing, const GroupFn& fn) override;
  // Not while a host tier holds every record: a guess could only hide a copy, which costs less
  // than computing the guess.
  bool wants_read_ahead() const override;
  void read_ahead(int layer, const backend::Routing& guess) override;
  std::optional<CacheStats> stats() const override;
  bool residency(int layer, std::span<uint8_t> out) const override;
  std::optional<CacheSnapshot> snapshot() const override;

  // Fills the host tier at start-up: the records of `ranked` first (best first: a profile), then
  // every other record, expert by expert across the layers, until it is full (HostTier::load;
  // nothing without a tier). Throws strata::Error for a key outside the pack.
  HostTier::Loaded load_host_tier(std::span<const ExpertKey> ranked);

  // Loads and pins experts from a ranked list (best first: a profile), as many as leave at least
  // one slot outside the reserve unpinned, and at most `max_pins`. Returns how many are pinned.
  // Throws strata::Error when a record cannot be read.
  size_t pin(std::span<const ExpertKey> ranked, size_t max_pins);

  const Arena& arena() const { return *arena_; }
  const backend::ExpertSlots& slots() const { return *slots_; }
  const HostTier* host_tier() const { return tier_.get(); }

 private:
  void settle(int32_t slot);
  // Copies the counters and residency where snapshot() reads them.
  void publish(bool window_ended);
  // Waits for the slot's read, if any; a failed read leaves the slot empty and throws. A failed
  // read that nobody waited for in its own window (a read-ahead, or one a failed window left
  // behind) is read again first: its failure may be windows old.
  void finish_read(int32_t slot, int layer, int expert);
  // Holds `ids` of `layer`, giving each miss a slot and an urgent read.
  void start(int layer, std::span<const int32_t> ids);
  // Waits for their reads and hands them to fn as one group.
  void run(int layer, std::span<const int32_t> ids, bool whole, const GroupFn& fn);

  std::unique_ptr<Pack> pack_;  // when the source owns it: outlives io_
  backend::Backend* backend_;   // whose slots (null: host memory); its counters time the handshakes
  std::vector<Layout> layouts_;
  int n_experts_;
  bool read_ahead_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<backend::ExpertSlots> slots_;  // outlives io_: reads land in its buffers
  std::unique_ptr<HostTier> tier_;  // null without a host budget; reset before the rest goes
  std::unique_ptr<RecordIo> io_;  // destroyed first: its reads into the slots end before they go
  std::vector<RecordIo::Id> pending_;  // per slot: the read still writing into it, or 0
  std::vector<int32_t> from_tier_;     // per slot: the tier slot its record is copied from, or -1
  std::vector<uint8_t> unseen_;        // per slot: that read's failure would reach nobody yet
  Arena::Settle settle_fn_;
  std::vector<backend::ExpertWeights> weights_;  // n_experts, the current group's filled in
  std::vector<int32_t> guess_;                   // the last read-ahead guess, ascending ids
  int guess_layer_ = -1;
  // Read-ahead accuracy over roughly the last 1/(1 - kReadAheadDecay) scored layers. Guesses are
  // always scored; they are read only while this stays above kReadAheadMinAccuracy, so a router
  // that guesses badly (a replayed trace the model's router knows nothing of) stops evicting
  // useful experts, and starts reading again once its guesses improve. It depends on routing
  // alone, never on I/O timing.
  double recent_predicted_ = 0;
  double recent_routed_ = 0;
  // The read-ahead value cap (docs/EXPERT_CACHE.md, "Read-ahead"): a read-ahead read spends one
  // record of credit, and each one whose expert is routed to before it leaves the arena (a hit it
  // made) earns kReadAheadRefund back; every window boundary adds one, up to kReadAheadCredit.
  // So the read-ahead bytes are at most kReadAheadRefund times those that became hits, plus a
  // record per window: guesses worth less than 1 / kReadAheadRefund of their bytes stop costing
  // disk time and evictions. Like the accuracy gate it depends on routing alone.
  double read_ahead_credit_;
  std::vector<uint8_t> ahead_unused_;  // per slot: filled by read-ahead, not yet routed to
  CacheStats stats_;
  // What end_window publishes for snapshot(); the forward thread writes it, anyone reads it.
  mutable std::mutex snapshot_mutex_;
  CacheSnapshot published_;
};

}  // namespace strata::experts
