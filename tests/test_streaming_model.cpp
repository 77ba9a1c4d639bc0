// Issue 4's "done when": a model whose experts stream from a .experts pack through a small
// expert cache computes exactly what the all-in-RAM model computes. On synthetic tiny models,
// greedy tokens and every logit are bitwise equal for budgets from two experts' worth up to all
// of them, on 1 and 2 threads, with read-ahead on and off, for a 64-row prefill window and the
// one-row decode windows after it; reads finishing in a shuffled order change neither the results
// nor which slot each expert lands in. Also: a corrupt record is a clear error from generation, a
// missing or stale pack is a clear error at load, and the process's memory stays within trunk +
// budget + a small overhead while experts far larger than the budget stream through. And with
// several sequences in one window (continuous batching), each routed expert is looked up and
// read once for all of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "decode/generate.h"
#include "experts/expert_reader.h"
#include "experts/pack.h"
#include "experts/streaming_source.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "synth/synth.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"
#include "util/error.h"
#include "test_util.h"

using strata::testing::error_of;
using strata::testing::bitwise_equal;

namespace strata::model {
namespace {

using gguf::testing::TempDir;

struct TinyModel {
  std::string gguf;
  uint64_t slot_bytes = 0;  // one record, rounded to 4 KiB
  int64_t records = 0;
};

TinyModel synth_with_pack(const TempDir& dir, const std::string& arch, uint64_t seed,
                          std::vector<std::pair<std::string, std::string>> sets = {},
                          std::optional<int64_t> experts = std::nullopt,
                          std::optional<int64_t> experts_used = std::nullopt,
                          const std::string& trunk_type = "") {
  synth::SynthOptions o;
  o.arch = arch;
  o.preset = "tiny";
  o.expert_type = "q4_k";
  o.trunk_type = trunk_type;
  o.experts = experts;
  o.experts_used = experts_used;
  o.sets = std::move(sets);
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
  // Every layer's MoE output ("moe_out-L" dumps), in order: the quantized activations of the
  // next matmuls absorb most last-bit differences before they reach the logits.
  std::vector<float> moe_out;
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



void expect_streamed_equals_mapped(const std::string& arch) {
  TempDir dir;
  // Top-4: with two ranks a sum is the same in either order, with four a combine out of rank
  // order would show. An f32 trunk carries last-bit differences through to the logits.
  const TinyModel tiny = synth_with_pack(dir, arch, 11, {}, std::nullopt, 4, "f32");
  backend::CpuBackend ref_be(1);
  auto mapped = Model::load(tiny.gguf, ref_be);
  ASSERT_EQ(mapped->experts_description(), "mapped from the GGUF");
  const Generated want = generate(*mapped, 6);

  for (int64_t slots : {int64_t(2), int64_t(3), int64_t(5), int64_t(12), tiny.records}) {
    for (int threads : {1, 2}) {
      for (bool read_ahead : {true, false}) {
        SCOPED_TRACE(cat(arch, ": ", slots, " slots, ", threads, " threads, read-ahead ",
                         read_ahead ? "on" : "off"));
        backend::CpuBackend be(threads);
        experts::SourceOptions o;
        o.budget_bytes = uint64_t(slots) * tiny.slot_bytes;
        o.read_ahead = read_ahead;
        auto streamed = Model::load(tiny.gguf, be, o);
        EXPECT_NE(streamed->experts_description().find("streamed from"), std::string::npos);
        const Generated got = generate(*streamed, 6);
        EXPECT_EQ(got.tokens, want.tokens);
        EXPECT_TRUE(bitwise_equal(got.logits, want.logits));
        EXPECT_TRUE(bitwise_equal(got.moe_out, want.moe_out));
        const experts::CacheStats s = *streamed->expert_stats();
        EXPECT_GT(s.misses, 0u);
        if (slots < tiny.records) { EXPECT_GT(s.evictions, 0u); }
        if (slots <= 3) { EXPECT_GT(s.chunked_layers, 0u) << "the 64-row window needs chunks"; }
        if (read_ahead && slots == tiny.records) { EXPECT_GT(s.read_ahead_routed, 0u); }
        if (read_ahead && slots >= 12) { EXPECT_GT(s.read_ahead_reads, 0u); }
        if (!read_ahead) { EXPECT_EQ(s.read_ahead_reads, 0u); }
      }
    }
  }
}

TEST(StreamingModel, Qwen3MoeStreamedEqualsMappedBitwiseAtEveryBudget) {
  expect_streamed_equals_mapped("qwen3moe");
}

TEST(StreamingModel, Qwen3NextStreamedEqualsMappedBitwiseAtEveryBudget) {
  expect_streamed_equals_mapped("qwen3next");
}

// Both have an MTP block: the pack holds one more layer than the forward routes through.
TEST(StreamingModel, Qwen35MoeStreamedEqualsMappedBitwiseAtEveryBudget) {
  expect_streamed_equals_mapped("qwen35moe");
}

TEST(StreamingModel, Qwen4ExpStreamedEqualsMappedBitwiseAtEveryBudget) {
  expect_streamed_equals_mapped("qwen4exp");
}

TEST(StreamingModel, ACorruptRecordIsAClearErrorFromGeneration) {
  TempDir dir;
  const TinyModel tiny = synth_with_pack(dir, "qwen3moe", 12);
  {
    const auto pack = experts::Pack::open(tiny.gguf + ".experts");
    std::fstream f(tiny.gguf + ".experts", std::ios::in | std::ios::out | std::ios::binary);
    // Every expert of layer 0, so whatever the routing, the first layer reads a bad record.
    for (int e = 0; e < pack->n_experts(); ++e) {
      f.seekg(std::streamoff(pack->record(0, e).offset + 40));
      char byte = 0;
      f.read(&byte, 1);
      byte = char(byte ^ 0x5a);
      f.seekp(std::streamoff(pack->record(0, e).offset + 40));
      f.write(&byte, 1);
    }
  }
  backend::CpuBackend be(1);
  experts::SourceOptions o;
  o.budget_bytes = 4 * tiny.slot_bytes;
  auto m = Model::load(tiny.gguf, be, o);
  State st = m->new_state(16);
  const auto tokens = some_tokens(4, m->config().n_vocab);
  const std::string err = error_of([&] { m->forward(tokens, st, LogitsMode::Last); });
  EXPECT_NE(err.find("layer 0"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  EXPECT_EQ(st.n_past, 0) << "a failed window does not advance the state";
  // It stays an error, not garbage, when asked again.
  EXPECT_NE(error_of([&] { m->forward(tokens, st, LogitsMode::Last); }).find("checksum"),
            std::string::npos);
}

TEST(StreamingModel, AMissingOrStalePackIsAClearErrorAtLoad) {
  TempDir dir;
  const TinyModel a = synth_with_pack(dir, "qwen3moe", 13);
  const TinyModel b = synth_with_pack(dir, "qwen3moe", 14);
  backend::CpuBackend be(1);
  experts::SourceOptions o;
  o.budget_bytes = 4 * a.slot_bytes;
  o.pack = b.gguf + ".experts";
  EXPECT_NE(error_of([&] { Model::load(a.gguf, be, o); }).find("does not belong to"),
            std::string::npos);
  std::filesystem::remove(a.gguf + ".experts");
  o.pack.clear();
  const std::string err = error_of([&] { Model::load(a.gguf, be, o); });
  EXPECT_NE(err.find("not found"), std::string::npos) << err;
  EXPECT_NE(err.find("strata pack"), std::string::npos) << err;
  // Without a budget a full GGUF whose experts fit memory simply maps them.
  EXPECT_EQ(Model::load(a.gguf, be)->experts_description(), "mapped from the GGUF");
}

TEST(StreamingModel, AMemoryLimitSizesTheBudgetAndIsPrintedWithTheSplit) {
  TempDir dir;
  const TinyModel tiny = synth_with_pack(dir, "qwen3moe", 19);
  backend::CpuBackend be(1);
  experts::SourceOptions o;
  o.pack = tiny.gguf + ".experts";  // streamed, budget from the limit
  o.memory_limit = uint64_t(1) << 30;
  const auto m = Model::load(tiny.gguf, be, o);
  const std::string d = m->experts_description();
  EXPECT_NE(d.find("memory limit 1.00 GiB (--memory-limit): trunk "), std::string::npos) << d;
  EXPECT_NE(d.find("activations and state 384.00 MiB"), std::string::npos) << d;
  // The budget is what the limit leaves (1 GiB less the trunk, 8 readers and 384 MiB), so the
  // start-up line and the split name the same figure; the trunk is locked or says why not.
  const size_t budget_at = d.find("budget ") + 7, cache_at = d.find("expert cache ") + 13;
  EXPECT_EQ(d.substr(budget_at, d.find(' ', budget_at) - budget_at), d.substr(cache_at, d.find(' ', cache_at) - cache_at)) << d;
  EXPECT_TRUE(d.find("locked in RAM") != std::string::npos || d.find("trunk not locked") != std::string::npos) << d;
  // The tiny pack is far below that budget: the line says the cache holds every expert; a budget
  // of a third of the pack does not.
  EXPECT_NE(d.find(": every expert; read-ahead"), std::string::npos) << d;
  {
    experts::SourceOptions third;
    third.pack = o.pack;
    third.budget_bytes = std::filesystem::file_size(third.pack) / 3;
    const std::string part = Model::load(tiny.gguf, be, third)->experts_description();
    EXPECT_EQ(part.find("every expert"), std::string::npos) << part;
  }

  // A budget the limit cannot hold, and a limit that leaves no room, are errors naming the flag.
  o.budget_bytes = uint64_t(900) << 20;
  const std::string over = error_of([&] { Model::load(tiny.gguf, be, o); });
  EXPECT_NE(over.find("--expert-budget 900.00 MiB does not fit"), std::string::npos) << over;
  EXPECT_NE(over.find("raise --memory-limit"), std::string::npos) << over;
  o.budget_bytes.reset();
  o.memory_limit = uint64_t(256) << 20;
  const std::string tight = error_of([&] { Model::load(tiny.gguf, be, o); });
  EXPECT_EQ(tight.rfind("--memory-limit: a memory limit of 256.00 MiB leaves 0 B", 0), 0u) << tight;
}

TEST(StreamingModel, ATrunkOnlyGgufStreamsFromItsPackByDefault) {
  TempDir dir;
  const TinyModel full = synth_with_pack(dir, "qwen3next", 16);
  synth::SynthOptions o;
  o.arch = "qwen3next";
  o.preset = "tiny";
  o.expert_type = "q4_k";
  o.output = dir.file("trunk.gguf");
  o.progress = false;
  o.seed = 16;
  o.pack = true;
  synth::run_synth(o);
  ASSERT_FALSE(experts::has_expert_stacks(*gguf::Reader::open(o.output)));

  backend::CpuBackend be(2);
  const Generated want = generate(*Model::load(full.gguf, be), 4);
  auto trunk = Model::load(o.output, be);
  EXPECT_NE(trunk->experts_description().find("streamed from"), std::string::npos)
      << trunk->experts_description();
  const Generated got = generate(*trunk, 4);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_TRUE(bitwise_equal(got.logits, want.logits));
  trunk.reset();

  std::filesystem::remove(o.output + ".experts");
  const std::string err = error_of([&] { Model::load(o.output, be); });
  EXPECT_NE(err.find("not found"), std::string::npos) << err;
  EXPECT_NE(err.find("holds no expert tensors"), std::string::npos) << err;
}

TEST(StreamingModel, GenerationTelemetryReportsTheCacheOnlyWhenExpertsStream) {
  TempDir dir;
  const TinyModel tiny = synth_with_pack(dir, "qwen3moe", 17);
  backend::CpuBackend be(1);
  decode::GenerateParams params;
  params.max_tokens = 6;
  params.sampling.temperature = 0;
  std::vector<int32_t> prompt = some_tokens(8, 500);

  auto mapped = Model::load(tiny.gguf, be);
  const tokenizer::Tokenizer tok(tokenizer::read_vocab_metadata(mapped->reader()));
  decode::Session plain(*mapped, tok, {.n_ctx = 64});
  const decode::Telemetry none = plain.generate(prompt, params, {}).telemetry;
  EXPECT_FALSE(none.cache_hit_rate);
  EXPECT_FALSE(none.ssd_gb_per_s);
  EXPECT_FALSE(none.stall_ms_per_token);

  experts::SourceOptions o;
  o.budget_bytes = 3 * tiny.slot_bytes;
  auto streamed = Model::load(tiny.gguf, be, o);
  decode::Session session(*streamed, tok, {.n_ctx = 64});
  const decode::GenerateResult r = session.generate(prompt, params, {});
  ASSERT_GT(r.telemetry.decode_steps, 0);
  ASSERT_TRUE(r.telemetry.cache_hit_rate);
  EXPECT_GE(*r.telemetry.cache_hit_rate, 0.0);
  EXPECT_LE(*r.telemetry.cache_hit_rate, 1.0);
  ASSERT_TRUE(r.telemetry.ssd_gb_per_s);
  EXPECT_GT(*r.telemetry.ssd_gb_per_s, 0.0) << "3 slots for 32 experts: decode reads records";
  ASSERT_TRUE(r.telemetry.stall_ms_per_token);
  EXPECT_GE(*r.telemetry.stall_ms_per_token, 0.0);
  EXPECT_NE(decode::format_telemetry(r.telemetry).find("cache hit "), std::string::npos);
  EXPECT_FALSE(r.telemetry.h2d_gb_per_s) << "host slots: no copies";
  EXPECT_EQ(decode::format_telemetry(r.telemetry).find("h2d"), std::string::npos);
  EXPECT_FALSE(r.telemetry.handshake_us) << "CPU windows: no device waits for the host";
  EXPECT_EQ(decode::format_telemetry(r.telemetry).find("handshake"), std::string::npos);
  decode::Telemetry copied = r.telemetry;
  copied.h2d_gb_per_s = 12.5;
  copied.handshake_us = 9.84;
  EXPECT_NE(decode::format_telemetry(copied).find("ms/tok | h2d 12.5 GB/s | handshake 9.8 us"),
            std::string::npos)
      << decode::format_telemetry(copied);
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

TEST(StreamingModel, ReadTimingChangesNeitherResultsNorWhereExpertsLand) {
  TempDir dir;
  const TinyModel tiny = synth_with_pack(dir, "qwen3moe", 18, {}, std::nullopt, 4, "f32");
  struct Outcome {
    Generated run;
    std::vector<int32_t> smap;
    experts::CacheStats stats;
  };
  auto run_with = [&](experts::ReaderOptions reader) {
    backend::CpuBackend be(2);
    auto m = Model::load(tiny.gguf, be);
    experts::StreamingOptions o;
    o.budget_bytes = 7 * tiny.slot_bytes;
    o.reserve = 2;
    o.reader = std::move(reader);
    auto source =
        std::make_unique<experts::StreamingSource>(experts::Pack::open(tiny.gguf + ".experts"), o);
    const experts::StreamingSource& src = *source;
    m->set_expert_source(std::move(source), "streamed (test)");
    Outcome out{generate(*m, 6), {}, *src.stats()};
    for (int l = 0; l < int(m->config().n_blocks()); ++l)
      for (int e = 0; e < int(m->config().n_expert); ++e)
        out.smap.push_back(src.arena().slot_of(l, e));
    return out;
  };
  const Outcome plain = run_with({});
  experts::ReaderOptions jittery;
  jittery.threads = 5;
  jittery.urgent_threads = 1;
  jittery.io = [n = uint64_t(1)]() mutable { return std::make_unique<JitteryIo>(n++); };
  const Outcome shuffled = run_with(jittery);
  EXPECT_TRUE(bitwise_equal(plain.run.logits, shuffled.run.logits));
  EXPECT_EQ(plain.smap, shuffled.smap);
  EXPECT_EQ(plain.stats.hits, shuffled.stats.hits);
  EXPECT_EQ(plain.stats.misses, shuffled.stats.misses);
  EXPECT_EQ(plain.stats.evictions, shuffled.stats.evictions);
  EXPECT_EQ(plain.stats.early_retirements, shuffled.stats.early_retirements);
  EXPECT_EQ(plain.stats.read_ahead_reads, shuffled.stats.read_ahead_reads);
  EXPECT_GT(plain.stats.evictions, 0u);
}

// VmRSS of this process in bytes.
uint64_t rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  uint64_t kib = 0;
  while (status >> key) {
    if (key == "VmRSS:") {
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  return 0;
}

TEST(StreamingModel, MemoryStaysWithinTrunkPlusBudgetWhileLargerExpertsStream) {
  TempDir dir;
  // 64 experts of 3 x [512 x 256] Q4_K per layer, 4 layers: 56 MiB of experts, 32x the budget.
  const TinyModel big = synth_with_pack(dir, "qwen3moe", 15, {{"expert_ff", "512"}}, 64);
  const uint64_t budget = 8 * big.slot_bytes;
  const uint64_t expert_bytes = uint64_t(big.records) * big.slot_bytes;
  ASSERT_GT(expert_bytes, 16 * budget);
  uint64_t trunk = 0;
  const auto reader = gguf::Reader::open(big.gguf);
  for (const auto& t : reader->tensors())
    if (!t.name.ends_with("_exps.weight")) trunk += t.nbytes;

  backend::CpuBackend be(2);
  const uint64_t before = rss_bytes();
  uint64_t after = 0;
  {
    experts::SourceOptions o;
    o.budget_bytes = budget;
    auto m = Model::load(big.gguf, be, o);
    generate(*m, 4);
    after = rss_bytes();
    EXPECT_GT(m->expert_stats()->bytes_read, 2 * budget) << "experts did stream through";
  }
  // Activations, the KV cache and the reader's threads: about 5 MiB on this model.
  const uint64_t bound = trunk + budget + (uint64_t(16) << 20);
  EXPECT_LT(after - before, bound) << "trunk " << trunk << ", budget " << budget;

  // The measurement sees experts that do not stream: mapped, they land in RSS as file pages.
  const uint64_t mapped_before = rss_bytes();
  auto mapped = Model::load(big.gguf, be);
  generate(*mapped, 4);
  EXPECT_GT(rss_bytes() - mapped_before, bound);
}


// Forwards to a streaming source and records, per layer of the last window, the routing it was
// asked for and the experts it handed to the model.
class RecordingSource : public experts::ExpertSource {
 public:
  explicit RecordingSource(std::unique_ptr<experts::ExpertSource> inner) : inner_(std::move(inner)) {}
  void begin_window() override {
    routed_.clear();
    handed_.clear();
    calls_.clear();
    inner_->begin_window();
  }
  void end_window() override { inner_->end_window(); }
  void layer(int il, const backend::Routing& routing, const GroupFn& fn) override {
    ++calls_[il];
    routed_[il].insert(routing.experts.begin(), routing.experts.end());
    rows_[il] = int64_t(routing.experts.size()) / routing.top_k;
    inner_->layer(il, routing, [&](const experts::ExpertGroup& g) {
      handed_[il].insert(handed_[il].end(), g.ids.begin(), g.ids.end());
      fn(g);
    });
  }
  std::optional<experts::CacheStats> stats() const override { return inner_->stats(); }

  std::map<int, std::set<int32_t>> routed_;     // distinct experts the window's rows route to
  std::map<int, std::vector<int32_t>> handed_;  // every expert handed out, repeats kept
  std::map<int, int> calls_;                    // layer() calls
  std::map<int, int64_t> rows_;                 // rows of the routing

 private:
  std::unique_ptr<experts::ExpertSource> inner_;
};

// Continuous batching's I/O promise: sequences sharing a window have the experts they route to
// looked up, and read on a miss, once for all of them, where separate windows would fetch each
// sequence's own.
TEST(StreamingModel, SequencesSharingAWindowFetchEachRoutedExpertOnce) {
  TempDir dir;
  const TinyModel tiny = synth_with_pack(dir, "qwen35moe", 21);
  backend::CpuBackend be(1);
  const auto load = [&] {
    auto m = Model::load(tiny.gguf, be);
    experts::StreamingOptions o;
    o.budget_bytes = uint64_t(tiny.records) * tiny.slot_bytes;  // no evictions, no chunks
    o.read_ahead = false;
    auto source = std::make_unique<RecordingSource>(
        std::make_unique<experts::StreamingSource>(experts::Pack::open(tiny.gguf + ".experts"), o));
    RecordingSource* recording = source.get();
    m->set_expert_source(std::move(source), "recorded");
    return std::pair{std::move(m), recording};
  };
  auto [shared, shared_rec] = load();
  auto [alone, alone_rec] = load();
  const int64_t vocab = shared->config().n_vocab;
  // Three sequences with histories of their own, then one window: two decode rows and a prefill
  // chunk of five.
  const auto tokens = some_tokens(40, vocab);
  const std::span<const int32_t> all(tokens);
  std::vector<State> together, apart;
  const std::vector<std::pair<size_t, size_t>> history = {{0, 7}, {7, 3}, {10, 9}};
  for (const auto& [first, n] : history) {
    together.push_back(shared->new_state(64));
    apart.push_back(alone->new_state(64));
    shared->forward(all.subspan(first, n), together.back(), LogitsMode::Last);
    alone->forward(all.subspan(first, n), apart.back(), LogitsMode::Last);
  }
  const std::vector<std::span<const int32_t>> rows = {all.subspan(20, 1), all.subspan(21, 5), all.subspan(26, 1)};
  std::vector<Model::SequenceRows> window;
  for (size_t i = 0; i < rows.size(); ++i) window.push_back({rows[i], &together[i], LogitsMode::Last});
  const experts::CacheStats before = *shared->expert_stats();
  const auto logits = shared->forward_batch(window);
  const experts::CacheStats in_window = shared->expert_stats()->since(before);

  std::map<int, std::set<int32_t>> each_alone;
  uint64_t lookups_alone = 0, sum_of_own_sets = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const experts::CacheStats b = *alone->expert_stats();
    EXPECT_TRUE(bitwise_equal(logits[i], alone->forward(rows[i], apart[i], LogitsMode::Last))) << "sequence " << i;
    const experts::CacheStats d = alone->expert_stats()->since(b);
    lookups_alone += d.hits + d.misses;
    for (const auto& [il, experts] : alone_rec->routed_) {
      each_alone[il].insert(experts.begin(), experts.end());
      sum_of_own_sets += experts.size();
    }
  }
  const int n_layers = int(shared->config().n_layer);
  uint64_t union_size = 0;
  for (int il = 0; il < n_layers; ++il) {
    SCOPED_TRACE(cat("layer ", il));
    EXPECT_EQ(shared_rec->calls_[il], 1) << "one fetch per layer for the whole window";
    EXPECT_EQ(shared_rec->rows_[il], 7) << "the routing covers every sequence's rows";
    EXPECT_EQ(shared_rec->routed_[il], each_alone[il]) << "the window routes to the union of the sequences' experts";
    std::vector<int32_t> handed = shared_rec->handed_[il];
    std::sort(handed.begin(), handed.end());
    EXPECT_EQ(handed, std::vector<int32_t>(each_alone[il].begin(), each_alone[il].end()))
        << "each expert of the union handed out exactly once";
    union_size += each_alone[il].size();
  }
  EXPECT_EQ(in_window.hits + in_window.misses, union_size) << "one lookup per distinct (layer, expert)";
  EXPECT_EQ(lookups_alone, sum_of_own_sets);
  EXPECT_LT(union_size, sum_of_own_sets) << "the sequences share experts here, so sharing the window saves fetches";
  EXPECT_EQ(in_window.evictions, 0u);
}

}  // namespace
}  // namespace strata::model
