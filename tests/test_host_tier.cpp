// The expert cache's host tier (experts/host_tier.h) under the streaming source, over in-memory
// records and CPU slots that copy like CUDA's: device misses the tier holds are copied from it
// without a read, every record is read from the pack at most once while the tier holds it, the
// device arena's decisions do not change, read-ahead goes through the tier, the start-up fill, and
// failures (a bad record, a group larger than the tier, a backend with no device).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "experts/streaming_source.h"
#include "streaming_test_util.h"
#include "test_util.h"

namespace strata::experts {
namespace {

using strata::testing::error_of;
using testing::CopyingBackend;
using testing::MemoryIo;
using testing::routing_of;
using testing::run_layer;
using testing::tiny_layout;

constexpr int kLayers = 2, kExperts = 8;

struct Tiered {
  std::unique_ptr<CopyingBackend> backend = std::make_unique<CopyingBackend>();
  MemoryIo* io = nullptr;
  std::unique_ptr<StreamingSource> source;
};

// `device` slots (no reserve) and a tier of `tier` slots (0: none).
Tiered tiered(size_t device, size_t tier, bool read_ahead = false) {
  Tiered t;
  auto io = std::make_unique<MemoryIo>(tiny_layout(), kLayers, kExperts);
  t.io = io.get();
  StreamingOptions o;
  o.budget_bytes = device * 4096;
  o.host_budget_bytes = tier * 4096;
  o.read_ahead = read_ahead;
  o.reserve = 0;
  o.backend = t.backend.get();
  t.source = std::make_unique<StreamingSource>(std::vector<Layout>(kLayers, tiny_layout()), kExperts,
                                               4096, std::move(io), o);
  return t;
}

void window(StreamingSource& src, int layer, std::vector<int32_t> experts) {
  src.begin_window();
  run_layer(src, layer, routing_of(std::move(experts), 2));
  src.end_window();
}

TEST(HostTier, DeviceMissesTheTierHoldsAreCopiedWithoutReads) {
  Tiered t = tiered(3, 16);
  for (int round = 0; round < 3; ++round) {
    window(*t.source, 0, {1, 2});
    window(*t.source, 1, {3, 4});
  }
  const CacheStats s = *t.source->stats();
  EXPECT_EQ(t.io->submitted.size(), 4u) << "each record is read from the pack once";
  EXPECT_EQ(s.host_reads, 4u);
  EXPECT_GT(s.misses, 4u) << "three device slots for four experts: the device keeps missing";
  EXPECT_EQ(s.host_hits, s.misses - 4);
  EXPECT_EQ(uint64_t(t.backend->slots->tier_copies), s.misses) << "every device miss is a copy from the tier";
  EXPECT_EQ(s.bytes_read, 4u * 4096);
  EXPECT_NEAR(s.host_hit_rate(), double(s.misses - 4) / double(s.misses), 1e-12);
  EXPECT_NE(s.summary().find("host tier "), std::string::npos) << s.summary();
}

TEST(HostTier, TheDeviceArenaDecidesAsWithoutATier) {
  // Read-ahead off: the tier changes where bytes come from, never which device slot holds what.
  Tiered plain = tiered(5, 0), with = tiered(5, 12);
  std::mt19937 rng(7);
  for (int w = 0; w < 40; ++w) {
    const int layer = int(rng() % kLayers);
    std::vector<int32_t> experts;
    for (int i = 0; i < 3; ++i) experts.push_back(int32_t(rng() % kExperts));
    window(*plain.source, layer, experts);
    window(*with.source, layer, experts);
    for (int l = 0; l < kLayers; ++l)
      for (int e = 0; e < kExperts; ++e)
        ASSERT_EQ(plain.source->arena().slot_of(l, e), with.source->arena().slot_of(l, e))
            << "window " << w << " layer " << l << " expert " << e;
  }
  const CacheStats a = *plain.source->stats(), b = *with.source->stats();
  EXPECT_EQ(a.hits, b.hits);
  EXPECT_EQ(a.misses, b.misses);
  EXPECT_EQ(a.evictions, b.evictions);
  EXPECT_LT(b.bytes_read, a.bytes_read) << "the tier answered some misses";
  EXPECT_EQ(b.host_hits + b.host_reads, b.misses) << "a 12-slot tier is larger than any group";
}

TEST(HostTier, TheStartUpFillReadsRankedExpertsFirstThenExpertByExpertAndSkipsBadRecords) {
  Tiered t = tiered(2, 4);
  EXPECT_EQ(t.source->load_host_tier(std::vector<ExpertKey>{{1, 7}}).records, 4u);
  const Arena& tier = t.source->host_tier()->arena();
  for (const ExpertKey k : {ExpertKey{1, 7}, ExpertKey{0, 0}, ExpertKey{1, 0}, ExpertKey{0, 1}})
    EXPECT_NE(tier.slot_of(k.layer, k.expert), Arena::kMiss) << k.layer << "/" << k.expert;
  EXPECT_EQ(tier.slot_of(1, 1), Arena::kMiss);
  EXPECT_EQ(t.source->stats()->host_reads, 0u) << "start-up reads are not misses";

  Tiered full = tiered(3, 16, true);
  EXPECT_TRUE(full.source->wants_read_ahead());
  full.io->corrupt.insert({1, 6});
  const HostTier::Loaded loaded = full.source->load_host_tier({});
  EXPECT_EQ(loaded.records, size_t(kLayers * kExperts - 1));
  EXPECT_EQ(loaded.failed, 1u);
  EXPECT_NE(loaded.first_error.find("bad checksum"), std::string::npos) << loaded.first_error;
  EXPECT_EQ(full.source->host_tier()->arena().slot_of(1, 6), Arena::kMiss) << "an unreadable record stays out";
  full.source->begin_window();
  EXPECT_NE(error_of([&] { run_layer(*full.source, 1, routing_of({6}, 1)); }).find("bad checksum"),
            std::string::npos)
      << "a window that routes to it reads it again and fails";
  full.source->end_window();
  full.io->corrupt.clear();
  EXPECT_TRUE(full.source->wants_read_ahead()) << "(1, 6) is not in the tier";
  const size_t reads = full.io->submitted.size();
  for (int w = 0; w < 6; ++w) window(*full.source, w % kLayers, {int32_t(w % kExperts), int32_t((w + 3) % kExperts)});
  EXPECT_EQ(full.io->submitted.size(), reads + 1) << "the tier answers every miss but (1, 6), read once more";
  const CacheStats s = *full.source->stats();
  EXPECT_EQ(s.host_hits + 2, s.misses) << "(1, 6) missed twice: failed, then read";
  EXPECT_EQ(s.host_reads, 2u);
  EXPECT_FALSE(full.source->wants_read_ahead()) << "a tier holding every record needs no guesses";
  EXPECT_NE(error_of([&] { full.source->load_host_tier(std::vector<ExpertKey>{{2, 0}}); }).find("outside the pack"),
            std::string::npos);
}

TEST(HostTier, ReadAheadReadsIntoTheTierAndNeverCopiesAhead) {
  Tiered t = tiered(3, 16, true);
  t.source->begin_window();
  t.source->layer(0, routing_of({0}, 1), [&](const ExpertGroup&) { t.source->read_ahead(1, routing_of({5}, 1)); });
  ASSERT_EQ(t.io->submitted.size(), 2u);
  EXPECT_FALSE(t.io->submitted.back().urgent) << "a guess is read at low priority";
  EXPECT_EQ(t.source->arena().slot_of(1, 5), Arena::kMiss) << "a guess the tier lacks lands in the tier only";
  EXPECT_NE(t.source->host_tier()->arena().slot_of(1, 5), Arena::kMiss);
  run_layer(*t.source, 1, routing_of({5}, 1));
  t.source->end_window();
  CacheStats s = *t.source->stats();
  EXPECT_EQ(s.host_hits, 1u);
  EXPECT_EQ(s.read_ahead_useful_bytes, 4096u) << "the guess became a tier hit";
  EXPECT_EQ(t.io->submitted.size(), 2u);

  // Evicted from the device, guessed again: the tier holds it, so nothing is read or copied until
  // it is used.
  for (int32_t e : {1, 2, 3}) window(*t.source, 0, {e});
  ASSERT_EQ(t.source->arena().slot_of(1, 5), Arena::kMiss);
  const int copies = t.backend->slots->tier_copies;
  t.source->begin_window();
  t.source->layer(0, routing_of({3}, 1), [&](const ExpertGroup&) { t.source->read_ahead(1, routing_of({5}, 1)); });
  EXPECT_EQ(t.backend->slots->tier_copies, copies);
  EXPECT_EQ(t.source->arena().slot_of(1, 5), Arena::kMiss);
  const uint64_t host_hits = t.source->stats()->host_hits;
  run_layer(*t.source, 1, routing_of({5}, 1));
  t.source->end_window();
  EXPECT_EQ(t.source->stats()->host_hits, host_hits + 1);
  EXPECT_EQ(t.backend->slots->tier_copies, copies + 1);
  EXPECT_EQ(t.io->submitted.size(), 5u) << "experts 1 and 2 of layer 0 were read; 5 never again";
}

TEST(HostTier, ABadRecordIsAClearErrorAndLeavesNoExpertWithoutItsBytes) {
  Tiered t = tiered(6, 16);
  t.io->corrupt.insert({1, 3});
  t.source->begin_window();
  const std::string err = error_of([&] { run_layer(*t.source, 1, routing_of({2, 3, 4}, 3)); });
  t.source->end_window();
  EXPECT_NE(err.find("bad checksum"), std::string::npos) << err;
  EXPECT_EQ(t.source->arena().slot_of(1, 3), Arena::kMiss);
  EXPECT_EQ(t.source->host_tier()->arena().slot_of(1, 3), Arena::kMiss);
  EXPECT_NE(t.source->arena().slot_of(1, 2), Arena::kMiss) << "copied before 3 failed";
  EXPECT_EQ(t.source->arena().slot_of(1, 4), Arena::kMiss) << "its copy was never queued";
  EXPECT_EQ(t.source->arena().held(), 0u);
  t.io->corrupt.clear();
  window(*t.source, 1, {2, 3, 4});  // run_layer checks every expert's bytes
  const CacheStats s = *t.source->stats();
  EXPECT_EQ(s.host_hits, 1u) << "4 was in the tier (its read still pending); 3 is read again";
  EXPECT_EQ(s.host_reads, 4u);
}

TEST(HostTier, AGroupLargerThanTheTierReadsPastIt) {
  Tiered t = tiered(8, 1);
  window(*t.source, 0, {1, 2, 3});
  window(*t.source, 1, {1, 2, 3});
  EXPECT_EQ(t.io->submitted.size(), 6u);
  const CacheStats s = *t.source->stats();
  EXPECT_EQ(s.host_reads, 2u) << "one miss a layer got the tier's slot, the rest were read past it";
  EXPECT_EQ(s.misses, 6u);
}

TEST(HostTier, NeedsABackendWhoseSlotsAreDeviceMemory) {
  StreamingOptions o;
  o.budget_bytes = 2 * 4096;
  o.host_budget_bytes = 4 * 4096;
  const auto make = [&] {
    StreamingSource(std::vector<Layout>{tiny_layout()}, kExperts, 4096,
                    std::make_unique<MemoryIo>(tiny_layout(), 1, kExperts), o);
  };
  EXPECT_NE(error_of(make).find("--device cuda"), std::string::npos);
  backend::CpuBackend cpu(1);
  o.backend = &cpu;
  EXPECT_NE(error_of(make).find("host memory already"), std::string::npos);
  CopyingBackend copying;
  o.backend = &copying;
  o.host_budget_bytes = 100;
  EXPECT_NE(error_of(make).find("below one expert record"), std::string::npos);
}

}  // namespace
}  // namespace strata::experts
