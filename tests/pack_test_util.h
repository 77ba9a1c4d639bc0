// Helpers for the pack and expert-reader tests: a GGUF holding only expert stacks (random bytes
// of a chosen type), its pack, and a pack image whose checksums can be resealed after an edit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experts/pack.h"
#include "experts/pack_format.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "model/config.h"
#include "test_util.h"

namespace strata::experts::testing {

using strata::testing::error_of;

using gguf::testing::read_bytes;
using gguf::testing::TempDir;
using gguf::testing::write_bytes;

struct TinyExperts {
  int layers = 2;
  int experts = 4;
  int64_t embd = 64;  // gate/up cols, down rows
  int64_t ff = 32;    // gate/up rows, down cols
  quant::Type type = quant::Type::Q8_0;
  quant::Type down_type = quant::Type::Q8_0;
  uint64_t seed = 1;
};

// `layers` x `experts` experts with gate/up [64 x 256] in `type` and down [256 x 64] in q8_0.
inline TinyExperts tiny_experts(int layers, int experts, quant::Type type = quant::Type::Q8_0) {
  TinyExperts t;
  t.layers = layers;
  t.experts = experts;
  t.embd = 256;
  t.ff = 64;
  t.type = type;
  return t;
}

// blk.L.ffn_{gate,up,down}_exps.weight of every layer, filled with seeded bytes.
inline void write_expert_gguf(const std::string& path, const TinyExperts& t) {
  gguf::Writer w(path);
  w.set("general.architecture", gguf::Value::string("qwen3moe"));
  for (int l = 0; l < t.layers; ++l) {
    w.add_tensor(expert_stack_name(l, 0), t.type, {t.embd, t.ff, t.experts});
    w.add_tensor(expert_stack_name(l, 1), t.type, {t.embd, t.ff, t.experts});
    w.add_tensor(expert_stack_name(l, 2), t.down_type, {t.ff, t.embd, t.experts});
  }
  w.begin_data();
  uint64_t state = t.seed * 0x9E3779B97F4A7C15ull + 1;
  for (const auto& info : w.tensors()) {
    std::vector<uint8_t> bytes(info.nbytes);
    for (auto& b : bytes) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b = uint8_t(state >> 56);
    }
    w.write(bytes.data(), bytes.size());
  }
  w.finish();
}

// The config check_model compares a pack with.
inline model::ModelConfig tiny_config(const TinyExperts& t) {
  model::ModelConfig c;
  c.n_layer = t.layers;
  c.n_expert = t.experts;
  c.n_embd = t.embd;
  c.n_ff_exp = t.ff;
  return c;
}

// Recomputes the header and table checksums of a pack image after a test edited a field, so the
// field's own check (not a checksum) is what fails.
inline void reseal(std::vector<uint8_t>& b) {
  using namespace format;
  const uint32_t layers = load<uint32_t>(b.data() + kAtLayers);
  const uint32_t experts = load<uint32_t>(b.data() + kAtExperts);
  const Geometry g = geometry(layers, experts);
  if (g.index_end <= b.size() && layers <= kMaxLayers && experts <= kMaxExperts)
    store<uint64_t>(b.data() + kAtTablesChecksum,
                    checksum(b.data() + g.layers_offset, size_t(g.index_end - g.layers_offset)));
  store<uint64_t>(b.data() + kHeaderChecksumAt, checksum(b.data(), kHeaderChecksumAt));
}

// Byte offsets of fields in a pack image.
inline uint64_t layer_entry(uint32_t layer) {
  return format::kHeaderBytes + layer * format::kLayerEntryBytes;
}
inline uint64_t part_entry(uint32_t layer, int part) {
  return layer_entry(layer) + 8 + uint64_t(part) * format::kPartEntryBytes;
}
inline uint64_t index_entry(const std::vector<uint8_t>& b, uint64_t record) {
  const uint32_t layers = format::load<uint32_t>(b.data() + format::kAtLayers);
  return format::kHeaderBytes + layers * format::kLayerEntryBytes +
         record * format::kIndexEntryBytes;
}

// The message of the strata::Error opening `bytes` as a pack throws, or "(no error)".
inline std::string pack_error(const std::vector<uint8_t>& bytes) {
  return error_of([&] { Pack::from_memory(bytes.data(), bytes.size(), "t.experts"); });
}

}  // namespace strata::experts::testing
