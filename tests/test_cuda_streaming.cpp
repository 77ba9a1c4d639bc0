// Experts streamed into an HBM expert cache (docs/CUDA.md, "Experts streamed into HBM"): the
// CUDA backend's expert slots (device memory filled by copies from pinned buffers on a copy
// stream), and on tiny models of every architecture a streamed run on the GPU gives bitwise the
// logits, tokens and MoE outputs of the all-in-HBM run, for budgets from two experts' worth to all
// of them, read-ahead on and off, and reads that land in a shuffled order. A corrupt record fails
// the window with a clear error, and the next window fails again rather than compute garbage.
// Skipped with the reason where there is no device.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_CUDA

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "decode/device.h"
#include "experts/pack.h"
#include "experts/streaming_source.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "synth/synth.h"
#include "test_util.h"
#include "util/error.h"

namespace strata::model {
namespace {

using gguf::testing::TempDir;
using strata::testing::bitwise_equal;
using strata::testing::error_of;

struct TinyModel {
  std::string gguf;
  uint64_t slot_bytes = 0;  // one record, rounded to 4 KiB
  int64_t records = 0;
};

// Top-4 routing (a combine out of rank order would show) and an f32 trunk (last-bit differences
// reach the logits), as the CPU's streaming tests.
TinyModel synth_with_pack(const TempDir& dir, const std::string& arch, uint64_t seed) {
  synth::SynthOptions o;
  o.arch = arch;
  o.preset = "tiny";
  o.expert_type = "q4_k";
  o.trunk_type = "f32";
  o.experts_used = 4;
  o.output = dir.file(arch + "-" + std::to_string(seed) + ".gguf");
  o.progress = false;
  o.seed = seed;
  synth::run_synth(o);
  experts::write_pack(*gguf::Reader::open(o.output), o.output + ".experts");
  const auto pack = experts::Pack::open(o.output + ".experts");
  return {o.output, (pack->max_record_bytes() + 4095) / 4096 * 4096,
          int64_t(pack->n_layers()) * pack->n_experts()};
}

std::vector<int32_t> some_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t.push_back(int32_t(x % uint64_t(vocab)));
  }
  return t;
}

struct Generated {
  std::vector<float> logits;    // the prefill window's rows, then each decode step's
  std::vector<int32_t> tokens;  // greedy
  std::vector<float> moe_out;   // every layer's MoE output, in order
};

// A 64-row prefill window, then `steps` greedy one-row windows.
Generated generate(Model& m, int64_t steps) {
  Generated r;
  m.set_dump([&](const std::string& name, const std::vector<float>& rows, int64_t) {
    if (name.starts_with("moe_out")) r.moe_out.insert(r.moe_out.end(), rows.begin(), rows.end());
  });
  State st = m.new_state(128);
  const auto prompt = some_tokens(64, m.config().n_vocab);
  r.logits = m.forward(prompt, st, LogitsMode::All);
  std::vector<float> last(r.logits.end() - m.config().n_vocab, r.logits.end());
  for (int64_t i = 0; i < steps; ++i) {
    const int32_t id = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    r.tokens.push_back(id);
    last = m.forward(std::span(&id, 1), st, LogitsMode::Last);
    r.logits.insert(r.logits.end(), last.begin(), last.end());
  }
  m.set_dump({});
  return r;
}

// Reads that finish in a shuffled order: each waits a pseudo-random 0..2 ms first.
class JitteryIo : public experts::FileIo {
 public:
  explicit JitteryIo(uint64_t seed) : state_(seed) {}
  const char* name() const override { return "jittery pread"; }
  ssize_t pread(int fd, void* dst, size_t length, uint64_t offset) override {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    std::this_thread::sleep_for(std::chrono::microseconds((state_ >> 33) % 2000));
    return FileIo::pread(fd, dst, length, offset);
  }

 private:
  uint64_t state_;
};

class CudaStreaming : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason();
  }
};

