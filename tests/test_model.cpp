// The forward pass on synthetic tiny models of each architecture: a T-row window equals T
// one-row windows bitwise, 1 and 2 threads agree bitwise, a state snapshot rolls back exactly,
// and bad input gets a clear strata::Error. The comparison with the reference is in
// test_fixtures_model.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "model/qwen4exp.h"
#include "synth/presets.h"
#include "synth/synth.h"
#include "util/error.h"
#include "util/npy.h"
#include "test_util.h"

using strata::testing::error_of;
using strata::testing::bitwise_equal;

namespace strata::model {
namespace {

using gguf::testing::TempDir;

std::string synth_tiny(const TempDir& dir, const std::string& arch,
                       const std::string& expert_type) {
  synth::SynthOptions o;
  o.arch = arch;
  o.preset = "tiny";
  o.expert_type = expert_type;
  o.output = dir.file(arch + "-" + expert_type + ".gguf");
  o.progress = false;
  o.seed = 7;
  synth::run_synth(o);
  return o.output;
}

using strata::testing::some_tokens;

// Logits of `tokens` run in windows of the given sizes (in order), all rows.
std::vector<float> run_windows(Model& m, const std::vector<int32_t>& tokens,
                               const std::vector<int64_t>& sizes) {
  State st = m.new_state(64);
  std::vector<float> out;
  size_t first = 0;
  for (int64_t n : sizes) {
    const auto rows = m.forward(std::span(tokens).subspan(first, size_t(n)), st, LogitsMode::All);
    out.insert(out.end(), rows.begin(), rows.end());
    first += size_t(n);
  }
  EXPECT_EQ(first, tokens.size());
  EXPECT_EQ(st.n_past, int64_t(tokens.size()));
  return out;
}



struct Case {
  std::string arch;
  std::string expert_type;
};

class ModelWindows : public ::testing::TestWithParam<Case> {};

TEST_P(ModelWindows, OneWindowEqualsOneRowWindowsBitwise) {
  TempDir dir;
  backend::CpuBackend be(1);
  auto m = Model::load(synth_tiny(dir, GetParam().arch, GetParam().expert_type), be);
  const auto tokens = some_tokens(21, m->config().n_vocab, 1);
  const auto whole = run_windows(*m, tokens, {21});
  ASSERT_EQ(whole.size(), size_t(21 * m->config().n_vocab));
  for (float v : whole) ASSERT_TRUE(std::isfinite(v));
  EXPECT_TRUE(bitwise_equal(whole, run_windows(*m, tokens, std::vector<int64_t>(21, 1))));
  EXPECT_TRUE(bitwise_equal(whole, run_windows(*m, tokens, {5, 1, 12, 3})));
}

TEST_P(ModelWindows, ThreadCountDoesNotChangeBits) {
  TempDir dir;
  const std::string path = synth_tiny(dir, GetParam().arch, GetParam().expert_type);
  backend::CpuBackend one(1), two(2);
  auto m1 = Model::load(path, one);
  auto m2 = Model::load(path, two);
  const auto tokens = some_tokens(17, m1->config().n_vocab, 2);
  EXPECT_TRUE(bitwise_equal(run_windows(*m1, tokens, {17}), run_windows(*m2, tokens, {17})));
  EXPECT_TRUE(bitwise_equal(run_windows(*m1, tokens, {9, 8}), run_windows(*m2, tokens, {1, 16})));
}

TEST_P(ModelWindows, SnapshotRollsBackExactly) {
  TempDir dir;
  backend::CpuBackend be(1);
  auto m = Model::load(synth_tiny(dir, GetParam().arch, GetParam().expert_type), be);
  const auto tokens = some_tokens(16, m->config().n_vocab, 3);
  const auto draft = some_tokens(4, m->config().n_vocab, 4);
  const std::span all(tokens);
  State st = m->new_state(32);
  m->forward(all.first(12), st, LogitsMode::Last);
  const State snapshot = st;
  m->forward(draft, st, LogitsMode::All);  // a rejected draft
  st = snapshot;
  EXPECT_EQ(st.n_past, 12);
  const auto resumed = m->forward(all.subspan(12), st, LogitsMode::All);
  State straight = m->new_state(32);
  const auto expected = m->forward(all, straight, LogitsMode::All);
  const int64_t v = m->config().n_vocab;
  EXPECT_TRUE(bitwise_equal(resumed, std::vector<float>(expected.end() - 4 * v, expected.end())));
  // Last is the last row of All.
  st.reset();
  const auto last = m->forward(all, st, LogitsMode::Last);
  EXPECT_TRUE(bitwise_equal(last, std::vector<float>(expected.end() - v, expected.end())));
}

// Several sequences in one window (continuous batching): each one's logits equal what its own
// windows give, bitwise, whatever the other rows (prefill chunks and decode rows mixed, sequences
// joining and leaving between windows, Last and All), and so do the hidden states sequence 2
// asks for (what its MTP head reads).
TEST_P(ModelWindows, SequencesSharingAWindowEqualTheirOwnWindows) {
  TempDir dir;
  backend::CpuBackend be(1);
  auto m = Model::load(synth_tiny(dir, GetParam().arch, GetParam().expert_type), be);
  const int64_t v = m->config().n_vocab;
  const std::vector<std::vector<int32_t>> tokens = {some_tokens(11, v, 5), some_tokens(6, v, 6), some_tokens(9, v, 7)};
  // Per window: (sequence, rows) in window order.
  const std::vector<std::vector<std::pair<size_t, int64_t>>> schedule = {
      {{0, 5}, {1, 2}}, {{1, 1}, {0, 1}, {2, 3}}, {{2, 1}}, {{0, 4}, {2, 4}, {1, 3}}, {{2, 1}, {0, 1}}};
  std::vector<State> shared, alone;
  for (int i = 0; i < 3; ++i) {
    shared.push_back(m->new_state(32));
    alone.push_back(m->new_state(32));
  }
  std::vector<size_t> done(3, 0);
  for (const auto& window : schedule) {
    std::vector<Model::SequenceRows> rows;
    std::vector<float> hidden_together, hidden_own;
    for (const auto& [seq, n] : window)
      rows.push_back({std::span(tokens[seq]).subspan(done[seq], size_t(n)), &shared[seq],
                      seq == 1 ? LogitsMode::Last : LogitsMode::All, nullptr, nullptr, nullptr,
                      seq == 2 ? &hidden_together : nullptr});
    const auto together = m->forward_batch(rows);
    ASSERT_EQ(together.size(), window.size());
    for (size_t k = 0; k < window.size(); ++k) {
      const auto [seq, n] = window[k];
      const auto own = m->forward(rows[k].tokens, alone[seq], rows[k].mode,
                                  {.hidden = seq == 2 ? &hidden_own : nullptr});
      EXPECT_TRUE(bitwise_equal(together[k], own)) << "sequence " << seq << " at row " << done[seq];
      if (seq == 2) {
        EXPECT_EQ(hidden_together.size(), size_t(n * m->hidden_cols()));
        EXPECT_TRUE(bitwise_equal(hidden_together, hidden_own)) << "hidden states at row " << done[seq];
      }
      done[seq] += size_t(n);
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(done[i], tokens[i].size());
    EXPECT_EQ(shared[i].n_past, int64_t(tokens[i].size()));
  }
  // One state twice in a window is refused.
  const std::vector<Model::SequenceRows> twice = {{std::span(tokens[0]).first(1), &shared[0]},
                                                  {std::span(tokens[1]).first(1), &shared[0]}};
  EXPECT_NE(error_of([&] { m->forward_batch(twice); }).find("share one state"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelWindows,
                         ::testing::Values(Case{"qwen3moe", "q4_k"}, Case{"qwen3next", "q4_k"},
                                           Case{"qwen35moe", "q4_k"}, Case{"qwen3moe", "iq2_xs"},
                                           Case{"qwen3next", "iq2_xs"}, Case{"qwen35moe", "f32"},
                                           Case{"qwen4exp", "q4_k"}),
                         [](const auto& info) {
                           return info.param.arch + "_" + info.param.expert_type;
                         });

TEST(ModelErrors, BadInputIsAClearError) {
  TempDir dir;
  backend::CpuBackend be(1);
  auto m = Model::load(synth_tiny(dir, "qwen3moe", "q4_k"), be);
  State st = m->new_state(8);
  const int32_t big[] = {1, 512};
  EXPECT_NE(error_of([&] {
              m->forward(big, st, LogitsMode::All);
            }).find("token 512 at window row 1 is outside"),
            std::string::npos);
  const int32_t neg[] = {-3};
  EXPECT_NE(error_of([&] { m->forward(neg, st, LogitsMode::All); }).find("token -3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m->forward({}, st, LogitsMode::All); }).find("no tokens"),
            std::string::npos);
  const std::vector<int32_t> nine(9, 5);
  EXPECT_NE(error_of([&] { m->forward(nine, st, LogitsMode::All); }).find("context overflow"),
            std::string::npos);
  EXPECT_EQ(st.n_past, 0);
  EXPECT_NE(error_of([&] { m->new_state(1 << 30); }).find("context_length"), std::string::npos);
}

// PLE n-gram ids: the same whether a sequence comes in one window or token by token (the history
// carries across windows, an eos right before a window boundary included), and an n-gram never
// reaches back across an eos.
TEST(Qwen4ExpPle, NgramIdsResetAtEosAcrossWindows) {
  ModelConfig c = synth::make_preset("tiny", Arch::Qwen4Exp, false).config;
  c.ple_eos = 1;
  c.finalize();
  const std::vector<int32_t> tokens{5, 9, 1, 7, 8, 1, 1, 3, 4, 6};
  for (int64_t k = 0; k < 2; ++k) {
    const std::vector<int32_t> start(size_t(c.ple_ngram - 1), int32_t(c.ple_eos));
    const std::vector<int32_t> whole = ple_ngram_ids(c, k, start, tokens);
    std::vector<int32_t> history = start, one_by_one;
    for (int32_t t : tokens) {
      const auto ids = ple_ngram_ids(c, k, history, std::span(&t, 1));
      one_by_one.insert(one_by_one.end(), ids.begin(), ids.end());
      ple_advance_history(history, std::span(&t, 1));
    }
    EXPECT_EQ(whole, one_by_one) << "table " << k;
    EXPECT_EQ(history, (std::vector<int32_t>{4, 6}));
    // Token 7 follows an eos: its n-grams are those of 7 at the start of a sequence.
    const int32_t seven = 7;
    const auto fresh = ple_ngram_ids(c, k, start, std::span(&seven, 1));
    const int64_t heads = c.ple_heads();
    EXPECT_EQ(std::vector<int32_t>(whole.begin() + 3 * heads, whole.begin() + 4 * heads), fresh);
  }
}

TEST(ModelErrors, ForeignArchitecture) {
  TempDir dir;
  backend::CpuBackend be(1);
  const std::string path = dir.file("llama.gguf");
  {
    gguf::Writer w(path);
    w.set("general.architecture", gguf::Value::string("llama"));
    w.finish();
  }
  const std::string e = error_of([&] { Model::load(path, be); });
  EXPECT_NE(e.find("llama"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3moe"), std::string::npos) << e;  // lists the known architectures
}

TEST(ModelErrors, MissingTensor) {
  TempDir dir;
  backend::CpuBackend be(1);
  const auto src = gguf::Reader::open(synth_tiny(dir, "qwen3next", "q4_k"));
  const std::string out = dir.file("missing.gguf");
  {
    gguf::Writer w(out);
    for (const auto& [k, v] : src->metadata()) w.set(k, v);
    for (const auto& t : src->tensors())
      if (t.name != "blk.1.ssm_a") w.add_tensor(t.name, t.type, t.shape);
    w.begin_data();
    for (const auto& t : src->tensors())
      if (t.name != "blk.1.ssm_a") w.write(t.data, t.nbytes);
    w.finish();
  }
  const std::string e = error_of([&] { Model::load(out, be); });
  EXPECT_NE(e.find("missing tensor blk.1.ssm_a"), std::string::npos) << e;
}

TEST(Npy, RoundTripsAndRejectsBadFiles) {
  TempDir dir;
  const std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-3f};
  const int64_t shape[] = {2, 3};
  npy::write(dir.file("f.npy"), f, shape);
  const npy::Array a = npy::read(dir.file("f.npy"));
  EXPECT_EQ(a.dtype, "<f4");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.floats(), f);
  const std::vector<int32_t> ids = {0, 5, 511};
  const int64_t n[] = {3};
  npy::write(dir.file("i.npy"), ids, n);
  EXPECT_EQ(npy::read(dir.file("i.npy")).int32s(), ids);
  EXPECT_NE(error_of([&] { npy::read(dir.file("i.npy")).floats(); }).find("expected float32"),
            std::string::npos);
  auto bytes = gguf::testing::read_bytes(dir.file("f.npy"));
  bytes.resize(bytes.size() - 4);
  gguf::testing::write_bytes(dir.file("short.npy"), bytes);
  EXPECT_NE(error_of([&] { npy::read(dir.file("short.npy")); }).find("data bytes"),
            std::string::npos);
  gguf::testing::write_bytes(dir.file("junk.npy"), {1, 2, 3});
  EXPECT_NE(error_of([&] { npy::read(dir.file("junk.npy")); }).find("not a .npy file"),
            std::string::npos);
}

// strata logits: every position's logits as [positions, vocab], the same bits in any windowing.
TEST(LogitsCommand, WritesEveryPositionWhateverTheWindow) {
  TempDir dir;
  const std::string model = synth_tiny(dir, "qwen35moe", "q4_k");
  const std::string cmd =
      std::string(STRATA_BINARY) + " logits -m " + model + " --tokens 3,1,4,1,5,9,2,6 -o ";
  ASSERT_EQ(std::system(
                (cmd + dir.file("a.npy") + " --dump " + dir.file("dump") + " 2>/dev/null").c_str()),
            0);
  ASSERT_EQ(std::system((cmd + dir.file("b.npy") + " --window 3 --threads 1 2>/dev/null").c_str()),
            0);
  const npy::Array a = npy::read(dir.file("a.npy"));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{8, 512}));
  EXPECT_EQ(a.bytes, npy::read(dir.file("b.npy")).bytes);
  EXPECT_EQ(npy::read(dir.file("dump/gdn_core-0.npy")).shape, (std::vector<int64_t>{8, 4 * 64}));
  EXPECT_EQ(npy::read(dir.file("dump/final_norm.npy")).shape, (std::vector<int64_t>{8, 256}));
  EXPECT_NE(std::system((cmd + dir.file("c.npy") + " --window -1 2>/dev/null").c_str()), 0);
}

}  // namespace
}  // namespace strata::model
