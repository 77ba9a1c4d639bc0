#include "experts/expert_source.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "experts/arena.h"
#include "experts/memory_limit.h"
#include "experts/pack.h"
#include "experts/streaming_source.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/config.h"
#include "util/error.h"
#include "util/memory_lock.h"
#include "util/progress.h"

namespace strata::experts {

namespace {

class MappedSource : public ExpertSource {
 public:
  MappedSource(const gguf::Reader& reader, const model::ModelConfig& c, backend::Backend& be) {
    layers_.resize(size_t(c.n_blocks()));
    for (int64_t il = 0; il < c.n_blocks(); ++il) {
      const auto& gate = reader.tensor(cat("blk.", il, ".ffn_gate_exps.weight"));
      const auto& up = reader.tensor(cat("blk.", il, ".ffn_up_exps.weight"));
      const auto& down = reader.tensor(cat("blk.", il, ".ffn_down_exps.weight"));
      auto& experts = layers_[size_t(il)];
      experts.resize(size_t(c.n_expert));
      for (int64_t e = 0; e < c.n_expert; ++e)
        experts[size_t(e)] = {be.weight(gate, e), be.weight(up, e), be.weight(down, e)};
    }
  }

  std::span<const backend::ExpertWeights> all_resident(int il) const override {
    return layers_.at(size_t(il));
  }

  void layer(int il, const backend::Routing& routing, const GroupFn& fn) override {
    ids_.assign(routing.experts.begin(), routing.experts.end());
    std::sort(ids_.begin(), ids_.end());
    ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
    fn({layers_.at(size_t(il)), ids_, true});
  }

