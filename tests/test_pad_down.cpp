// qwen4exp's routed down stack stored with its rows zero-padded to whole blocks of its type (the
// flagship's n_ff_exp = 640 is not whole 256-element IQ2_XS/Q4_K blocks). The padded columns meet
// h = 0 exactly, so whatever the pad weights hold, the logits are bitwise the same; mapped and
// streamed from a pack agree bitwise; a padded shape anywhere else, or of the wrong width, is a
// clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops_moe.h"
#include "backend/cpu/thread_pool.h"
#include "convert/convert.h"
#include "experts/pack.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "model/arch.h"
#include "model/model.h"
#include "quant/kernels.h"
#include "synth/synth.h"
#include "test_convert_util.h"
#include "test_quant_util.h"
#include "util/error.h"
#include "test_util.h"

using strata::testing::bitwise_equal;

namespace strata::model {
namespace {

using gguf::testing::TempDir;

constexpr int64_t kFF = 320;      // not a multiple of Q4_K's 256
constexpr int64_t kPadded = 512;  // round_up(320, 256)
constexpr const char* kDown0 = "blk.0.ffn_down_exps.weight";

synth::SynthReport synth_tiny(const std::string& path, const std::string& arch = "qwen4exp") {
  synth::SynthOptions o;
  o.arch = arch;
  o.preset = "tiny";
  o.expert_type = "q4_k";
  o.trunk_type = "f32";  // carries last-bit differences through to the logits
  o.experts_used = 4;
  o.sets = {{"expert_ff", std::to_string(kFF)}};
  o.output = path;
  o.progress = false;
  o.seed = 5;
  return synth::run_synth(o);
}

std::vector<float> run_logits(Model& m) {
  State st = m.new_state(64);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back(int32_t((i * 7919 + 13) % m.config().n_vocab));
  std::vector<float> out = m.forward(prompt, st, LogitsMode::All);
  // One-row windows after the prefill.
  for (int i = 0; i < 3; ++i) {
    const int32_t id = prompt[size_t(i)];
    const auto last = m.forward(std::span(&id, 1), st, LogitsMode::Last);
    out.insert(out.end(), last.begin(), last.end());
  }
  return out;
}


// Copies src to dst with tensor `name` stored with row length ne0 (each row cut or zero-extended).
void rewrite_ne0(const std::string& src, const std::string& dst, const std::string& name,
                 int64_t ne0) {
  const auto r = gguf::Reader::open(src);
  gguf::Writer w(dst);
  for (const auto& [key, value] : r->metadata()) w.set(key, value);
  for (const auto& t : r->tensors()) {
    auto shape = t.shape;
    if (t.name == name) shape[0] = ne0;
    w.add_tensor(t.name, t.type, shape);
  }
  w.begin_data();
  for (const auto& t : r->tensors()) {
    if (t.name != name) {
      w.write(t.data, t.nbytes);
      continue;
    }
    const size_t old_row = t.row_stride(), new_row = quant::row_bytes(t.type, ne0);
    std::vector<uint8_t> row(new_row, 0);
    for (int64_t i = 0; i < t.n_rows(); ++i) {
      std::memcpy(row.data(), t.data + size_t(i) * old_row, std::min(old_row, new_row));
      w.write(row.data(), new_row);
    }
  }
  w.finish();
}

std::string load_error(const std::string& path) {
  backend::CpuBackend be(1);
  try {
    Model::load(path, be);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PadDown, SynthPadsTheQwen4ExpDownStackInsteadOfFallingBack) {
  TempDir dir;
  const auto rep = synth_tiny(dir.file("m.gguf"));
  const auto r = gguf::Reader::open(dir.file("m.gguf"));
  const gguf::TensorInfo* down = r->find_tensor(kDown0);
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, quant::Type::Q4_K);
  EXPECT_EQ(down->shape, (std::vector<int64_t>{kPadded, 256, 8}));
  EXPECT_EQ(r->find_tensor("blk.0.ffn_gate_exps.weight")->shape,
            (std::vector<int64_t>{256, kFF, 8}));
  EXPECT_TRUE(std::any_of(rep.plan.notes.begin(), rep.plan.notes.end(), [](const std::string& n) {
    return n.find("blk.0.ffn_down_exps.weight: rows padded to ne0 = 512") != std::string::npos;
  }));
  // The shared expert is a trunk tensor of llama.cpp-style exact shape: no padding.
  EXPECT_EQ(r->find_tensor("blk.0.ffn_down_shexp.weight")->shape[0],
            r->find_tensor("blk.0.ffn_gate_shexp.weight")->shape[1]);
}

TEST(PadDown, PadWeightsDoNotChangeTheLogitsBitwise) {
  TempDir dir;
  synth_tiny(dir.file("m.gguf"));
  // The same file with every down row's pad region overwritten: the last Q4_K block of a row
  // holds elements 256..511, of which 320.. are pad; its quants for sub-blocks 2..7 (qs bytes
  // 32..127, after d, dmin and the 12 scale bytes) hold only pad elements.
  const std::string other = dir.file("other.gguf");
  std::filesystem::copy_file(dir.file("m.gguf"), other);
  std::vector<std::pair<uint64_t, uint64_t>> rows;  // file offset of each down row, row bytes
  {
    const auto r = gguf::Reader::open(other);
    for (const auto& t : r->tensors())
      if (t.name.find("ffn_down_exps") != std::string::npos)
        for (int64_t i = 0; i < t.n_rows(); ++i)
          rows.push_back({r->data_offset() + t.offset + uint64_t(i) * t.row_stride(), t.row_stride()});
  }
  ASSERT_FALSE(rows.empty());
  {
    std::fstream f(other, std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> junk(96);
    for (size_t k = 0; k < junk.size(); ++k) junk[k] = char(k * 37 + 11);
    for (const auto& [at, bytes] : rows) {
      f.seekp(std::streamoff(at + bytes / 2 + 16 + 32));
      f.write(junk.data(), std::streamsize(junk.size()));
    }
  }
  {
    const auto a = gguf::Reader::open(dir.file("m.gguf")), b = gguf::Reader::open(other);
    const gguf::TensorInfo *ta = a->find_tensor(kDown0), *tb = b->find_tensor(kDown0);
    std::vector<float> va(kPadded), vb(kPadded);
    quant::dequantize(quant::Type::Q4_K, ta->data, va.data(), kPadded);
    quant::dequantize(quant::Type::Q4_K, tb->data, vb.data(), kPadded);
    EXPECT_TRUE(std::equal(va.begin(), va.begin() + kFF, vb.begin())) << "only the pad changed";
    EXPECT_FALSE(std::equal(va.begin() + kFF, va.end(), vb.begin() + kFF)) << "the pad changed";
  }
  for (int threads : {1, 2}) {
    SCOPED_TRACE(cat(threads, " threads"));
    backend::CpuBackend be(threads);
    auto m = Model::load(dir.file("m.gguf"), be);
    auto n = Model::load(other, be);
    const auto want = run_logits(*m);
    EXPECT_TRUE(std::all_of(want.begin(), want.end(), [](float v) { return std::isfinite(v); }));
    EXPECT_TRUE(bitwise_equal(run_logits(*n), want));
  }
}

TEST(PadDown, StreamedFromAPackEqualsMappedBitwise) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  synth_tiny(path);
  experts::write_pack(*gguf::Reader::open(path), path + ".experts");
  const auto pack = experts::Pack::open(path + ".experts");
  EXPECT_EQ(pack->layout(0).down.cols, kPadded);
  EXPECT_EQ(pack->layout(0).gate.rows, kFF);
  const uint64_t slot = (pack->max_record_bytes() + 4095) / 4096 * 4096;
  backend::CpuBackend be(1);
  auto mapped = Model::load(path, be);
  const auto want = run_logits(*mapped);
  for (uint64_t slots : {uint64_t(3), uint64_t(pack->n_layers()) * pack->n_experts()}) {
    experts::SourceOptions o;
    o.budget_bytes = slots * slot;
    auto streamed = Model::load(path, be, o);
    EXPECT_TRUE(bitwise_equal(run_logits(*streamed), want)) << slots << " slots";
  }
}

TEST(PadDown, APaddedShapeElsewhereOrOfTheWrongWidthIsAClearError) {
  TempDir dir;
  synth_tiny(dir.file("m.gguf"));
  // A pad of 256 more columns than whole blocks need.
  rewrite_ne0(dir.file("m.gguf"), dir.file("wide.gguf"), kDown0, kPadded + 256);
  std::string err = load_error(dir.file("wide.gguf"));
  EXPECT_NE(err.find(kDown0), std::string::npos) << err;
  EXPECT_NE(err.find("[512, 256, 8]"), std::string::npos) << err;
  EXPECT_NE(err.find("zero-padded"), std::string::npos) << err;
  // Unpadded rows that Q4_K cannot hold are rejected by the reader's block check already.
  // Padding on a tensor without the flag: the up stack's rows (n_embd = 256) padded to 512.
  rewrite_ne0(dir.file("m.gguf"), dir.file("up.gguf"), "blk.0.ffn_up_exps.weight", 512);
  err = load_error(dir.file("up.gguf"));
  EXPECT_NE(err.find("blk.0.ffn_up_exps.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("only qwen4exp's ffn_down_exps"), std::string::npos) << err;
  // llama.cpp-compatible architectures keep exact shapes: qwen3moe falls back, never pads.
  const auto rep = synth_tiny(dir.file("q3.gguf"), "qwen3moe");
  const auto r = gguf::Reader::open(dir.file("q3.gguf"));
  EXPECT_EQ(r->find_tensor(kDown0)->shape[0], kFF);
  EXPECT_EQ(r->find_tensor(kDown0)->type, quant::Type::Q4_0);
  rewrite_ne0(dir.file("q3.gguf"), dir.file("q3pad.gguf"), kDown0, 352);
  err = load_error(dir.file("q3pad.gguf"));
  EXPECT_NE(err.find("only qwen4exp's ffn_down_exps"), std::string::npos) << err;
}

// Overwrites the Q4_K quants that hold only elements 320..511 of each row's last block (elements
// 256..511: sub-blocks 2..7 are qs bytes 32..127, after d, dmin and the 12 scale bytes).
void scribble_pad(std::vector<uint8_t>& rows, size_t row_bytes) {
  for (size_t at = 0; at < rows.size(); at += row_bytes)
    for (size_t k = 0; k < 96; ++k) rows[at + row_bytes / 2 + 16 + 32 + k] = uint8_t(k * 37 + 11);
}

// At the op: the reused workspace's stale values never reach the padded columns (h is zeroed
// there), the pad weights do not matter, and only the one padded width is accepted.
TEST(PadDown, MoeOpZeroesThePadWhateverTheWorkspaceHolds) {
  using quant::Type;
  const int64_t n = 256, T = 3;
  const auto gate = quant::testing::random_weights(Type::Q4_K, kFF * n, 1);
  const auto up = quant::testing::random_weights(Type::Q4_K, kFF * n, 2);
  auto down = quant::testing::random_weights(Type::Q4_K, n * kPadded, 3);
  const size_t down_row = quant::row_bytes(Type::Q4_K, kPadded);
  const auto experts_with = [&](const std::vector<uint8_t>& d, int64_t cols) {
    const backend::Weight g{Type::Q4_K, gate.data(), n, kFF, quant::row_bytes(Type::Q4_K, n)};
    const backend::Weight u{Type::Q4_K, up.data(), n, kFF, g.row_stride};
    const backend::Weight dw{Type::Q4_K, d.data(), cols, n, quant::row_bytes(Type::Q4_K, cols)};
    return std::vector<backend::ExpertWeights>{{g, u, dw}, {u, g, dw}};
  };
  std::vector<float> x = quant::testing::random_floats(T * n, 4);
  const backend::Routing routing{2, {0, 1, 1, 0, 0, 1}, {0.75f, 0.25f, 0.5f, 0.5f, 0.125f, 0.875f}};
  cpu::ThreadPool pool(2);
  const auto run = [&](cpu::Workspace& ws, const std::vector<backend::ExpertWeights>& ex) {
    std::vector<float> y(size_t(T * n), 0.0f);
    cpu::moe_experts(pool, ws, {x.data(), T, n, n}, routing, ex, {y.data(), T, n, n});
    return y;
  };
  cpu::Workspace fresh;
  const auto want = run(fresh, experts_with(down, kPadded));
  EXPECT_TRUE(std::all_of(want.begin(), want.end(), [](float v) { return std::isfinite(v); }));
  cpu::Workspace stale;
  stale.f32.assign(size_t(1) << 16, 7.0f);
  EXPECT_TRUE(bitwise_equal(run(stale, experts_with(down, kPadded)), want));
  auto scribbled = down;
  scribble_pad(scribbled, down_row);
  EXPECT_TRUE(bitwise_equal(run(fresh, experts_with(scribbled, kPadded)), want));
  // 768 is more than whole blocks need.
  const auto wide = quant::testing::random_weights(Type::Q4_K, n * 768, 5);
  try {
    run(fresh, experts_with(wide, 768));
    ADD_FAILURE() << "a down row of 768 for n_ff 320 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit"), std::string::npos) << e.what();
  }
}

// The qwen4_exp fixture's experts are 16 wide: at q8_0 (32-element blocks) each down row is
// quantized from the 16 weights followed by 16 zeros.
TEST(PadDown, ConvertPadsEachDownRowWithZeros) {
  TempDir dir;
  convert::ConvertOptions o;
  o.input_dir = convert::testing::fixture_dir("qwen4_exp").string();
  o.output = dir.file("m.gguf");
  o.trunk_type = "f32";
  o.expert_type = "q8_0";
  o.ngram_type = "f32";
  o.progress = false;
  const auto rep = convert::run_convert(o);
  EXPECT_TRUE(std::any_of(rep.notes.begin(), rep.notes.end(), [](const std::string& n) {
    return n.find("ffn_down_exps.weight: rows zero-padded to ne0 = 32") != std::string::npos;
  }));
  const auto r = gguf::Reader::open(o.output);
  const gguf::TensorInfo* down = r->find_tensor(kDown0);
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, quant::Type::Q8_0);
  ASSERT_EQ(down->shape[0], 32);
  EXPECT_EQ(r->find_tensor("blk.0.ffn_gate_exps.weight")->shape[1], 16);
  std::vector<float> v(size_t(down->n_elements()));
  quant::dequantize(quant::Type::Q8_0, down->data, v.data(), down->n_elements());
  bool real_nonzero = false;
  for (int64_t row = 0; row < down->n_rows(); ++row)
    for (int64_t k = 0; k < 32; ++k) {
      const float x = v[size_t(row * 32 + k)];
      if (k >= 16) ASSERT_EQ(x, 0.0f) << "row " << row << " col " << k;
      else real_nonzero |= x != 0.0f;
    }
  EXPECT_TRUE(real_nonzero);
  backend::CpuBackend be(1);
  auto m = Model::load(o.output, be);
  State st = m->new_state(8);
  const std::vector<int32_t> prompt = {1, 2, 3};
  const auto logits = m->forward(prompt, st, LogitsMode::Last);
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
}

}  // namespace
}  // namespace strata::model
