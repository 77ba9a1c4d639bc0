// Keeping read-only file mappings resident (the trunk of a model whose experts stream): under a
// memory cap the kernel would otherwise evict mapped trunk pages to make room for the expert
// arena and read them back on the next token (docs/EXPERT_CACHE.md, "Memory under a limit").
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace strata::util {

struct ByteRange {
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
};

struct LockResult {
  uint64_t asked = 0;   // page-rounded bytes of the merged ranges
  uint64_t locked = 0;  // of those, locked
  std::string failure;  // why the rest could not be locked (RLIMIT_MEMLOCK, ...); empty if none
};

// mlock()s the pages under `ranges` (merged and page-aligned first), raising the soft
// RLIMIT_MEMLOCK to the hard limit first. Stops at the first range the kernel refuses. The locks
// end when the memory is unmapped.
LockResult lock_in_memory(std::span<const ByteRange> ranges);

}  // namespace strata::util