 private:
  std::vector<std::vector<backend::ExpertWeights>> layers_;
  std::vector<int32_t> ids_;
};

}  // namespace

double CacheStats::hit_rate() const {
  const uint64_t n = hits + misses;
  return n == 0 ? 0.0 : double(hits) / double(n);
}

double CacheStats::read_ahead_accuracy() const {
  return read_ahead_routed == 0 ? 0.0 : double(read_ahead_predicted) / double(read_ahead_routed);
}

double CacheStats::read_ahead_value() const {
  return read_ahead_bytes == 0 ? 0.0 : double(read_ahead_useful_bytes) / double(read_ahead_bytes);
}

double CacheStats::host_hit_rate() const {
  return misses == 0 ? 0.0 : double(host_hits) / double(misses);
}

double CacheStats::handshake_us() const {
  return handshakes == 0 ? 0.0 : handshake_seconds * 1e6 / double(handshakes);
}

CacheStats CacheStats::since(const CacheStats& e) const {
  CacheStats d;
  d.hits = hits - e.hits;
  d.misses = misses - e.misses;
  d.bytes_read = bytes_read - e.bytes_read;
  d.read_seconds = read_seconds - e.read_seconds;
  d.stall_seconds = stall_seconds - e.stall_seconds;
  d.read_ahead_reads = read_ahead_reads - e.read_ahead_reads;
  d.read_ahead_predicted = read_ahead_predicted - e.read_ahead_predicted;
  d.read_ahead_routed = read_ahead_routed - e.read_ahead_routed;
  d.read_ahead_skipped = read_ahead_skipped - e.read_ahead_skipped;
  d.read_ahead_bytes = read_ahead_bytes - e.read_ahead_bytes;
  d.read_ahead_useful_bytes = read_ahead_useful_bytes - e.read_ahead_useful_bytes;
  d.read_ahead_capped = read_ahead_capped - e.read_ahead_capped;
  d.chunked_layers = chunked_layers - e.chunked_layers;
  d.evictions = evictions - e.evictions;
  d.early_retirements = early_retirements - e.early_retirements;
  d.h2d_bytes = h2d_bytes - e.h2d_bytes;
  d.h2d_seconds = h2d_seconds - e.h2d_seconds;
  d.host_hits = host_hits - e.host_hits;
  d.host_reads = host_reads - e.host_reads;
  d.handshakes = handshakes - e.handshakes;
  d.handshake_seconds = handshake_seconds - e.handshake_seconds;
  return d;
}

std::string CacheStats::summary() const {
  char h2d[96] = "";
  if (h2d_bytes > 0)
    std::snprintf(h2d, sizeof h2d, ", H2D %.1f MB at %.2f GB/s", double(h2d_bytes) / 1e6,
                  h2d_seconds > 0 ? double(h2d_bytes) / h2d_seconds / 1e9 : 0.0);
  char host[96] = "";
  if (host_hits + host_reads > 0)
    std::snprintf(host, sizeof host, ", host tier %llu hits (%.1f%% of misses), %llu reads",
                  (unsigned long long)host_hits, host_hit_rate() * 100.0, (unsigned long long)host_reads);
  char handshake[96] = "";
  if (handshakes > 0)
    std::snprintf(handshake, sizeof handshake, ", %llu handshakes at %.1f us",
                  (unsigned long long)handshakes, handshake_us());
  char buf[768];
  std::snprintf(
      buf, sizeof buf,
      "expert cache: %llu hits, %llu misses (%.1f%%), %.1f MB read at %.2f GB/s, stall "
      "%.1f ms, read-ahead %llu reads guessed %.1f%% of routed experts (%llu guesses not "
      "read), %.1f%% of its bytes became hits (%llu reads capped), %llu chunked layers%s%s%s, %llu evictions",
      (unsigned long long)hits, (unsigned long long)misses, hit_rate() * 100.0,
      double(bytes_read) / 1e6, read_seconds > 0 ? double(bytes_read) / read_seconds / 1e9 : 0.0,
      stall_seconds * 1e3, (unsigned long long)read_ahead_reads, read_ahead_accuracy() * 100.0,
      (unsigned long long)read_ahead_skipped, read_ahead_value() * 100.0,
      (unsigned long long)read_ahead_capped, (unsigned long long)chunked_layers, h2d, host,
      handshake, (unsigned long long)evictions);
  return buf;
}

std::unique_ptr<ExpertSource> make_mapped_source(const gguf::Reader& reader,
                                                 const model::ModelConfig& config,
                                                 backend::Backend& backend) {
  return std::make_unique<MappedSource>(reader, config, backend);
}

namespace {

// Below this the default budget would thrash; a machine that short of memory should say
// --expert-budget itself.
constexpr uint64_t kMinDefaultBudget = uint64_t(512) << 20;

// The default budget where slots are device memory: its free memory (the trunk is uploaded by
// then) less a margin for activations, the KV cache, graphs and the copy staging.
uint64_t default_device_budget(uint64_t free_bytes) {
  const uint64_t margin = std::max<uint64_t>(uint64_t(2) << 30, free_bytes / 20);
  return free_bytes > margin ? free_bytes - margin : 0;
}

// The limit the experts and the rest must fit in: --memory-limit, else the cgroup's.
std::optional<MemoryLimit> memory_limit(const SourceOptions& o) {
  if (o.memory_limit) return MemoryLimit{*o.memory_limit, "--memory-limit"};
  return cgroup_memory_limit();
}

// The default budget where slots are host memory: MemAvailable's rule, at most what the limit
// leaves (split->arena); throws, naming the limit, when that is below kMinDefaultBudget.
uint64_t default_host_budget(uint64_t trunk_bytes, const std::optional<MemoryLimit>& limit, int reader_threads) {
  const uint64_t from_available = std::max(default_expert_budget(trunk_bytes), kMinDefaultBudget);
  if (!limit) return from_available;
  return std::min(from_available, split_memory(*limit, trunk_bytes, reader_threads, kMinDefaultBudget).arena);
}

// The default host tier where the slots are device memory: none when the pack fits the device
// budget; else the pack, at most half of what MemAvailable leaves after a margin and half of the
// memory limit; none when that is no larger than the device budget (an inclusive tier that small
// would hold little the device does not).
uint64_t default_host_tier(uint64_t pack_slot_bytes, uint64_t device_budget, const std::optional<MemoryLimit>& limit) {
  if (pack_slot_bytes <= device_budget) return 0;
  uint64_t room = default_expert_budget(0) / 2;
  if (limit) room = std::min(room, limit->bytes / 2);
  const uint64_t tier = std::min(pack_slot_bytes, room);
  return tier > device_budget ? tier : 0;
}

// The mapped trunk: every tensor but the routed expert stacks and the n-gram tables that are
// read row by row.
std::vector<util::ByteRange> trunk_ranges(const gguf::Reader& reader, const model::ModelConfig& c) {
  std::vector<std::string> skip;
  for (const model::TensorSpec& s : model::tensor_specs(c))
    if (s.role == model::Role::NgramTable) skip.push_back(s.name);
  std::vector<util::ByteRange> out;
  for (const auto& t : reader.tensors()) {
    if (!t.data || t.name.ends_with("_exps.weight")) continue;
    if (std::find(skip.begin(), skip.end(), t.name) != skip.end()) continue;
    out.push_back({t.data, t.nbytes});
  }
  return out;
}

// Locks the trunk in RAM so a memory cap never evicts and re-reads it; says once per process
// when the kernel refuses.
std::string lock_trunk(const gguf::Reader& reader, const model::ModelConfig& c) {
  const std::vector<util::ByteRange> ranges = trunk_ranges(reader, c);
  const util::LockResult r = util::lock_in_memory(ranges);
  if (r.failure.empty()) return cat("trunk ", format_bytes(r.locked), " locked in RAM");
  static bool warned = false;
  if (!warned) {
    warned = true;
    std::fprintf(stderr,
                 "[strata] warning: could not lock the trunk in RAM (%s locked of %s): %s; under memory "
                 "pressure its pages may be evicted and read again\n",
                 format_bytes(r.locked).c_str(), format_bytes(r.asked).c_str(), r.failure.c_str());
  }
  return cat("trunk not locked (", format_bytes(r.locked), " of ", format_bytes(r.asked), ")");
}

OpenedSource streamed(const gguf::Reader& reader, const model::ModelConfig& c, std::unique_ptr<Pack> pack,
                      uint64_t trunk_bytes, backend::Backend& backend, const SourceOptions& o) {
  StreamingOptions so;
  so.backend = &backend;
  so.read_ahead = o.read_ahead;
  so.reader.wrap = o.io_wrapper;
  const std::optional<uint64_t> device_free = backend.expert_memory_free();
  std::string budget_note, memory_note;
  if (device_free) {
    so.budget_bytes = o.budget_bytes.value_or(std::max(default_device_budget(*device_free), kMinDefaultBudget));
    if (!o.budget_bytes)
      budget_note = cat(" (default: ", format_bytes(*device_free), " free on the ", backend.name(),
                        " device less a margin)");
  } else {
    const std::optional<MemoryLimit> limit = memory_limit(o);
    so.budget_bytes = o.budget_bytes.value_or(default_host_budget(trunk_bytes, limit, so.reader.threads));
    bool fits = true;
    if (limit) {
      MemorySplit split = split_memory(*limit, trunk_bytes, so.reader.threads, 0);
      fits = so.budget_bytes <= split.arena;
      if (!fits) {
        const std::string why = cat("--expert-budget ", format_bytes(so.budget_bytes), " does not fit: ",
                                    split.describe());
        if (o.memory_limit) fail(why, "; lower --expert-budget or raise --memory-limit");
        std::fprintf(stderr, "[strata] warning: %s; the trunk is not locked, so the cap evicts and re-reads it\n",
                     why.c_str());
      }
      split.arena = so.budget_bytes;
      memory_note = "; " + split.describe();
    }
    // A locked trunk with an arena that does not fit beside it would not be slow but killed.
    memory_note += "; " + (fits ? lock_trunk(reader, c) : std::string("trunk not locked (over the limit)"));
  }
  const uint64_t slot = (pack->max_record_bytes() + Arena::kSlotAlignment - 1) / Arena::kSlotAlignment *
                        Arena::kSlotAlignment;
  const uint64_t pack_slot_bytes = uint64_t(pack->n_layers()) * uint64_t(pack->n_experts()) * slot;
  if (device_free) {
    so.host_budget_bytes = o.host_budget_bytes.value_or(default_host_tier(pack_slot_bytes, so.budget_bytes, memory_limit(o)));
    // Pinned memory cannot be swapped or reclaimed: asking for more than the machine has free
    // would push everything else out before the allocation fails.
    const uint64_t tier = std::min(so.host_budget_bytes, pack_slot_bytes);
    const uint64_t room = default_expert_budget(0);
    if (tier > room)
      fail("--host-budget ", format_bytes(tier), " does not fit in free RAM (", format_bytes(room),
           " available after a margin); give a smaller --host-budget, or 0 for no host tier");
  } else if (o.host_budget_bytes.value_or(0) > 0) {
    fail("--host-budget: the ", backend.name(), " backend's expert cache is host memory already; a host tier "
         "applies to a device backend (--device cuda)");
  }
  const std::string path = pack->path();
  auto source = std::make_unique<StreamingSource>(std::move(pack), so);
  const Arena& a = source->arena();
  std::string tier_note;
  if (const HostTier* tier = source->host_tier()) {
    const Arena& t = tier->arena();
    tier_note = cat("; host tier ", format_bytes(uint64_t(t.n_slots()) * t.slot_bytes()),
                    o.host_budget_bytes ? "" : " (default: the pack, at most half of free RAM)", " pinned, ",
                    t.n_slots(), " slots");
    if (o.host_fill) {
      const auto start = std::chrono::steady_clock::now();
      const HostTier::Loaded n = source->load_host_tier({});
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      char rate[96];
      std::snprintf(rate, sizeof rate, " in %.1f s (%.2f GB/s)", s,
                    s > 0 ? double(n.records) * double(slot) / s / 1e9 : 0.0);
      tier_note += cat(", ", n.records, " records read at start-up", rate);
      if (n.failed > 0) {
        std::fprintf(stderr,
                     "[strata] warning: host tier: %zu records could not be read at start-up (first: %s); a "
                     "request that routes to one reads it again and fails with its error\n",
                     n.failed, n.first_error.c_str());
        tier_note += cat(", ", n.failed, " unreadable");
      }
    }
  }
  // A budget above the pack's size leaves the arena at one slot per expert: say what it holds.
  const uint64_t arena_bytes = uint64_t(a.n_slots()) * a.slot_bytes();
  const bool whole_pack = uint64_t(a.n_slots()) * slot >= pack_slot_bytes && arena_bytes < so.budget_bytes;
  const std::string whole = whole_pack ? cat(", ", format_bytes(arena_bytes), ": every expert;") : ",";
  return {std::move(source),
          cat("streamed from ", path, device_free ? cat(" into ", backend.name(), " memory") : "",
              ", budget ", format_bytes(so.budget_bytes), budget_note, " (", a.n_slots(), " slots of ",
              format_bytes(a.slot_bytes()), whole, " read-ahead ", o.read_ahead ? "on" : "off", ")", tier_note,
              memory_note)};
}

}  // namespace

OpenedSource open_expert_source(const gguf::Reader& reader, const model::ModelConfig& c,
                                backend::Backend& backend, const SourceOptions& o) {
  uint64_t expert_bytes = 0, all_bytes = 0;
  for (const auto& t : reader.tensors()) {
    all_bytes += t.nbytes;
    if (t.name.ends_with("_exps.weight")) expert_bytes += t.nbytes;
  }
  const uint64_t trunk_bytes = all_bytes - expert_bytes;
  if (!has_expert_stacks(reader) || o.budget_bytes || !o.pack.empty())
    return streamed(reader, c, open_model_pack(reader, c, o.pack), trunk_bytes, backend, o);
  // Under a memory limit the experts are mapped only when they fit what it leaves for them.
  uint64_t room = std::max(default_expert_budget(trunk_bytes), kMinDefaultBudget);
  if (const auto limit = memory_limit(o))
    room = std::min(room, split_memory(*limit, trunk_bytes, ReaderOptions{}.threads, 0).arena);
  const bool fits = expert_bytes <= room;
  if (!fits && std::filesystem::exists(pack_path_for(reader)))
    return streamed(reader, c, open_model_pack(reader, c), trunk_bytes, backend, o);
  return {make_mapped_source(reader, c, backend), "mapped from the GGUF"};
}

}  // namespace strata::experts