TEST_F(CudaStreaming, SlotsAreDeviceMemoryFilledFromLandingBuffers) {
  backend::CudaBackend gpu(0);
  ASSERT_TRUE(gpu.expert_memory_free());
  EXPECT_GT(*gpu.expert_memory_free(), 0u);
  const size_t n = 5, bytes = 3 * 4096;
  const auto slots = gpu.alloc_expert_slots(n, bytes);
  EXPECT_EQ(slots->count(), n);
  EXPECT_EQ(slots->slot_bytes(), bytes);
  // More fills than one chunk of pinned buffers, slots refilled after recycle(), a discarded read.
  std::vector<uint8_t> want(n * bytes);
  for (int round = 0; round < 5; ++round) {
    for (int32_t s = 0; s < int32_t(n); ++s) {
      auto* land = static_cast<uint8_t*>(slots->landing(s));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(land) % 4096, 0u);
      EXPECT_EQ(slots->landing(s), land) << "the same buffer until fill or discard";
      const uint8_t v = uint8_t(round * 16 + s);
      std::memset(land, v, bytes);
      if (round == 3 && s == 2) {
        slots->discard(s);  // its old bytes stay
        continue;
      }
      slots->recycle(s);
      slots->fill(s, bytes);  // the buffer is the copy's now; the next landing may be another
      std::fill(want.begin() + ptrdiff_t(s * bytes), want.begin() + ptrdiff_t((s + 1) * bytes), v);
    }
  }
  for (int32_t s = 0; s < int32_t(n); ++s) slots->ready(s);  // the compute stream waits for the copies
  gpu.synchronize();
  cuda::Device raw(0);
  std::vector<uint8_t> got(n * bytes);
  for (int32_t s = 0; s < int32_t(n); ++s)
    raw.download(got.data() + size_t(s) * bytes, slots->data(s), bytes);
  EXPECT_EQ(got, want);
  const backend::ExpertSlots::Counters c = slots->counters();
  EXPECT_EQ(c.bytes, uint64_t(5 * n - 1) * bytes);
  EXPECT_GT(c.seconds, 0.0);
  EXPECT_NE(error_of([&] { slots->fill(0, bytes); }).find("without a landed read"),
            std::string::npos);
  EXPECT_NE(error_of([&] { slots->landing(int32_t(n)); }).find("outside"), std::string::npos);
  // 1 TiB: more than any device has free.
  EXPECT_NE(error_of([&] { gpu.alloc_expert_slots(size_t(1) << 18, size_t(1) << 22); })
                .find("give a smaller --expert-budget"),
            std::string::npos);
}

TEST_F(CudaStreaming, HostTierSlotsArePinnedAndCopiedFromDirectly) {
  backend::CudaBackend gpu(0);
  const size_t n = 4, bytes = 2 * 4096;
  const auto device = gpu.alloc_expert_slots(2, bytes);
  const auto tier = gpu.alloc_host_tier(n, bytes);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->count(), n);
  for (int32_t t = 0; t < int32_t(n); ++t) {
    EXPECT_EQ(tier->landing(t), tier->data(t)) << "reads land in the slot itself";
    std::memset(tier->landing(t), 0x30 + t, bytes);
  }
  // Copies of tier slots 1 and 3 into device slots 0 and 1; the tier slot may change only after
  // wait_copied(its ticket).
  const uint64_t first = device->fill_from(0, tier->data(1), bytes);
  const uint64_t second = device->fill_from(1, tier->data(3), bytes);
  EXPECT_LT(first, second);
  device->wait_copied(second);
  std::memset(tier->landing(1), 0x7f, bytes);
  device->ready(0);
  device->ready(1);
  gpu.synchronize();
  cuda::Device raw(0);
  std::vector<uint8_t> got(bytes);
  raw.download(got.data(), device->data(0), bytes);
  EXPECT_EQ(got, std::vector<uint8_t>(bytes, 0x31));
  raw.download(got.data(), device->data(1), bytes);
  EXPECT_EQ(got, std::vector<uint8_t>(bytes, 0x33));
  EXPECT_EQ(device->counters().bytes, 2 * bytes);
  EXPECT_NE(error_of([&] { device->fill_from(0, tier->data(0), bytes + 1); }).find("into a slot of"),
            std::string::npos);
}

