// Helpers for the streaming expert cache's tests: records of a made-up layout served from memory
// (MemoryIo), routings, a layer run that checks every expert's weights show its own record's
// bytes, and a backend whose expert slots copy like CUDA's (reads land aside, ready() publishes).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "experts/streaming_source.h"
#include "util/error.h"

namespace strata::experts::testing {

using backend::Routing;

// Records of a made-up layout (gate/up/down F32 [rows x cols]), each filled with a byte pattern
// of its (layer, expert); reads land when waited for, in submission order.
class MemoryIo : public RecordIo {
 public:
  MemoryIo(const Layout& layout, int n_layers, int n_experts)
      : layout_(layout), n_experts_(n_experts) {
    for (int l = 0; l < n_layers; ++l)
      for (int e = 0; e < n_experts; ++e)
        records_.push_back(std::vector<uint8_t>(layout.record_bytes, uint8_t(l * 16 + e)));
  }
  Id submit(int layer, int expert, void* dst, Priority p) override {
    submitted.push_back({layer, expert, p == Priority::Urgent});
    pending_[next_] = {layer, expert, dst};
    return next_++;
  }
  void wait(Id id) override {
    const Pending r = pending_.at(id);
    pending_.erase(id);
    if (corrupt.count({r.layer, r.expert}))
      fail("pack: record (layer ", r.layer, ", expert ", r.expert, ") has a bad checksum");
    std::memcpy(r.dst, records_[size_t(r.layer * n_experts_ + r.expert)].data(),
                layout_.record_bytes);
    bytes_ += layout_.record_bytes;
  }
  bool cancel(Id id) override {
    ++cancels;
    return pending_.erase(id) == 1;
  }
  void promote(Id) override { ++promotions; }
  Counters counters() const override { return {bytes_, 0.0}; }

  struct Submitted {
    int layer, expert;
    bool urgent;
  };
  std::vector<Submitted> submitted;
  std::set<std::pair<int, int>> corrupt;
  int cancels = 0, promotions = 0;

 private:
  struct Pending {
    int layer, expert;
    void* dst;
  };
  Layout layout_;
  int n_experts_;
  std::vector<std::vector<uint8_t>> records_;
  std::map<Id, Pending> pending_;
  Id next_ = 1;
  uint64_t bytes_ = 0;
};

inline Layout tiny_layout() {
  Layout l;
  l.gate = {quant::Type::F32, 4, 8, 32, 0};
  l.up = {quant::Type::F32, 4, 8, 32, 128};
  l.down = {quant::Type::F32, 8, 4, 16, 256};
  l.record_bytes = 4096;
  return l;
}

inline Routing routing_of(std::vector<int32_t> experts, int64_t k) {
  Routing r;
  r.top_k = k;
  r.weights.assign(experts.size(), 0.5f);
  r.experts = std::move(experts);
  return r;
}

// Runs one layer and returns the groups, checking each expert's weights point at its bytes.
inline std::vector<std::vector<int32_t>> run_layer(StreamingSource& src, int layer, const Routing& r) {
  std::vector<std::vector<int32_t>> groups;
  src.layer(layer, r, [&](const ExpertGroup& g) {
    groups.emplace_back(g.ids.begin(), g.ids.end());
    for (int32_t e : g.ids) {
      const auto* gate = static_cast<const uint8_t*>(g.weights[size_t(e)].gate.data);
      EXPECT_EQ(gate[0], uint8_t(layer * 16 + e)) << "layer " << layer << " expert " << e;
      const auto* down = static_cast<const uint8_t*>(g.weights[size_t(e)].down.data);
      EXPECT_EQ(down - gate, 256);
      EXPECT_EQ(g.weights[size_t(e)].down.rows, 8);
    }
  });
  return groups;
}

// Slots whose memory is not where reads land, as on CUDA: each read lands in a buffer of its own,
// fill() and fill_from() copy it aside and only ready() makes it the slot's content, so a weight
// that pointed at a slot before its fill or without ready(), or a fill of a read that never
// landed, would show the wrong bytes.
class CopyingSlots : public backend::ExpertSlots {
 public:
  CopyingSlots(size_t count, size_t bytes)
      : bytes_(bytes), data_(count * bytes, 0xCD), landing_(count) {}
  size_t count() const override { return landing_.size(); }
  size_t slot_bytes() const override { return bytes_; }
  const uint8_t* data(int32_t s) const override { return data_.data() + size_t(s) * bytes_; }
  void* landing(int32_t s) override {
    auto& l = landing_[size_t(s)];
    if (l.empty()) l.assign(bytes_, 0xAB);
    return l.data();
  }
  void fill(int32_t s, size_t n) override {
    auto& l = landing_[size_t(s)];
    EXPECT_FALSE(l.empty()) << "fill of slot " << s << " without a landed read";
    EXPECT_NE(l[0], 0xAB) << "fill of slot " << s << " before its read landed";
    copied_[s].assign(l.begin(), l.begin() + ptrdiff_t(n));
    l.clear();
    ++fills;
  }
  uint64_t fill_from(int32_t s, const void* host, size_t n) override {
    const auto* p = static_cast<const uint8_t*>(host);
    copied_[s].assign(p, p + n);
    ++fills;
    ++tier_copies;
    return uint64_t(fills);
  }
  void ready(int32_t s) override {
    const auto it = copied_.find(s);
    if (it == copied_.end()) return;
    std::memcpy(data_.data() + size_t(s) * bytes_, it->second.data(), it->second.size());
    copied_.erase(it);
  }
  void discard(int32_t s) override {
    landing_[size_t(s)].clear();
    ++discards;
  }
  void recycle(int32_t) override { ++recycles; }
  Counters counters() const override { return {uint64_t(fills) * bytes_, 0.5}; }

  int fills = 0, discards = 0, recycles = 0, tier_copies = 0;

 private:
  size_t bytes_;
  std::map<int32_t, std::vector<uint8_t>> copied_;  // per slot: its copy not yet made ready
  std::vector<uint8_t> data_;
  std::vector<std::vector<uint8_t>> landing_;
};

class CopyingBackend : public backend::CpuBackend {
 public:
  CopyingBackend() : CpuBackend(1) {}
  std::unique_ptr<backend::ExpertSlots> alloc_expert_slots(size_t count, size_t bytes) override {
    auto s = std::make_unique<CopyingSlots>(count, bytes);
    slots = s.get();
    return s;
  }
  std::unique_ptr<backend::ExpertSlots> alloc_host_tier(size_t count, size_t bytes) override {
    return backend::make_host_expert_slots(count, bytes);
  }
  CopyingSlots* slots = nullptr;
};

}  // namespace strata::experts::testing
