#include "experts/host_tier.h"

#include <chrono>

#include "util/error.h"

namespace strata::experts {

namespace {

using Clock = std::chrono::steady_clock;

// Start-up reads in flight at once.
constexpr size_t kLoadBatch = 64;

}  // namespace

HostTier::HostTier(int n_layers, int n_experts, std::unique_ptr<backend::ExpertSlots> memory,
                   RecordIo& io, backend::ExpertSlots& device)
    : memory_(std::move(memory)), io_(io), device_(device) {
  if (!memory_) fail("expert cache: this backend has no host tier (its expert slots are host memory)");
  if (memory_->slot_bytes() != device.slot_bytes())
    fail("expert cache: host tier slots of ", memory_->slot_bytes(), " bytes for device slots of ",
         device.slot_bytes());
  const size_t n = memory_->count();
  // No reserve: an evicted slot is settled at once (its copies were queued layers ago), and a tier
  // as large as the pack holds all of it.
  arena_ = std::make_unique<Arena>(Arena::Options{n_layers, n_experts, memory_->slot_bytes(), n, 0});
  pending_.assign(n, 0);
  unseen_.assign(n, 0);
  copied_.assign(n, 0);
  ahead_unused_.assign(n, 0);
  settle_fn_ = [this](int32_t t) { settle(t); };
}

HostTier::~HostTier() {
  for (size_t t = 0; t < pending_.size(); ++t) settle(int32_t(t));
}

void HostTier::settle(int32_t t) {
  // The slot takes another record next: no copy may still be reading it, no read writing it.
  device_.wait_copied(copied_[size_t(t)]);
  copied_[size_t(t)] = 0;
  ahead_unused_[size_t(t)] = 0;
  const RecordIo::Id id = pending_[size_t(t)];
  if (id == 0) return;
  pending_[size_t(t)] = 0;
  unseen_[size_t(t)] = 0;
  if (!io_.cancel(id)) {
    try {
      io_.wait(id);
    } catch (const Error&) {
      // A read-ahead evicted unused: its failure reaches nobody; a later miss reads it again.
    }
  }
}

int32_t HostTier::acquire(int layer, int expert, bool& was_read_ahead) {
  int32_t t = arena_->slot_of(layer, expert);
  was_read_ahead = false;
  if (t != Arena::kMiss) {
    arena_->touch(t);
    if (pending_[size_t(t)] != 0) io_.promote(pending_[size_t(t)]);
    was_read_ahead = ahead_unused_[size_t(t)] != 0;
    ahead_unused_[size_t(t)] = 0;
    ++counters_.hits;
  } else {
    t = arena_->assign(layer, expert, settle_fn_);
    if (t == Arena::kMiss) return t;
    pending_[size_t(t)] = io_.submit(layer, expert, memory_->landing(t), Priority::Urgent);
    ++counters_.reads;
  }
  arena_->hold(t);
  return t;
}

bool HostTier::read_ahead(int layer, int expert) {
  if (arena_->slot_of(layer, expert) != Arena::kMiss) return false;
  const int32_t t = arena_->assign(layer, expert, settle_fn_);
  if (t == Arena::kMiss) return false;
  pending_[size_t(t)] = io_.submit(layer, expert, memory_->landing(t), Priority::ReadAhead);
  unseen_[size_t(t)] = 1;
  ahead_unused_[size_t(t)] = 1;
  ++counters_.reads;
  return true;
}

void HostTier::finish(int32_t t, int layer, int expert) {
  const RecordIo::Id id = pending_[size_t(t)];
  if (id == 0) return;
  pending_[size_t(t)] = 0;
  const bool unseen = unseen_[size_t(t)] != 0;
  unseen_[size_t(t)] = 0;
  const auto start = Clock::now();
  try {
    io_.wait(id);
  } catch (...) {
    counters_.stall_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    if (unseen) {
      pending_[size_t(t)] = io_.submit(layer, expert, memory_->landing(t), Priority::Urgent);
      ++counters_.reads;
      finish(t, layer, expert);
      return;
    }
    ahead_unused_[size_t(t)] = 0;
    arena_->drop(t);
    throw;
  }
  counters_.stall_seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

void HostTier::copy_to(int32_t t, int32_t dst, size_t bytes) {
  copied_[size_t(t)] = device_.fill_from(dst, memory_->data(t), bytes);
}

void HostTier::end_window() {
  // Reads still pending past the window (read-ahead, or a window that failed midway) are unseen.
  for (size_t t = 0; t < pending_.size(); ++t)
    if (pending_[t] != 0) unseen_[t] = 1;
  arena_->release_holds();
  arena_->end_window(settle_fn_);
}

HostTier::Loaded HostTier::load(std::span<const ExpertKey> keys) {
  // Start-up reads are not a window's stall.
  const double stall = counters_.stall_seconds;
  const size_t room = arena_->n_slots();
  std::vector<std::pair<int32_t, ExpertKey>> loading;
  Loaded out;
  auto finish_all = [&] {
    for (const auto& [t, k] : loading) {
      try {
        finish(t, k.layer, k.expert);
        ++out.records;
      } catch (const Error& e) {
        if (out.failed++ == 0) out.first_error = e.what();
      }
    }
    loading.clear();
    arena_->release_holds();
  };
  for (const ExpertKey& k : keys) {
    if (arena_->resident() >= room) break;
    if (arena_->slot_of(k.layer, k.expert) != Arena::kMiss) continue;
    const int32_t t = arena_->assign(k.layer, k.expert, settle_fn_);
    if (t == Arena::kMiss) break;
    pending_[size_t(t)] = io_.submit(k.layer, k.expert, memory_->landing(t), Priority::Urgent);
    arena_->hold(t);
    loading.emplace_back(t, k);
    if (loading.size() >= kLoadBatch) finish_all();
  }
  finish_all();
  counters_.stall_seconds = stall;
  return out;
}

}  // namespace strata::experts