void expect_streamed_equals_resident(const std::string& arch, uint64_t seed) {
  TempDir dir;
  const TinyModel tiny = synth_with_pack(dir, arch, seed);
  backend::CudaBackend gpu(0);
  Generated want;
  {
    auto resident = Model::load(tiny.gguf, gpu);
    ASSERT_EQ(resident->experts_description(), "mapped from the GGUF");
    want = generate(*resident, 6);
  }
  // Host tiers: none, twice the device budget (filled by misses), and every record (filled at
  // start-up).
  const auto tiers = [&](int64_t slots) {
    return std::vector<int64_t>{0, std::min(2 * slots, tiny.records), tiny.records};
  };
  for (int64_t slots : {int64_t(2), int64_t(3), int64_t(5), int64_t(12), tiny.records})
  for (int64_t tier : tiers(slots)) {
    for (bool read_ahead : {true, false}) {
      SCOPED_TRACE(cat(arch, ": ", slots, " slots, host tier ", tier, ", read-ahead ", read_ahead ? "on" : "off"));
      experts::SourceOptions o;
      o.budget_bytes = uint64_t(slots) * tiny.slot_bytes;
      o.host_budget_bytes = uint64_t(tier) * tiny.slot_bytes;
      o.host_fill = tier == tiny.records;
      o.read_ahead = read_ahead;
      auto streamed = Model::load(tiny.gguf, gpu, o);
      EXPECT_NE(streamed->experts_description().find("into cuda memory"), std::string::npos)
          << streamed->experts_description();
      const Generated got = generate(*streamed, 6);
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_TRUE(bitwise_equal(got.logits, want.logits));
      EXPECT_TRUE(bitwise_equal(got.moe_out, want.moe_out));
      const experts::CacheStats s = *streamed->expert_stats();
      EXPECT_GT(s.misses, 0u);
      if (tier == tiny.records) { EXPECT_EQ(s.host_hits, s.misses) << "a full tier answers every miss"; }
      if (tier == 0) { EXPECT_EQ(s.host_hits + s.host_reads, 0u); }
      EXPECT_GT(s.h2d_bytes, 0u) << "records reach the slots by host-to-device copies";
      EXPECT_GT(s.h2d_seconds, 0.0);
      if (slots < tiny.records) { EXPECT_GT(s.evictions, 0u); }
      if (slots <= 3) { EXPECT_GT(s.chunked_layers, 0u) << "the 64-row window needs chunks"; }
      EXPECT_GT(s.handshakes, 0u) << "every streamed layer is a handshake";
      EXPECT_GT(s.handshake_seconds, 0.0);
    }
  }
  // Device time per host step: the wait for the host's answer is a part of the step.
  const backend::BackendCounters c = gpu.counters();
  EXPECT_GE(c.host_steps, c.handshakes);
  EXPECT_GE(c.host_step_seconds, c.handshake_seconds);
}

TEST_F(CudaStreaming, Qwen3MoeStreamedEqualsResidentBitwiseAtEveryBudget) {
  expect_streamed_equals_resident("qwen3moe", 21);
}

TEST_F(CudaStreaming, Qwen3NextStreamedEqualsResidentBitwiseAtEveryBudget) {
  expect_streamed_equals_resident("qwen3next", 22);
}

TEST_F(CudaStreaming, Qwen35MoeStreamedEqualsResidentBitwiseAtEveryBudget) {
  expect_streamed_equals_resident("qwen35moe", 23);
}

TEST_F(CudaStreaming, Qwen4ExpStreamedEqualsResidentBitwiseAtEveryBudget) {
  expect_streamed_equals_resident("qwen4exp", 24);
}

