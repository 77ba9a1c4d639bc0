#include "experts/streaming_source.h"

#include <algorithm>
#include <chrono>

#include "util/error.h"
#include "util/progress.h"

namespace strata::experts {

namespace {

using Clock = std::chrono::steady_clock;

// Read-ahead self-check (see recent_predicted_): decay per scored layer, the scored routed
// experts before it may switch reads off, and the accuracy below which it does.
constexpr double kReadAheadDecay = 0.98;
constexpr double kReadAheadWarmup = 64;
constexpr double kReadAheadMinAccuracy = 0.25;
// Read-ahead value cap (see read_ahead_credit_): the credit, in records, at the start and at most,
// and what a read-ahead read that became a hit earns back.
constexpr double kReadAheadCredit = 64;
constexpr double kReadAheadRefund = 2;
// Start-up pins whose reads are in flight at once.
constexpr size_t kPinBatch = 64;

std::vector<int32_t> distinct_experts(const backend::Routing& routing) {
  std::vector<int32_t> ids(routing.experts.begin(), routing.experts.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::vector<Layout> pack_layouts(const Pack& pack) {
  std::vector<Layout> out;
  for (int l = 0; l < pack.n_layers(); ++l) out.push_back(pack.layout(l));
  return out;
}

}  // namespace

StreamingSource::StreamingSource(std::vector<Layout> layouts, int n_experts,
                                 uint64_t max_record_bytes, std::unique_ptr<RecordIo> io,
                                 const StreamingOptions& o)
    : backend_(o.backend),
      layouts_(std::move(layouts)),
      n_experts_(n_experts),
      read_ahead_(o.read_ahead),
      read_ahead_credit_(kReadAheadCredit) {
  const uint64_t slot = (max_record_bytes + Arena::kSlotAlignment - 1) / Arena::kSlotAlignment *
                        Arena::kSlotAlignment;
  if (slot == 0) fail("expert cache: the pack's records are empty");
  if (o.budget_bytes < slot)
    fail("--expert-budget ", format_bytes(o.budget_bytes), " is below one expert record (",
         format_bytes(slot), "); give at least that");
  // More slots than records would never be used.
  const uint64_t records = uint64_t(layouts_.size()) * uint64_t(n_experts_);
  const size_t n_slots = size_t(std::min(o.budget_bytes / slot, records));
  arena_ = std::make_unique<Arena>(Arena::Options{int(layouts_.size()), n_experts_, size_t(slot),
                                                  n_slots, o.reserve.value_or(n_slots / 32)});
  slots_ = o.backend ? o.backend->alloc_expert_slots(n_slots, arena_->slot_bytes())
                     : backend::make_host_expert_slots(n_slots, arena_->slot_bytes());
  io_ = std::move(io);
  if (o.host_budget_bytes > 0) {
    const size_t n_tier = size_t(std::min(o.host_budget_bytes / slot, records));
    if (n_tier == 0)
      fail("--host-budget ", format_bytes(o.host_budget_bytes), " is below one expert record (",
           format_bytes(slot), "); give at least that, or 0 for no host tier");
    if (!o.backend)
      fail("--host-budget: the expert slots are host memory already; a host tier applies to a "
           "device backend (--device cuda)");
    std::unique_ptr<backend::ExpertSlots> memory = o.backend->alloc_host_tier(n_tier, arena_->slot_bytes());
    if (!memory)
      fail("--host-budget: the ", o.backend->name(), " backend's expert slots are host memory "
           "already; a host tier applies to a device backend (--device cuda)");
    tier_ = std::make_unique<HostTier>(int(layouts_.size()), n_experts_, std::move(memory), *io_, *slots_);
  }
  pending_.assign(n_slots, 0);
  from_tier_.assign(n_slots, -1);
  unseen_.assign(n_slots, 0);
  ahead_unused_.assign(n_slots, 0);
  settle_fn_ = [this](int32_t s) { settle(s); };
  weights_.resize(size_t(n_experts_));
  publish(false);
}

StreamingSource::StreamingSource(std::unique_ptr<Pack> pack, const StreamingOptions& o)
    : StreamingSource(pack_layouts(*pack), pack->n_experts(), pack->max_record_bytes(),
                      make_reader_io(*pack, o.reader), o) {
  pack_ = std::move(pack);
}

StreamingSource::~StreamingSource() {
  tier_.reset();
  for (size_t s = 0; s < pending_.size(); ++s) settle(int32_t(s));
}

void StreamingSource::settle(int32_t s) {
  slots_->recycle(s);
  ahead_unused_[size_t(s)] = 0;  // evicted before any window routed to it
  const RecordIo::Id id = pending_[size_t(s)];
  if (id == 0) return;
  pending_[size_t(s)] = 0;
  unseen_[size_t(s)] = 0;
  if (!io_->cancel(id)) {
    try {
      io_->wait(id);
    } catch (const Error&) {
      // A read-ahead whose expert was evicted unused: its failure reaches nobody. The record is
      // read again, and its error reported, if a window ever routes to it.
    }
  }
  slots_->discard(s);
}

void StreamingSource::finish_read(int32_t s, int layer, int expert) {
  if (const int32_t t = from_tier_[size_t(s)]; t >= 0) {
    from_tier_[size_t(s)] = -1;
    try {
      tier_->finish(t, layer, expert);
    } catch (...) {
      ahead_unused_[size_t(s)] = 0;
      arena_->drop(s);
      throw;
    }
    tier_->copy_to(t, s, size_t(layouts_[size_t(layer)].record_bytes));
    return;
  }
  const RecordIo::Id id = pending_[size_t(s)];
  if (id == 0) return;
  pending_[size_t(s)] = 0;
  const bool unseen = unseen_[size_t(s)] != 0;
  unseen_[size_t(s)] = 0;
  const auto start = Clock::now();
  try {
    io_->wait(id);
  } catch (...) {
    stats_.stall_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    if (unseen) {
      // A read nobody waited for when it failed (a read-ahead, or a read a failed window left
      // behind): the fault may have cleared or the file been repaired since. Read it again now,
      // as the miss it has become, and report only that read's failure.
      pending_[size_t(s)] = io_->submit(layer, expert, slots_->landing(s), Priority::Urgent);
      finish_read(s, layer, expert);
      return;
    }
    slots_->discard(s);
    ahead_unused_[size_t(s)] = 0;
    arena_->drop(s);
    throw;
  }
  stats_.stall_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  slots_->fill(s, size_t(layouts_[size_t(layer)].record_bytes));
}

void StreamingSource::begin_window() { guess_layer_ = -1; }

void StreamingSource::end_window() {
  // Reads still pending past the window (a window that failed midway leaves some) are unseen.
  for (size_t s = 0; s < pending_.size(); ++s)
    if (pending_[s] != 0) unseen_[s] = 1;
  arena_->release_holds();
  arena_->end_window(settle_fn_);
  if (tier_) tier_->end_window();
  guess_layer_ = -1;
  read_ahead_credit_ = std::min(kReadAheadCredit, read_ahead_credit_ + 1);
  publish(true);
}

void StreamingSource::publish(bool window_ended) {
  const CacheStats now = *stats();
  std::lock_guard lock(snapshot_mutex_);
  published_.stats = now;
  if (window_ended) ++published_.windows;
  published_.n_layers = int(layouts_.size());
  published_.n_experts = n_experts_;
  published_.resident.resize(layouts_.size() * size_t(n_experts_));
  for (int il = 0; il < published_.n_layers; ++il)
    residency(il, std::span(published_.resident).subspan(size_t(il) * size_t(n_experts_), size_t(n_experts_)));
}

std::optional<CacheSnapshot> StreamingSource::snapshot() const {
  std::lock_guard lock(snapshot_mutex_);
  return published_;
}

void StreamingSource::start(int il, std::span<const int32_t> ids) {
  for (int32_t e : ids) {
    int32_t s = arena_->slot_of(il, e);
    if (s != Arena::kMiss) {
      arena_->touch(s);
      if (pending_[size_t(s)] != 0) io_->promote(pending_[size_t(s)]);
      if (ahead_unused_[size_t(s)]) {
        ahead_unused_[size_t(s)] = 0;
        stats_.read_ahead_useful_bytes += layouts_[size_t(il)].record_bytes;
        read_ahead_credit_ = std::min(kReadAheadCredit, read_ahead_credit_ + kReadAheadRefund);
      }
    } else {
      s = arena_->assign(il, e, settle_fn_);
      if (s == Arena::kMiss)
        fail("internal error: expert cache has no slot for layer ", il, " expert ", e);
      bool was_read_ahead = false;
      const int32_t t = tier_ ? tier_->acquire(il, e, was_read_ahead) : Arena::kMiss;
      if (t != Arena::kMiss) {
        from_tier_[size_t(s)] = t;
        if (was_read_ahead) {
          stats_.read_ahead_useful_bytes += layouts_[size_t(il)].record_bytes;
          read_ahead_credit_ = std::min(kReadAheadCredit, read_ahead_credit_ + kReadAheadRefund);
        }
      } else {
        pending_[size_t(s)] = io_->submit(il, e, slots_->landing(s), Priority::Urgent);
      }
    }
    arena_->hold(s);
  }
}

void StreamingSource::run(int il, std::span<const int32_t> ids, bool whole, const GroupFn& fn) {
  try {
    for (int32_t e : ids) finish_read(arena_->slot_of(il, e), il, e);
  } catch (...) {
    // The group's other copies from the tier were never queued: those experts hold no bytes, and
    // their tier slots are released with the group.
    for (int32_t e : ids)
      if (const int32_t s = arena_->slot_of(il, e); s != Arena::kMiss && from_tier_[size_t(s)] >= 0) {
        from_tier_[size_t(s)] = -1;
        ahead_unused_[size_t(s)] = 0;
        arena_->drop(s);
      }
    throw;
  }
  const Layout& layout = layouts_[size_t(il)];
  for (int32_t e : ids) {
    const int32_t s = arena_->slot_of(il, e);
    slots_->ready(s);
    weights_[size_t(e)] = layout.weights(slots_->data(s));
  }
  fn({weights_, ids, whole});
  for (int32_t e : ids) weights_[size_t(e)] = {};
}

void StreamingSource::layer(int il, const backend::Routing& routing, const GroupFn& fn) {
  if (il < 0 || size_t(il) >= layouts_.size())
    fail("expert cache: layer ", il, " is outside the pack's ", layouts_.size(), " layers");
  const std::vector<int32_t> ids = distinct_experts(routing);
  for (int32_t e : ids)
    if (e < 0 || e >= n_experts_)
      fail("expert cache: expert id ", e, " at layer ", il, " is outside the pack's ", n_experts_,
           " experts");
  if (guess_layer_ == il) {
    uint64_t predicted = 0;
    for (int32_t e : ids) predicted += std::binary_search(guess_.begin(), guess_.end(), e);
    stats_.read_ahead_predicted += predicted;
    stats_.read_ahead_routed += ids.size();
    recent_predicted_ = recent_predicted_ * kReadAheadDecay + double(predicted);
    recent_routed_ = recent_routed_ * kReadAheadDecay + double(ids.size());
    guess_layer_ = -1;
  }

  // Resident experts first, so the first group holds them before any miss can evict one.
  std::vector<int32_t> order;
  for (int32_t e : ids)
    if (arena_->slot_of(il, e) != Arena::kMiss) order.push_back(e);
  const size_t n_hits = order.size();
  stats_.hits += n_hits;
  stats_.misses += ids.size() - n_hits;
  for (int32_t e : ids)
    if (arena_->slot_of(il, e) == Arena::kMiss) order.push_back(e);

  // Groups of at most `room` unpinned experts (pinned ones are resident for good and cost no
  // slot), each group in ascending id order.
  const size_t room = arena_->n_slots() - arena_->pinned_count();
  std::vector<std::vector<int32_t>> groups(1);
  size_t cost = 0;
  for (int32_t e : order) {
    const int32_t s = arena_->slot_of(il, e);
    const size_t c = (s != Arena::kMiss && arena_->pinned(s)) ? 0 : 1;
    if (cost + c > room) {
      groups.emplace_back();
      cost = 0;
    }
    groups.back().push_back(e);
    cost += c;
  }
  if (groups.size() > 1) ++stats_.chunked_layers;

  struct Release {
    Arena& arena;
    HostTier* tier;
    ~Release() {
      arena.release_holds();
      if (tier) tier->release_holds();
    }
  } release{*arena_, tier_.get()};
  if (groups.size() == 1 && n_hits > 0 && n_hits < ids.size()) {
    // Resident first (docs/DESIGN.md, "The decode window"): the misses' reads go out, then
    // the residents are computed while they land, then the misses.
    std::vector<int32_t> hits(order.begin(), order.begin() + ptrdiff_t(n_hits));
    std::vector<int32_t> misses(order.begin() + ptrdiff_t(n_hits), order.end());
    std::sort(hits.begin(), hits.end());
    std::sort(misses.begin(), misses.end());
    start(il, hits);
    start(il, misses);
    run(il, hits, false, fn);
    run(il, misses, false, fn);
    return;
  }
  for (auto& g : groups) {
    std::sort(g.begin(), g.end());
    start(il, g);
    run(il, g, groups.size() == 1, fn);
    arena_->release_holds();
    if (tier_) tier_->release_holds();
  }
}

bool StreamingSource::wants_read_ahead() const {
  return read_ahead_ && !(tier_ && tier_->arena().resident() == layouts_.size() * size_t(n_experts_));
}

void StreamingSource::read_ahead(int il, const backend::Routing& guess) {
  if (!read_ahead_ || il < 0 || size_t(il) >= layouts_.size()) return;
  guess_ = distinct_experts(guess);
  guess_layer_ = il;
  if (recent_routed_ >= kReadAheadWarmup &&
      recent_predicted_ < kReadAheadMinAccuracy * recent_routed_) {
    ++stats_.read_ahead_skipped;
    return;
  }
  std::vector<int32_t> missing;
  for (int32_t e : guess_)
    if (e >= 0 && e < n_experts_ && arena_->slot_of(il, e) == Arena::kMiss) missing.push_back(e);
  // A guess larger than what is free to take would only evict experts about to be used.
  const size_t room = arena_->n_slots() - arena_->pinned_count() - arena_->held();
  if (missing.size() > room / 2) return;
  for (size_t i = 0; i < missing.size(); ++i) {
    if (read_ahead_credit_ < 1) {
      stats_.read_ahead_capped += missing.size() - i;
      return;
    }
    const int32_t e = missing[i];
    const uint64_t bytes = layouts_[size_t(il)].record_bytes;
    if (tier_) {
      // A guess hides a disk read: one the tier lacks is read into it. A record the tier holds is
      // copied when it is used (a copy overlapped with the residents' compute), never ahead on a
      // guess that would evict a device expert (H200, 80B shape, the model's own router: 46.3
      // tok/s copying guesses ahead, 50.7 without; docs/PERFORMANCE.md).
      if (!tier_->read_ahead(il, e)) continue;
      read_ahead_credit_ -= 1;
      ++stats_.read_ahead_reads;
      stats_.read_ahead_bytes += bytes;
      continue;
    }
    const int32_t s = arena_->assign(il, e, settle_fn_);
    if (s == Arena::kMiss) return;
    pending_[size_t(s)] = io_->submit(il, e, slots_->landing(s), Priority::ReadAhead);
    unseen_[size_t(s)] = 1;
    ahead_unused_[size_t(s)] = 1;
    read_ahead_credit_ -= 1;
    ++stats_.read_ahead_reads;
    stats_.read_ahead_bytes += bytes;
  }
}

bool StreamingSource::residency(int layer, std::span<uint8_t> out) const {
  for (size_t e = 0; e < out.size(); ++e)
    out[e] = arena_->slot_of(layer, int(e)) != Arena::kMiss ? 1 : 0;
  return true;
}

HostTier::Loaded StreamingSource::load_host_tier(std::span<const ExpertKey> ranked) {
  if (!tier_) return {};
  for (const ExpertKey& k : ranked)
    if (k.layer < 0 || size_t(k.layer) >= layouts_.size() || k.expert < 0 || k.expert >= n_experts_)
      fail("expert cache: cannot load (layer ", k.layer, ", expert ", k.expert,
           ") into the host tier: outside the pack's ", layouts_.size(), " layers x ", n_experts_, " experts");
  std::vector<ExpertKey> keys(ranked.begin(), ranked.end());
  // Expert-major: a tier smaller than the pack holds as many experts of each layer.
  for (int e = 0; e < n_experts_; ++e)
    for (int il = 0; il < int(layouts_.size()); ++il) keys.push_back({il, e});
  const HostTier::Loaded loaded = tier_->load(keys);
  publish(false);
  return loaded;
}

size_t StreamingSource::pin(std::span<const ExpertKey> ranked, size_t max_pins) {
  const size_t limit =
      std::min(max_pins, arena_->n_slots() - arena_->reserve() - 1 - arena_->pinned_count());
  std::vector<int32_t> loaded;
  std::vector<ExpertKey> loaded_keys;
  struct Release {
    Arena& arena;
    ~Release() { arena.release_holds(); }
  } release{*arena_};
  // Reads are waited for in batches, so that no more than a batch of landing buffers (pinned
  // host memory where the slots are device memory) is ever in use for them.
  size_t finished = 0;
  auto finish_loaded = [&] {
    for (; finished < loaded.size(); ++finished)
      finish_read(loaded[finished], loaded_keys[finished].layer, loaded_keys[finished].expert);
  };
  for (const ExpertKey& k : ranked) {
    if (loaded.size() >= limit) break;
    if (k.layer < 0 || size_t(k.layer) >= layouts_.size() || k.expert < 0 || k.expert >= n_experts_)
      fail("expert cache: cannot pin (layer ", k.layer, ", expert ", k.expert,
           "): outside the pack's ", layouts_.size(), " layers x ", n_experts_, " experts");
    int32_t s = arena_->slot_of(k.layer, k.expert);
    if (s != Arena::kMiss && arena_->pinned(s)) continue;
    if (s == Arena::kMiss) {
      s = arena_->assign(k.layer, k.expert, settle_fn_);
      if (s == Arena::kMiss) break;
      pending_[size_t(s)] = io_->submit(k.layer, k.expert, slots_->landing(s), Priority::Urgent);
    }
    arena_->hold(s);
    loaded.push_back(s);
    loaded_keys.push_back(k);
    if (loaded.size() - finished >= kPinBatch) finish_loaded();
  }
  finish_loaded();
  for (int32_t s : loaded) arena_->pin(s);
  publish(false);
  return loaded.size();
}

std::optional<CacheStats> StreamingSource::stats() const {
  CacheStats s = stats_;
  const RecordIo::Counters c = io_->counters();
  s.bytes_read = c.bytes;
  s.read_seconds = c.busy_seconds;
  s.evictions = arena_->evictions();
  s.early_retirements = arena_->early_retirements();
  const backend::ExpertSlots::Counters copies = slots_->counters();
  s.h2d_bytes = copies.bytes;
  s.h2d_seconds = copies.seconds;
  if (tier_) {
    const HostTier::Counters t = tier_->counters();
    s.host_hits = t.hits;
    s.host_reads = t.reads;
    s.stall_seconds += t.stall_seconds;
  }
  if (backend_) {
    const backend::BackendCounters b = backend_->counters();
    s.handshakes = b.handshakes;
    s.handshake_seconds = b.handshake_seconds;
  }
  return s;
}

}  // namespace strata::experts
