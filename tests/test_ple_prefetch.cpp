// qwen4exp's PLE rows issued before layer 0 (ple_start_window, Backend::prefetch_rows): the rows a
// window asks for early are exactly the rows its PLE layers then gather, and asking changes no
// bit of the logits or tokens (a T-row prefill, greedy decode, two sequences sharing a window).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "synth/synth.h"
#include "test_util.h"

using strata::testing::bitwise_equal;

namespace strata::model {
namespace {

using gguf::testing::TempDir;

// The CPU backend, recording the row ids it is asked to prefetch and the ids each gather from a
// PLE table reads, in call order.
class RecordingBackend : public backend::CpuBackend {
 public:
  struct Event {
    bool prefetch;  // else a gather
    const void* table;
    std::vector<int32_t> ids;
  };

  RecordingBackend() : CpuBackend(1) {}

  void prefetch_rows(const backend::Weight& table, std::span<const int32_t> ids) override {
    events.push_back({true, table.data, {ids.begin(), ids.end()}});
    CpuBackend::prefetch_rows(table, ids);
  }
  void get_rows(const backend::Weight& table, const backend::Ids& ids, backend::Tensor y) override {
    if (ple_tables.contains(table.data)) {
      std::vector<int32_t> host(size_t(ids.size()));
      download_ids(ids, host.data());
      events.push_back({false, table.data, std::move(host)});
    }
    CpuBackend::get_rows(table, ids, y);
  }

  std::set<const void*> ple_tables;
  std::vector<Event> events;
};

// One window's rows per sequence, and what the backend saw while it ran.
struct WindowRecord {
  std::vector<int64_t> sequence_rows;
  std::vector<RecordingBackend::Event> events;
};

struct Recorded {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> greedy;
  std::vector<WindowRecord> windows;
};

using strata::testing::some_tokens;

int32_t argmax(const std::vector<float>& row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

class PlePrefetch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    synth::SynthOptions o;
    o.arch = "qwen4exp";
    o.preset = "tiny";
    o.output = dir_->file("qwen4exp.gguf");
    o.progress = false;
    o.seed = 11;
    synth::run_synth(o);
  }
  static void TearDownTestSuite() { delete dir_; }

  // A 9-row prefill, 5 greedy one-token windows, then two sequences prefilled together and
  // decoded together, with the PLE rows issued early or not.
  static Recorded run(bool prefetch) {
    RecordingBackend be;
    auto m = Model::load(dir_->file("qwen4exp.gguf"), be);
    const ModelConfig& c = m->config();
    for (size_t k = 0; k < c.ple_tables.size(); ++k)
      be.ple_tables.insert(m->reader().tensor(c.ple_table_name(int64_t(k))).data);
    m->set_ple_prefetch(prefetch);
    Recorded r;
    const auto window = [&](std::vector<int64_t> rows, auto&& forward) {
      be.events.clear();
      forward();
      r.windows.push_back({std::move(rows), std::move(be.events)});
    };

    State st = m->new_state(32);
    const std::vector<int32_t> prompt = some_tokens(9, c.n_vocab, 3);
    window({9}, [&] { r.logits.push_back(m->forward(prompt, st, LogitsMode::All)); });
    int32_t next = argmax({r.logits.back().end() - c.n_vocab, r.logits.back().end()});
    for (int i = 0; i < 5; ++i) {
      r.greedy.push_back(next);
      window({1}, [&] { r.logits.push_back(m->forward(std::span(&next, 1), st, LogitsMode::Last)); });
      next = argmax(r.logits.back());
    }

    State a = m->new_state(32), b = m->new_state(32);
    const std::vector<int32_t> ta = some_tokens(6, c.n_vocab, 4), tb = some_tokens(4, c.n_vocab, 5);
    const std::vector<std::vector<int64_t>> splits = {{4, 3}, {2, 1}};  // rows of a, b per window
    size_t done_a = 0, done_b = 0;
    for (const auto& split : splits) {
      const std::vector<Model::SequenceRows> rows = {
          {std::span(ta).subspan(done_a, size_t(split[0])), &a, LogitsMode::All},
          {std::span(tb).subspan(done_b, size_t(split[1])), &b, LogitsMode::All}};
      window(split, [&] {
        for (auto& l : m->forward_batch(rows)) r.logits.push_back(std::move(l));
      });
      done_a += size_t(split[0]);
      done_b += size_t(split[1]);
    }
    return r;
  }

  static inline TempDir* dir_ = nullptr;
};

TEST_F(PlePrefetch, OnAndOffGiveTheSameBits) {
  const Recorded on = run(true), off = run(false);
  ASSERT_EQ(on.logits.size(), off.logits.size());
  for (size_t i = 0; i < on.logits.size(); ++i) EXPECT_TRUE(bitwise_equal(on.logits[i], off.logits[i])) << "window " << i;
  EXPECT_EQ(on.greedy, off.greedy);
  ASSERT_EQ(on.windows.size(), off.windows.size());
  for (size_t i = 0; i < on.windows.size(); ++i) {
    std::vector<std::vector<int32_t>> gathered_on, gathered_off;
    for (const auto& e : on.windows[i].events)
      if (!e.prefetch) gathered_on.push_back(e.ids);
    for (const auto& e : off.windows[i].events) {
      EXPECT_FALSE(e.prefetch) << "window " << i << " issued reads early with the prefetch off";
      gathered_off.push_back(e.ids);
    }
    EXPECT_FALSE(gathered_on.empty());
    EXPECT_EQ(gathered_on, gathered_off) << "window " << i;
  }
}

// Before any PLE layer gathers, the window asks for every table's rows once, [T, heads] row by
// row; each PLE layer then gathers exactly those ids (per sequence, head by head).
TEST_F(PlePrefetch, EarlyIdsAreTheIdsEachLayerGathers) {
  const Recorded on = run(true);
  for (size_t i = 0; i < on.windows.size(); ++i) {
    SCOPED_TRACE("window " + std::to_string(i));
    const WindowRecord& w = on.windows[i];
    std::vector<const RecordingBackend::Event*> prefetched;
    for (const auto& e : w.events) {
      if (!e.prefetch) break;
      prefetched.push_back(&e);
    }
    ASSERT_EQ(prefetched.size(), 2u) << "the tiny qwen4exp has two PLE tables";
    for (const RecordingBackend::Event* p : prefetched) {
      std::vector<const RecordingBackend::Event*> gathers;
      for (const auto& e : w.events) {
        EXPECT_FALSE(e.prefetch && &e > prefetched.back()) << "a read issued after the layers started";
        if (!e.prefetch && e.table == p->table) gathers.push_back(&e);
      }
      // Gathers go per sequence and head (head-major); the early ids are per row, all heads.
      int64_t rows = 0;
      for (int64_t n : w.sequence_rows) rows += n;
      const size_t heads = p->ids.size() / size_t(rows);
      ASSERT_EQ(gathers.size(), heads * w.sequence_rows.size());
      std::vector<int32_t> row_major(p->ids.size());
      size_t g = 0, first = 0;
      for (int64_t n : w.sequence_rows) {
        for (size_t h = 0; h < heads; ++h, ++g) {
          ASSERT_EQ(gathers[g]->ids.size(), size_t(n));
          for (size_t t = 0; t < size_t(n); ++t) row_major[(first + t) * heads + h] = gathers[g]->ids[t];
        }
        first += size_t(n);
      }
      EXPECT_EQ(row_major, p->ids);
    }
  }
}

}  // namespace
}  // namespace strata::model
