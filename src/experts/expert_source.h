// Where a layer's routed experts come from. The forward pass reaches expert weights only through
// this interface: the file-mapped stacks when everything fits in memory, or the streaming expert
// cache (arena slots filled from the .experts pack, streaming_source.h;
// docs/DESIGN.md, "Expert arena, tiers and I/O").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "experts/expert_reader.h"

namespace strata::gguf {
class Reader;
}

namespace strata::model {
struct ModelConfig;
}

namespace strata::experts {

// What the expert cache did, cumulative since it started (the mapped source has none).
struct CacheStats {
  uint64_t hits = 0;              // routed (layer, expert) lookups of a window found resident
  uint64_t misses = 0;            // ... read urgently
  uint64_t bytes_read = 0;        // record bytes delivered by the reader (misses and read-ahead)
  double read_seconds = 0;        // reader wall time with a read in flight
  double stall_seconds = 0;       // forward time spent waiting for records
  uint64_t read_ahead_reads = 0;  // read-ahead requests queued
  uint64_t read_ahead_predicted = 0;  // routed experts of a layer that its read-ahead guess named
  uint64_t read_ahead_routed = 0;     // routed experts of layers that had a guess
  uint64_t read_ahead_skipped = 0;    // guesses scored but not read: recent accuracy too low
  uint64_t read_ahead_bytes = 0;         // record bytes of the read-ahead requests queued
  uint64_t read_ahead_useful_bytes = 0;  // ... whose expert was routed to before it left the arena
  uint64_t read_ahead_capped = 0;        // guessed missing experts not read: out of read-ahead credit
  uint64_t chunked_layers = 0;        // layer windows computed in more than one group
  uint64_t evictions = 0;
  uint64_t early_retirements = 0;  // limbo retired before the window boundary (over budget)
  uint64_t h2d_bytes = 0;          // record bytes copied into device slots (0: host slots)
  double h2d_seconds = 0;          // copy-engine time of those copies
  uint64_t host_hits = 0;   // misses of the device arena that the host tier held (no read)
  uint64_t host_reads = 0;  // records read from the pack into the host tier (misses, read-ahead)
  // The per-layer handshakes of windows on a device (BackendCounters): how many, and the device
  // time spent waiting for the host's answer (0 where slots are host memory).
  uint64_t handshakes = 0;
  double handshake_seconds = 0;

  double hit_rate() const;             // 0..1, 0 without lookups
  double read_ahead_accuracy() const;  // read_ahead_predicted / read_ahead_routed
  // read_ahead_useful_bytes / read_ahead_bytes: bytes read ahead that became hits per byte read
  // ahead; 0 without read-ahead.
  double read_ahead_value() const;
  // host_hits / misses: the device misses the host tier answered; 0 without misses.
  double host_hit_rate() const;
  // Microseconds of device time per handshake; 0 without handshakes.
  double handshake_us() const;
  // These counters minus `earlier`'s (the work between two snapshots).
  CacheStats since(const CacheStats& earlier) const;
  // "expert cache: 812 hits, 40 misses (95.3%), 8.6 MB read at 1.20 GB/s, stall 12.0 ms,
  // read-ahead 31 reads guessed 77.5% of routed experts (0 guesses not read), 80.6% of its bytes
  // became hits (0 reads capped), 0 chunked layers, 71 evictions".
  std::string summary() const;
};

// What the cache looked like at its last window boundary, for readers on other threads (the
// server's live expert-cache panel); the counters and residency of one moment.
struct CacheSnapshot {
  CacheStats stats;
  uint64_t windows = 0;  // window boundaries so far
  int n_layers = 0, n_experts = 0;
  std::vector<uint8_t> resident;  // [layer * n_experts + expert]: 1 when it holds a slot
};

// Experts of one layer resident together, for one compute step.
struct ExpertGroup {
  // Indexed by expert id; the entries of `ids` are valid for the duration of the call, the
  // others may be empty.
  std::span<const backend::ExpertWeights> weights;
  std::span<const int32_t> ids;  // ascending
  bool whole = false;            // every expert the routing names is in this one group
};

class ExpertSource {
 public:
  using GroupFn = std::function<void(const ExpertGroup& group)>;

