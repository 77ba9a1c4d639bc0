// The expert cache's parts on their own: the chunked MoE ops (bitwise the one-step op), the
// arena's bookkeeping (LRU, pinned and held slots, limbo and its retirement order, the reserve),
// and the streaming source over an in-memory record source (groups that fit the budget, hits and
// misses, read-ahead accounting, a failing record). The model-level equality of streamed and
// mapped runs is in test_streaming_model.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "experts/arena.h"
#include "experts/streaming_source.h"
#include "test_quant_util.h"
#include "util/error.h"
#include "test_util.h"
#include "streaming_test_util.h"
#include "util/progress.h"

using strata::testing::error_of;

namespace strata::experts {
namespace {

using backend::ExpertWeights;
using backend::Routing;
using backend::Tensor;
using Floats = std::vector<float>;
using testing::CopyingBackend;
using testing::MemoryIo;
using testing::routing_of;
using testing::run_layer;
using testing::tiny_layout;


// ---------------------------------------------------------------------------------------------
// Chunked MoE ops.

struct OwnedExperts {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<ExpertWeights> weights;
};

OwnedExperts random_experts(int64_t E, int64_t n_embd, int64_t n_ff) {
  OwnedExperts o;
  o.bytes.reserve(size_t(3 * E));
  auto add = [&](quant::Type t, int64_t rows, int64_t cols, uint64_t seed) {
    o.bytes.push_back(quant::testing::random_weights(t, rows * cols, seed));
    return backend::Weight{t, o.bytes.back().data(), cols, rows, quant::row_bytes(t, cols)};
  };
  for (int64_t e = 0; e < E; ++e) {
    const quant::Type t = e % 3 == 1 ? quant::Type::Q8_0 : quant::Type::Q4_K;
    const auto gate = add(t, n_ff, n_embd, 10 + 3 * uint64_t(e));
    const auto up = add(t, n_ff, n_embd, 11 + 3 * uint64_t(e));
    const auto down = add(t, n_embd, n_ff, 12 + 3 * uint64_t(e));
    o.weights.push_back({gate, up, down});
  }
  return o;
}

Routing random_routing(int64_t T, int64_t K, int64_t E, uint64_t seed) {
  Routing r;
  r.top_k = K;
  uint64_t x = seed;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool(static_cast<size_t>(E));
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t j = 0; j < K; ++j) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const size_t pick = size_t(j) + size_t((x >> 33) % uint64_t(E - j));
      std::swap(pool[size_t(j)], pool[pick]);
      r.experts.push_back(pool[size_t(j)]);
      r.weights.push_back(0.1f + 0.8f * float((x >> 40) % 1000) / 1000.0f);
    }
  }
  return r;
}

Floats download(backend::Backend& be, const Tensor& t) {
  Floats out(size_t(t.rows * t.cols));
  be.download(t, out.data());
  return out;
}

TEST(ExpertCacheMoe, ChunkedOutputsThenCombineEqualOneStepBitwise) {
  const int64_t T = 12, K = 3, E = 8, n_embd = 256, n_ff = 256;
  const OwnedExperts ex = random_experts(E, n_embd, n_ff);
  const Routing routing = random_routing(T, K, E, 99);
  const Floats x = quant::testing::random_floats(T * n_embd, 5);
  const Floats y0 = quant::testing::random_floats(T * n_embd, 6);
  for (int threads : {1, 2}) {
    backend::CpuBackend be(threads);
    Tensor xt = be.alloc(T, n_embd), y = be.alloc(T, n_embd);
    be.upload(x.data(), xt);
    be.upload(y0.data(), y);
    backend::Ids ids = be.alloc_ids(T, K);
    Tensor weights = be.alloc(T, K);
    backend::upload_routing(be, routing, ids, weights);
    be.moe_experts(xt, ids, weights, ex.weights, y);
    const Floats want = download(be, y);

    // Expert groups of every size from 1 to all, as the streaming source hands them out; the
    // experts outside a group are absent from the span it passes.
    for (int64_t group = 1; group <= E; ++group) {
      be.upload(y0.data(), y);
      Tensor out = be.alloc(T * K, n_embd);
      for (int64_t first = 0; first < E; first += group) {
        std::vector<ExpertWeights> only(static_cast<size_t>(E));
        std::vector<int64_t> pairs;
        for (int64_t p = 0; p < T * K; ++p) {
          const int32_t e = routing.experts[size_t(p)];
          if (e >= first && e < first + group) {
            pairs.push_back(p);
            only[size_t(e)] = ex.weights[size_t(e)];
          }
        }
        be.moe_expert_outputs(xt, ids, pairs, only, out);
      }
      be.moe_combine(weights, out, y);
      const Floats got = download(be, y);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4))
          << threads << " threads, groups of " << group << " experts";
      be.release(out);
    }
    be.release(xt);
    be.release(y);
    be.release(weights);
    be.release_ids(ids);
  }
}