TEST_F(CudaStreaming, ReadTimingChangesNeitherResultsNorWhereExpertsLand) {
  TempDir dir;
  const TinyModel tiny = synth_with_pack(dir, "qwen3next", 25);
  backend::CudaBackend gpu(0);
  Generated want;
  {
    auto resident = Model::load(tiny.gguf, gpu);
    want = generate(*resident, 6);
  }
  struct Outcome {
    Generated run;
    std::vector<int32_t> smap;
    experts::CacheStats stats;
  };
  auto run_with = [&](experts::ReaderOptions reader, uint64_t slots, uint64_t tier) {
    auto m = Model::load(tiny.gguf, gpu);
    experts::StreamingOptions o;
    o.budget_bytes = slots * tiny.slot_bytes;
    o.host_budget_bytes = tier * tiny.slot_bytes;
    o.reserve = 2;
    o.backend = &gpu;
    o.reader = std::move(reader);
    auto source =
        std::make_unique<experts::StreamingSource>(experts::Pack::open(tiny.gguf + ".experts"), o);
    const experts::StreamingSource& src = *source;
    m->set_expert_source(std::move(source), "streamed (test)");
    Outcome out{generate(*m, 6), {}, *src.stats()};
    for (int l = 0; l < int(m->config().n_blocks()); ++l)
      for (int e = 0; e < int(m->config().n_expert); ++e) {
        out.smap.push_back(src.arena().slot_of(l, e));
        if (src.host_tier()) out.smap.push_back(src.host_tier()->arena().slot_of(l, e));
      }
    return out;
  };
  for (const auto& [slots, tier] : {std::pair<uint64_t, uint64_t>{7, 0}, {24, 0}, {7, 16}}) {
    SCOPED_TRACE(cat(slots, " slots, host tier ", tier));
    const Outcome plain = run_with({}, slots, tier);
    experts::ReaderOptions jittery;
    jittery.threads = 5;
    jittery.urgent_threads = 1;
    jittery.io = [n = uint64_t(1)]() mutable { return std::make_unique<JitteryIo>(n++); };
    const Outcome shuffled = run_with(jittery, slots, tier);
    EXPECT_TRUE(bitwise_equal(plain.run.logits, want.logits));
    EXPECT_TRUE(bitwise_equal(shuffled.run.logits, want.logits));
    EXPECT_EQ(shuffled.run.tokens, want.tokens);
    EXPECT_EQ(plain.smap, shuffled.smap);
    EXPECT_EQ(plain.stats.hits, shuffled.stats.hits);
    EXPECT_EQ(plain.stats.misses, shuffled.stats.misses);
    EXPECT_EQ(plain.stats.evictions, shuffled.stats.evictions);
    EXPECT_EQ(plain.stats.read_ahead_reads, shuffled.stats.read_ahead_reads);
    EXPECT_EQ(plain.stats.h2d_bytes, shuffled.stats.h2d_bytes);
    EXPECT_EQ(plain.stats.host_hits, shuffled.stats.host_hits);
    EXPECT_EQ(plain.stats.host_reads, shuffled.stats.host_reads);
    if (tier > 0) { EXPECT_GT(plain.stats.host_hits, 0u); }
    EXPECT_GT(plain.stats.evictions, 0u);
  }
}

TEST_F(CudaStreaming, ACorruptRecordIsAClearErrorAndStaysOne) {
  TempDir dir;
  const TinyModel tiny = synth_with_pack(dir, "qwen3moe", 26);
  {
    const auto pack = experts::Pack::open(tiny.gguf + ".experts");
    std::fstream f(tiny.gguf + ".experts", std::ios::in | std::ios::out | std::ios::binary);
    for (int e = 0; e < pack->n_experts(); ++e) {  // every expert of layer 0
      f.seekg(std::streamoff(pack->record(0, e).offset + 40));
      char byte = 0;
      f.read(&byte, 1);
      byte = char(byte ^ 0x5a);
      f.seekp(std::streamoff(pack->record(0, e).offset + 40));
      f.write(&byte, 1);
    }
  }
  backend::CudaBackend gpu(0);
  experts::SourceOptions o;
  o.budget_bytes = 4 * tiny.slot_bytes;
  auto m = Model::load(tiny.gguf, gpu, o);
  State st = m->new_state(16);
  const auto tokens = some_tokens(4, m->config().n_vocab);
  const std::string err = error_of([&] { m->forward(tokens, st, LogitsMode::Last); });
  EXPECT_NE(err.find("layer 0"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  EXPECT_EQ(st.n_past, 0) << "a failed window does not advance the state";
  EXPECT_NE(error_of([&] { m->forward(tokens, st, LogitsMode::Last); }).find("checksum"),
            std::string::npos);
}

// --device cuda takes a model whose experts stream: the trunk and the budget must fit.
TEST_F(CudaStreaming, DeviceCudaOpensAStreamingModel) {
  TempDir dir;
  const TinyModel tiny = synth_with_pack(dir, "qwen3moe", 27);
  experts::SourceOptions o;
  o.budget_bytes = 4 * tiny.slot_bytes;
  const decode::OpenedBackend opened =
      decode::open_backend(decode::parse_device("cuda"), 1, tiny.gguf, o);
  EXPECT_STREQ(opened.backend->name(), "cuda");
  EXPECT_NE(opened.description.find("experts streamed into device memory"), std::string::npos)
      << opened.description;
  o.budget_bytes = uint64_t(1) << 50;
  const std::string err =
      error_of([&] { decode::open_backend(decode::parse_device("cuda"), 1, tiny.gguf, o); });
  EXPECT_NE(err.find("give a smaller --expert-budget"), std::string::npos) << err;
}

}  // namespace
}  // namespace strata::model

#else

TEST(CudaStreaming, NotCompiled) {
  GTEST_SKIP() << "the CUDA backend is not compiled in (no nvcc)";
}

#endif