  virtual ~ExpertSource() = default;

  // Model::forward brackets each window with these (end_window also when the window throws).
  virtual void begin_window() {}
  virtual void end_window() {}

  // Every expert of `layer`, indexed by id, when all of them are always resident (nothing to
  // fetch, so the forward pass need not show the routing to the host); empty otherwise.
  virtual std::span<const backend::ExpertWeights> all_resident(int /*layer*/) const { return {}; }

  // Makes the experts `routing` names at `layer` resident (a cache waits for misses here: the
  // handshake) and hands them to `fn`: in one group when they fit at once, else in several, each
  // expert in exactly one group. Throws strata::Error when a record cannot be read.
  virtual void layer(int layer, const backend::Routing& routing, const GroupFn& fn) = 0;

  // Read-ahead: whether the source wants guesses, and a guess at `layer`'s routing (the next
  // layer's router applied to the current layer's MoE input). Called from inside the group
  // function of layer `layer - 1`. Never changes what is computed.
  virtual bool wants_read_ahead() const { return false; }
  virtual void read_ahead(int /*layer*/, const backend::Routing& /*guess*/) {}

  virtual std::optional<CacheStats> stats() const { return std::nullopt; }
  // The state published at the last window boundary; any thread may call it. Empty when the
  // source has no cache.
  virtual std::optional<CacheSnapshot> snapshot() const { return std::nullopt; }

  // Which of `layer`'s experts the cache holds (out[e] = 1), for cache-conditional routing;
  // false when the source has no cache (every expert is at hand).
  virtual bool residency(int /*layer*/, std::span<uint8_t> /*out*/) const { return false; }
};

// Every expert as a slice of the file's [ne0, ne1, n_expert] stacks (ffn_{gate,up,down}_exps),
// prepared once through Backend::weight: one group per layer. Throws strata::Error naming a
// missing stack.
std::unique_ptr<ExpertSource> make_mapped_source(const gguf::Reader& reader,
                                                 const model::ModelConfig& config,
                                                 backend::Backend& backend);

// How Model::load picks the routed experts' source (docs/EXPERT_CACHE.md, "Which source"):
// - a trunk-only GGUF (no expert stacks): streamed from its pack, which must exist;
// - a full GGUF with a budget or a pack path given: streamed from the pack;
// - a full GGUF otherwise: mapped, unless its experts exceed the default budget and a pack sits
//   where pack_path_for looks, then streamed with the default budget.
struct SourceOptions {
  std::optional<uint64_t> budget_bytes;  // --expert-budget
  std::string pack;                      // --pack; empty: the GGUF's strata.experts.pack or
                                         // MODEL.gguf.experts
  bool read_ahead = true;                // --read-ahead
  // --host-budget: the host tier's size where the expert slots are device memory (0: none); unset:
  // when the pack does not fit the device budget, min(the pack, half of MemAvailable, half of the
  // memory limit).
  std::optional<uint64_t> host_budget_bytes;
  bool host_fill = true;  // --host-fill: fill the host tier from the pack at start-up
  FileIoWrapper io_wrapper;              // wraps the pack reader's I/O (fault injection)
  // --memory-limit: trunk, arena, readers and activations stay inside it (memory_limit.h); unset:
  // the cgroup's limit when one is set.
  std::optional<uint64_t> memory_limit;
};

struct OpenedSource {
  std::unique_ptr<ExpertSource> source;
  std::string description;  // "mapped from the GGUF" or "streamed from PACK, budget ..."
};

// Throws strata::Error for a missing pack (saying how to make one), a pack that does not match
// the model, or a budget below one record.
OpenedSource open_expert_source(const gguf::Reader& reader, const model::ModelConfig& config,
                                backend::Backend& backend, const SourceOptions& options);

}  // namespace strata::experts