TEST(ExpertCacheMoe, PartialOpsRejectBadPairsAndShapes) {
  const int64_t T = 4, K = 2, E = 4, n_embd = 256, n_ff = 256;
  const OwnedExperts ex = random_experts(E, n_embd, n_ff);
  const Routing routing = random_routing(T, K, E, 3);
  backend::CpuBackend be(1);
  Tensor xt = be.alloc(T, n_embd), out = be.alloc(T * K, n_embd), y = be.alloc(T, n_embd);
  backend::Ids ids = be.alloc_ids(T, K);
  Tensor weights = be.alloc(T, K);
  backend::upload_routing(be, routing, ids, weights);
  const std::vector<int64_t> unsorted = {3, 1};
  EXPECT_NE(error_of([&] { be.moe_expert_outputs(xt, ids, unsorted, ex.weights, out); })
                .find("not above the one before"),
            std::string::npos);
  const std::vector<int64_t> outside = {T * K};
  EXPECT_NE(error_of([&] { be.moe_expert_outputs(xt, ids, outside, ex.weights, out); })
                .find("outside 0..7"),
            std::string::npos);
  EXPECT_NE(error_of([&] { be.moe_expert_outputs(xt, ids, {}, ex.weights, y); })
                .find("one row per routed pair"),
            std::string::npos);
  EXPECT_NE(error_of([&] { be.moe_combine(weights, y, y); }).find("moe_combine"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Arena.

Arena small_arena(size_t slots, size_t reserve) {
  return Arena(Arena::Options{2, 8, 4096, slots, reserve});
}

TEST(ExpertCacheArena, AssignsFreeSlotsInOrderAndEvictsLeastRecentlyUsed) {
  Arena a = small_arena(3, 0);
  EXPECT_EQ(a.assign(0, 1, {}), 0);
  EXPECT_EQ(a.assign(0, 2, {}), 1);
  EXPECT_EQ(a.assign(1, 5, {}), 2);
  EXPECT_EQ(a.slot_of(0, 2), 1);
  EXPECT_EQ(a.slot_of(1, 4), Arena::kMiss);
  a.touch(0);  // (0, 1) is now the most recently used; (0, 2) the least
  const int32_t s = a.assign(1, 0, {});
  EXPECT_EQ(s, 1);
  EXPECT_EQ(a.slot_of(0, 2), Arena::kMiss);
  EXPECT_EQ(a.slot_of(1, 0), 1);
  EXPECT_EQ(a.key_of(1), (ExpertKey{1, 0}));
  EXPECT_EQ(a.resident(), 3u);
  EXPECT_EQ(a.evictions(), 1u);
}

// The CPU backend's slots: host memory where reads land in place, 4 KiB-aligned.
TEST(ExpertCacheArena, HostSlotsAreAlignedAndReadsLandInPlace) {
  backend::CpuBackend be(1);
  const auto slots = be.alloc_expert_slots(3, 8192);
  EXPECT_EQ(slots->count(), 3u);
  EXPECT_EQ(slots->slot_bytes(), 8192u);
  EXPECT_FALSE(be.expert_memory_free()) << "the CPU backend's slots are host memory";
  for (int32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(uint64_t(reinterpret_cast<uintptr_t>(slots->data(s))) % Arena::kSlotAlignment, 0u);
    EXPECT_EQ(slots->landing(s), static_cast<const void*>(slots->data(s)));
  }
  EXPECT_EQ(slots->data(1) - slots->data(0), 8192);
  std::memset(slots->landing(2), 0x5a, 8192);
  slots->fill(2, 8192);
  EXPECT_EQ(slots->data(2)[8191], 0x5a);
  EXPECT_EQ(slots->counters().bytes, 0u) << "no copy where slots are host memory";
  EXPECT_NE(error_of([&] { be.alloc_expert_slots(2, 100); }).find("multiple of 4096"),
            std::string::npos);
}

TEST(ExpertCacheArena, PinnedAndHeldSlotsAreNeverEvicted) {
  Arena a = small_arena(3, 0);
  a.assign(0, 0, {});
  a.assign(0, 1, {});
  a.assign(0, 2, {});
  a.pin(0);
  a.hold(1);
  EXPECT_EQ(a.assign(1, 3, {}), 2);  // only slot 2 may go
  EXPECT_EQ(a.slot_of(0, 0), 0);
  EXPECT_EQ(a.slot_of(0, 1), 1);
  a.hold(2);
  EXPECT_EQ(a.assign(1, 4, {}), Arena::kMiss) << "every slot pinned or held";
  a.release_holds();
  EXPECT_EQ(a.assign(1, 4, {}), 1);  // (0, 1) is older than (1, 3)
  EXPECT_EQ(a.pinned_count(), 1u);
}

TEST(ExpertCacheArena, LimboSlotsWaitForTheWindowBoundaryAndRetireInEvictionOrder) {
  // 6 slots, 2 in reserve: at most 4 residents; evictions go to limbo.
  Arena a = small_arena(6, 2);
  for (int e = 0; e < 4; ++e) a.assign(0, e, {});
  EXPECT_EQ(a.free_count(), 2u);
  std::vector<int32_t> settled;
  const Arena::Settle record = [&](int32_t s) { settled.push_back(s); };
  EXPECT_EQ(a.assign(1, 0, record), 4);  // a free slot; (0, 0) in slot 0 goes to limbo
  EXPECT_EQ(a.slot_of(0, 0), Arena::kMiss);
  EXPECT_EQ(a.limbo_count(), 1u);
  EXPECT_EQ(a.assign(1, 1, record), 5);  // the last free slot, not the one in limbo
  EXPECT_EQ(a.limbo_count(), 2u);        // (0, 1) in slot 1 followed
  EXPECT_TRUE(settled.empty()) << "nothing retires inside the window while free slots remain";
  a.end_window(record);
  EXPECT_EQ(settled, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(a.free_count(), 2u);
  EXPECT_EQ(a.assign(1, 2, record), 0) << "retired slots are reused in eviction order";
  EXPECT_EQ(a.early_retirements(), 0u);
}

TEST(ExpertCacheArena, AWindowPastTheFreeSlotsRetiresLimboEarlyAtAFixedPoint) {
  Arena a = small_arena(4, 1);
  std::vector<int32_t> settled;
  const Arena::Settle record = [&](int32_t s) { settled.push_back(s); };
  std::vector<int32_t> slots;
  for (int e = 0; e < 8; ++e) slots.push_back(a.assign(0, e, record));
  // Three residents at most; each assignment after the third evicts one into limbo and the
  // next one that finds no free slot retires limbo first.
  EXPECT_EQ(slots, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_GT(a.early_retirements(), 0u);
  EXPECT_EQ(settled, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(a.resident(), 3u);
  // The same sequence gives the same placement: nothing but the sequence decides.
  Arena b = small_arena(4, 1);
  for (int e = 0; e < 8; ++e) EXPECT_EQ(b.assign(0, e, {}), slots[size_t(e)]);
}

TEST(ExpertCacheArena, DropFreesASlotWhoseReadFailed) {
  Arena a = small_arena(2, 0);
  const int32_t s = a.assign(1, 7, {});
  a.hold(s);
  a.drop(s);
  EXPECT_EQ(a.slot_of(1, 7), Arena::kMiss);
  EXPECT_EQ(a.held(), 0u);
  EXPECT_EQ(a.resident(), 0u);
  EXPECT_EQ(a.assign(1, 7, {}), s);
}

TEST(ExpertCacheArena, RejectsBadShapesAndIds) {
  EXPECT_NE(error_of([] { Arena(Arena::Options{2, 8, 4096, 2, 2}); }).find("reserve"),
            std::string::npos);
  EXPECT_NE(error_of([] { Arena(Arena::Options{0, 8, 4096, 2, 0}); }).find("bad shape"),
            std::string::npos);
  Arena a = small_arena(2, 0);
  EXPECT_NE(error_of([&] { a.assign(2, 0, {}); }).find("outside 2 layers"), std::string::npos);
  a.assign(0, 0, {});
  EXPECT_NE(error_of([&] { a.assign(0, 0, {}); }).find("already in slot"), std::string::npos);
}

TEST(ExpertCacheArena, ParsesAndFormatsSizes) {
  EXPECT_EQ(parse_byte_size("8G"), uint64_t(8) << 30);
  EXPECT_EQ(parse_byte_size("512M"), uint64_t(512) << 20);
  EXPECT_EQ(parse_byte_size("1.5GiB"), uint64_t(3) << 29);
  EXPECT_EQ(parse_byte_size("64k"), uint64_t(64) << 10);
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_NE(error_of([] { parse_byte_size("lots"); }).find("'lots' is not a size"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_byte_size("8Q"); }).find("unknown unit"), std::string::npos);
  EXPECT_NE(error_of([] { parse_byte_size("-1G"); }).find("not a size in range"),
            std::string::npos);
  EXPECT_EQ(format_bytes(uint64_t(3) << 29), "1.50 GiB");
  EXPECT_GT(default_expert_budget(0), 0u) << "a test machine has more than 1 GiB available";
}

// ---------------------------------------------------------------------------------------------
// StreamingSource over in-memory records.

struct Harness {
  MemoryIo* io;
  std::unique_ptr<StreamingSource> source;
};

Harness streaming(size_t slots, bool read_ahead = true, size_t reserve = 0) {
  const Layout l = tiny_layout();
  auto io = std::make_unique<MemoryIo>(l, 2, 8);
  MemoryIo* raw = io.get();
  StreamingOptions o;
  o.budget_bytes = slots * 4096;
  o.read_ahead = read_ahead;
  o.reserve = reserve;
  return {raw, std::make_unique<StreamingSource>(std::vector<Layout>{l, l}, 8, 4096,
                                                 std::move(io), o)};
}


TEST(ExpertCacheStreaming, HitsMissesAndResidentFirstWhenEverythingFits) {
  Harness h = streaming(8);
  h.source->begin_window();
  auto groups = run_layer(*h.source, 0, routing_of({3, 1, 1, 5}, 2));
  EXPECT_EQ(groups, (std::vector<std::vector<int32_t>>{{1, 3, 5}}));
  // A hit and a miss: the miss's read goes out before the resident group is computed.
  size_t submitted_before_first_group = 0;
  groups.clear();
  h.source->layer(0, routing_of({5, 2}, 2), [&](const ExpertGroup& g) {
    if (groups.empty()) submitted_before_first_group = h.io->submitted.size();
    EXPECT_FALSE(g.whole);
    groups.emplace_back(g.ids.begin(), g.ids.end());
  });
  EXPECT_EQ(groups, (std::vector<std::vector<int32_t>>{{5}, {2}}));
  EXPECT_EQ(submitted_before_first_group, 4u);
  groups = run_layer(*h.source, 0, routing_of({2, 5}, 2));
  EXPECT_EQ(groups, (std::vector<std::vector<int32_t>>{{2, 5}})) << "all hits: one group";
  h.source->end_window();
  const CacheStats s = *h.source->stats();
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.hits, 3u);
  EXPECT_EQ(s.bytes_read, 4u * 4096);
  EXPECT_EQ(s.chunked_layers, 0u) << "a resident-first split is not an over-budget layer";
  EXPECT_NEAR(s.hit_rate(), 3.0 / 7.0, 1e-12);
}

TEST(ExpertCacheStreaming, AWindowLargerThanTheBudgetComesInGroupsThatFit) {
  Harness h = streaming(2);
  h.source->begin_window();
  run_layer(*h.source, 1, routing_of({6, 2}, 2));  // resident now: 2 and 6
  const auto groups = run_layer(*h.source, 1, routing_of({0, 1, 2, 3, 4, 5, 6, 7}, 4));
  h.source->end_window();
  // The resident ones first, then the misses two at a time.
  EXPECT_EQ(groups,
            (std::vector<std::vector<int32_t>>{{2, 6}, {0, 1}, {3, 4}, {5, 7}}));
  EXPECT_EQ(h.source->stats()->chunked_layers, 1u);
  EXPECT_EQ(h.source->stats()->hits, 2u);
}

TEST(ExpertCacheStreaming, PinnedExpertsStayAndCostNoRoomInAGroup) {
  Harness h = streaming(3);
  const std::vector<ExpertKey> ranked = {{0, 4}, {1, 2}, {0, 7}};
  // One slot must stay unpinned (none reserved here): two of the three fit.
  EXPECT_EQ(h.source->pin(ranked, 10), 2u);
  EXPECT_EQ(h.source->arena().pinned_count(), 2u);
  h.source->begin_window();
  const auto groups = run_layer(*h.source, 0, routing_of({4, 0, 1, 2}, 2));
  h.source->end_window();
  EXPECT_EQ(groups, (std::vector<std::vector<int32_t>>{{0, 4}, {1}, {2}}));
  EXPECT_NE(h.source->arena().slot_of(0, 4), Arena::kMiss);
  EXPECT_NE(h.source->arena().slot_of(1, 2), Arena::kMiss);
}

TEST(ExpertCacheStreaming, ReadAheadQueuesLowPriorityReadsAndCountsItsGuesses) {
  Harness h = streaming(8);
  h.source->begin_window();
  h.source->layer(0, routing_of({0, 1}, 2), [&](const ExpertGroup&) {
    h.source->read_ahead(1, routing_of({3, 4}, 2));
  });
  ASSERT_EQ(h.io->submitted.size(), 4u);
  EXPECT_FALSE(h.io->submitted[2].urgent);
  EXPECT_EQ(h.io->submitted[3].expert, 4);
  run_layer(*h.source, 1, routing_of({4, 6}, 2));  // one of two guessed right
  h.source->end_window();
  const CacheStats s = *h.source->stats();
  EXPECT_EQ(s.read_ahead_reads, 2u);
  EXPECT_EQ(s.read_ahead_predicted, 1u);
  EXPECT_EQ(s.read_ahead_routed, 2u);
  EXPECT_DOUBLE_EQ(s.read_ahead_accuracy(), 0.5);
  EXPECT_EQ(s.hits, 1u) << "the guessed expert is a hit (its read promoted and waited for)";
  EXPECT_EQ(h.io->promotions, 1);

  Harness off = streaming(8, false);
  EXPECT_FALSE(off.source->wants_read_ahead());
  off.source->read_ahead(1, routing_of({3, 4}, 2));
  EXPECT_TRUE(off.io->submitted.empty());
}

TEST(ExpertCacheStreaming, ReadAheadStopsReadingWhileItGuessesBadlyAndResumesWhenRight) {
  // Six slots: layer 0 routes 2 and 3, layer 1 routes 0 and 1 (resident after the first window),
  // which leaves two slots for what read-ahead guesses.
  Harness h = streaming(6);
  auto window = [&](std::vector<int32_t> guess, std::vector<int32_t> routed) {
    h.source->begin_window();
    h.source->layer(0, routing_of({2, 3}, 2), [&](const ExpertGroup&) {
      h.source->read_ahead(1, routing_of(guess, 2));
    });
    run_layer(*h.source, 1, routing_of(std::move(routed), 2));
    h.source->end_window();
  };
  // Wrong guesses, alternating so each one misses and is read while read-ahead still reads.
  for (int i = 0; i < 60; ++i) window(i % 2 ? std::vector<int32_t>{4, 5} : std::vector<int32_t>{6, 7}, {0, 1});
  const CacheStats wrong = *h.source->stats();
  EXPECT_EQ(wrong.read_ahead_predicted, 0u);
  EXPECT_GT(wrong.read_ahead_reads, 0u) << "read-ahead reads before it has scored enough";
  EXPECT_GT(wrong.read_ahead_skipped, 0u);
  for (int i = 0; i < 20; ++i) window(i % 2 ? std::vector<int32_t>{4, 5} : std::vector<int32_t>{6, 7}, {0, 1});
  EXPECT_EQ(h.source->stats()->read_ahead_reads, wrong.read_ahead_reads)
      << "no reads while the recent guesses are wrong";
  EXPECT_EQ(h.source->stats()->read_ahead_skipped, wrong.read_ahead_skipped + 20);

  // Right guesses (of resident experts: nothing to read) raise the recent accuracy again.
  for (int i = 0; i < 100; ++i) window({0, 1}, {0, 1});
  std::vector<int32_t> missing;
  for (int32_t e = 4; e < 8; ++e)
    if (h.source->arena().slot_of(1, e) == Arena::kMiss) missing.push_back(e);
  ASSERT_GE(missing.size(), 2u);
  missing.resize(2);
  const uint64_t reads_before = h.source->stats()->read_ahead_reads;
  window(missing, missing);
  EXPECT_EQ(h.source->stats()->read_ahead_reads, reads_before + 2)
      << "reads resume once the recent guesses are right";
}

// A scripted route trace for the read-ahead value cap: 2 layers of 64 experts, 24 slots. Layer 0
// routes expert 0 every window; layer 1 routes 7w mod 64 in window w, and the guess for layer 1
// is that expert plus the `extra` experts after it. Every routed expert is guessed (accuracy
// 100%, so the accuracy gate never stops it), but only 1 / (1 + extra) of what is read ahead is
// ever routed to.
CacheStats run_read_ahead_script(int windows, int extra) {
  const Layout l = tiny_layout();
  auto io = std::make_unique<MemoryIo>(l, 2, 64);
  StreamingOptions o;
  o.budget_bytes = 24 * 4096;
  o.reserve = 0;
  StreamingSource src(std::vector<Layout>{l, l}, 64, 4096, std::move(io), o);
  for (int w = 0; w < windows; ++w) {
    const int32_t routed = int32_t(7 * w % 64);
    std::vector<int32_t> guess;
    for (int i = 0; i <= extra; ++i) guess.push_back(int32_t((routed + i) % 64));
    src.begin_window();
    src.layer(0, routing_of({0}, 1), [&](const ExpertGroup&) {
      src.read_ahead(1, routing_of(guess, int64_t(guess.size())));
    });
    run_layer(src, 1, routing_of({routed}, 1));
    src.end_window();
  }
  return *src.stats();
}

TEST(ExpertCacheStreaming, ReadAheadThatBecomesHitsIsNeverCapped) {
  const CacheStats s = run_read_ahead_script(300, 0);
  EXPECT_DOUBLE_EQ(s.read_ahead_accuracy(), 1.0);
  EXPECT_EQ(s.read_ahead_capped, 0u);
  EXPECT_EQ(s.read_ahead_bytes, s.read_ahead_reads * 4096);
  EXPECT_EQ(s.read_ahead_useful_bytes, s.read_ahead_bytes) << "every guess read was routed to";
  EXPECT_DOUBLE_EQ(s.read_ahead_value(), 1.0);
  EXPECT_EQ(s.misses, 1u) << "only layer 0's first window misses: read-ahead brings every layer-1 expert";
}

TEST(ExpertCacheStreaming, ReadAheadTrafficIsCappedByTheBytesThatBecameHits) {
  const int windows = 400;
  const CacheStats s = run_read_ahead_script(windows, 3);
  EXPECT_DOUBLE_EQ(s.read_ahead_accuracy(), 1.0);
  EXPECT_EQ(s.read_ahead_skipped, 0u) << "the accuracy gate never stops a guess that names every routed expert";
  EXPECT_GT(s.read_ahead_capped, 0u);
  // Uncapped, 4 records would be read per window for 1 that is routed to (value 0.25). The cap
  // keeps the bytes read ahead within twice those that became hits, plus a record per window and
  // the starting credit.
  EXPECT_LE(s.read_ahead_bytes, 2 * s.read_ahead_useful_bytes + uint64_t(windows + 64) * 4096);
  EXPECT_LT(s.read_ahead_reads, uint64_t(4 * windows));
  EXPECT_GT(s.read_ahead_value(), 0.3);
  const std::string summary = s.summary();
  EXPECT_NE(summary.find("of its bytes became hits"), std::string::npos) << summary;
}

TEST(ExpertCacheStreaming, AnUnusedReadAheadIsSettledBeforeItsSlotIsReused) {
  // Two slots, one in reserve: the guessed expert is evicted before use; its read is cancelled
  // when its slot leaves limbo, never left writing into a reused slot.
  Harness h = streaming(3, true, 1);
  h.source->begin_window();
  h.source->layer(0, routing_of({0}, 1), [&](const ExpertGroup&) {
    h.source->read_ahead(1, routing_of({5}, 1));
  });
  run_layer(*h.source, 1, routing_of({1}, 1));
  run_layer(*h.source, 1, routing_of({2}, 1));
  h.source->end_window();
  EXPECT_GE(h.io->cancels, 1);
  h.source->begin_window();
  run_layer(*h.source, 1, routing_of({5, 6, 7}, 3));
  h.source->end_window();
}

TEST(ExpertCacheStreaming, AFailedReadIsAClearErrorAndTheExpertIsReadAgainNextTime) {
  Harness h = streaming(4);
  h.io->corrupt.insert({1, 3});
  h.source->begin_window();
  const std::string err = error_of([&] { run_layer(*h.source, 1, routing_of({2, 3}, 2)); });
  h.source->end_window();
  EXPECT_NE(err.find("bad checksum"), std::string::npos) << err;
  EXPECT_EQ(h.source->arena().slot_of(1, 3), Arena::kMiss);
  EXPECT_EQ(h.source->arena().held(), 0u);
  h.io->corrupt.clear();
  h.source->begin_window();
  // 2 stayed resident, 3 is read again.
  EXPECT_EQ(run_layer(*h.source, 1, routing_of({2, 3}, 2)),
            (std::vector<std::vector<int32_t>>{{2}, {3}}));
  h.source->end_window();
}

TEST(ExpertCacheStreaming, SlotsOfTheBackendGetEveryLandedReadFilledAndEveryReuseRecycled) {
  CopyingBackend be;
  const Layout l = tiny_layout();
  auto owned_io = std::make_unique<MemoryIo>(l, 2, 8);
  MemoryIo* io = owned_io.get();
  StreamingOptions o;
  o.budget_bytes = 4 * 4096;
  o.reserve = 1;
  o.backend = &be;
  StreamingSource src(std::vector<Layout>{l, l}, 8, 4096, std::move(owned_io), o);
  ASSERT_NE(be.slots, nullptr);
  EXPECT_EQ(&src.slots(), be.slots);
  // Windows that hit, miss, evict, read ahead, and fail a read: run_layer checks that every
  // expert's weights show its own record's bytes, i.e. point at filled slot memory.
  const std::vector<std::pair<int, std::vector<int32_t>>> layers = {
      {0, {1, 2}}, {1, {3, 1}}, {0, {2, 5}}, {1, {6, 7}}, {0, {1, 4}}, {1, {3, 0}}};
  for (size_t w = 0; w < layers.size(); ++w) {
    src.begin_window();
    run_layer(src, layers[w].first, routing_of(layers[w].second, 2));
    src.read_ahead(1 - layers[w].first, routing_of({int32_t(w % 8), int32_t((w + 3) % 8)}, 2));
    src.end_window();
  }
  io->corrupt.insert({0, 6});
  src.begin_window();
  EXPECT_NE(error_of([&] { run_layer(src, 0, routing_of({6, 2}, 2)); }).find("bad checksum"),
            std::string::npos);
  src.end_window();
  const CacheStats s = *src.stats();
  EXPECT_EQ(uint64_t(be.slots->fills) * 4096, s.bytes_read) << "every delivered record is filled";
  EXPECT_GT(s.evictions, 0u);
  EXPECT_GE(uint64_t(be.slots->recycles), s.evictions) << "an evicted slot is recycled first";
  EXPECT_GT(be.slots->discards, 0) << "the failed read and cancelled read-ahead give back buffers";
  EXPECT_EQ(s.h2d_bytes, s.bytes_read);
  EXPECT_NE(s.summary().find(", H2D "), std::string::npos) << s.summary();
}

TEST(ExpertCacheStreaming, RejectsABudgetBelowOneRecordAndBadIds) {
  const Layout l = tiny_layout();
  StreamingOptions o;
  o.budget_bytes = 1000;
  EXPECT_NE(error_of([&] {
              StreamingSource(std::vector<Layout>{l}, 8, 4096,
                              std::make_unique<MemoryIo>(l, 1, 8), o);
            }).find("is below one expert record"),
            std::string::npos);
  Harness h = streaming(2);
  EXPECT_NE(error_of([&] { run_layer(*h.source, 0, routing_of({9}, 1)); }).find("expert id 9"),
            std::string::npos);
  EXPECT_NE(error_of([&] { run_layer(*h.source, 2, routing_of({0}, 1)); }).find("layer 2"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::experts
