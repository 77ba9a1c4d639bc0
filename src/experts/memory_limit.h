// Memory under a cap (docs/EXPERT_CACHE.md, "Memory under a limit"): the limit the user gives
// (--memory-limit) or the process's cgroup sets, and how it is split between the trunk, the
// expert arena, the readers and the activations, so that all of them together stay inside it
// and the default expert budget is what is left.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::experts {

struct MemoryLimit {
  uint64_t bytes = 0;
  std::string source;  // "--memory-limit" or the cgroup file that set it
};

// A cgroup limit file's text: v2 memory.max ("max" or bytes) or v1 memory.limit_in_bytes (bytes;
// a value of 2^62 or more is v1's "unlimited"). nullopt for no limit. Throws strata::Error naming
// `path` when the text is neither.
std::optional<uint64_t> parse_cgroup_limit(std::string_view text, const std::string& path);

// The memory limit of the process's cgroup: the smallest limit from its own cgroup up to the root
// of its hierarchy, in the v2 hierarchy (memory.max) and the v1 memory hierarchy
// (memory.limit_in_bytes), whichever are mounted. `proc_self` is where "cgroup" and "mountinfo"
// are read, and `root` is put before every mount point; tests replace both with a temporary tree.
// nullopt when no limit is set or no hierarchy is found.
std::optional<MemoryLimit> cgroup_memory_limit(const std::string& proc_self = "/proc/self",
                                               const std::string& root = "");

// What a limit holds. arena is what is left once the rest is set aside; never negative.
struct MemorySplit {
  MemoryLimit limit;
  uint64_t trunk = 0;        // resident non-expert weights (locked where allowed)
  uint64_t readers = 0;      // reader threads' stacks and rings
  uint64_t activations = 0;  // activations, KV cache and recurrent state, the binary, the heap
  uint64_t arena = 0;        // the expert cache

  // "memory limit 11.00 GiB (--memory-limit): trunk 2.48 GiB + expert cache 8.05 GiB + readers
  // 8.00 MiB + activations and state 469.33 MiB"
  std::string describe() const;
};

// Set aside for activations, the KV cache, the state and the rest of the process:
// max(384 MiB, limit / 24).
uint64_t activation_margin(uint64_t limit_bytes);

// Splits `limit` for a trunk of `trunk_bytes` and `reader_threads` readers. Throws strata::Error
// naming the limit's source when what is left for the arena is below `min_arena` bytes.
MemorySplit split_memory(const MemoryLimit& limit, uint64_t trunk_bytes, int reader_threads,
                         uint64_t min_arena);

}  // namespace strata::experts
