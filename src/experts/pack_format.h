// The on-disk encoding of a `.experts` pack, shared by the reader (pack.cpp) and the writer
// (pack_write.cpp). All integers little-endian; docs/PACK.md has the table.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "experts/pack.h"

namespace strata::experts::format {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'X', 'P'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 128;
constexpr uint64_t kLayerEntryBytes = 128;  // record_bytes + 3 parts of 40 bytes
constexpr uint64_t kPartEntryBytes = 40;
constexpr uint64_t kIndexEntryBytes = 24;    // offset, length, checksum
constexpr uint64_t kHeaderChecksumAt = 120;  // XXH3 of header bytes [0, 120)
// Sanity bounds on counts; a real model has < 100 layers and <= 512 experts.
constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxExperts = 65536;
// At most this many records (an index of 96 MiB), so a header cannot make open() allocate more
// however large a (sparse) file claims to be. The flagship has 48 x 512 = 24,576.
constexpr uint64_t kMaxRecords = uint64_t(1) << 22;
// How many bytes of each expert-0 part feed the source id.
constexpr uint64_t kIdSampleBytes = 4096;

// Header field offsets.
enum : uint64_t {
  kAtMagic = 0,
  kAtVersion = 8,
  kAtHeaderBytes = 12,
  kAtLayers = 16,
  kAtExperts = 20,
  kAtSourceId = 24,
  kAtLayersOffset = 32,
  kAtIndexOffset = 40,
  kAtDataOffset = 48,
  kAtTablesChecksum = 56,
  kAtReserved = 64,  // 56 zero bytes up to kHeaderChecksumAt
};

inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Where the tables and the first record go for a pack of these counts.
struct Geometry {
  uint64_t layers_offset = kHeaderBytes;
  uint64_t index_offset = 0;
  uint64_t index_end = 0;
  uint64_t data_offset = 0;
};
inline Geometry geometry(uint64_t n_layers, uint64_t n_experts) {
  Geometry g;
  g.index_offset = g.layers_offset + n_layers * kLayerEntryBytes;
  g.index_end = g.index_offset + n_layers * n_experts * kIndexEntryBytes;
  g.data_offset = align_up(g.index_end, kPackAlignment);
  return g;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// Feeds the source id (docs/PACK.md, "Source id") one layer at a time.
class SourceIdHasher {
 public:
  SourceIdHasher();
  ~SourceIdHasher();
  SourceIdHasher(const SourceIdHasher&) = delete;
  SourceIdHasher& operator=(const SourceIdHasher&) = delete;
  // `parts[i]` points at expert 0's gate, up, down bytes (at least min(bytes, 4096) of each).
  void add_layer(const Layout& layout, int n_experts, const uint8_t* const parts[3]);
  uint64_t digest() const;

 private:
  void* state_;
};

}  // namespace strata::experts::format
