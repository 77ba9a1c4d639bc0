// The MTP head against its reference (tests/fixtures/mtp/, tools/make_mtp_fixtures.py): the
// trunk fixture plus the head's mtp.* tensors converted to an f32 GGUF, the trunk's hidden states
// of prompt + greedy[:31] fed to Model::mtp_forward with the next tokens, and the logits compared
// row by row with the forward pass's bounds. Also: the head run in pieces (catch-up window, then
// one row at a time, as the drafter runs it) gives the one-window logits bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "convert/convert.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "test_util.h"
#include "util/npy.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;
using gguf::testing::TempDir;
using strata::testing::bitwise_equal;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// The trunk fixture's files and the head's, side by side, converted to f32.
std::string convert_with_head(const std::string& arch, const TempDir& dir) {
  const fs::path fixtures = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures";
  const fs::path folder = dir.file("hf");
  fs::create_directories(folder);
  for (const char* f : {"model.safetensors", "config.json"}) fs::copy_file(fixtures / arch / f, folder / f);
  for (const char* f : {"mtp.safetensors", "model.safetensors.index.json"})
    fs::copy_file(fixtures / "mtp" / arch / f, folder / f);
  convert::ConvertOptions co;
  co.input_dir = folder.string();
  co.output = dir.file("model.gguf");
  co.trunk_type = co.expert_type = co.ngram_type = "f32";
  co.progress = false;
  convert::run_convert(co);
  return co.output;
}

// prompt + greedy[:31] of the trunk fixture.
std::vector<int32_t> fixture_ids(const std::string& arch) {
  const fs::path src = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / arch;
  std::vector<int32_t> ids = npy::read((src / "prompt.npy").string()).int32s();
  const auto greedy = read_json(src / "greedy.json")["tokens"].get<std::vector<int32_t>>();
  ids.insert(ids.end(), greedy.begin(), greedy.end() - 1);
  return ids;
}

// The trunk's hidden states of every position of ids.
std::vector<float> trunk_hidden(Model& m, const std::vector<int32_t>& ids) {
  State st = m.new_state(int64_t(ids.size()));
  std::vector<float> hidden;
  m.forward(ids, st, LogitsMode::Last, {.hidden = &hidden});
  return hidden;
}

class MtpFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpFixture, MatchesReference) {
  const std::string arch = GetParam();
  TempDir dir;
  backend::CpuBackend be(1);
  auto m = Model::load(convert_with_head(arch, dir), be);
  ASSERT_TRUE(m->has_mtp());
  const auto ids = fixture_ids(arch);
  const auto hidden = trunk_hidden(*m, ids);
  const int64_t rows = int64_t(ids.size()) - 1, vocab = m->config().n_vocab, cols = m->hidden_cols();
  State mtp = m->new_mtp_state(rows);
  const auto ours = m->mtp_forward(std::span(ids).subspan(1), std::span(hidden).first(size_t(rows * cols)), mtp,
                                   LogitsMode::All, nullptr);

  const fs::path ref_dir = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "mtp" / arch;
  const npy::Array ref_arr = npy::read((ref_dir / "mtp_logits.npy").string());
  ASSERT_EQ(ref_arr.shape, (std::vector<int64_t>{rows, vocab}));
  const auto ref = ref_arr.floats();
  const auto cmp = read_json(ref_dir / "meta.json")["comparison"];
  const double min_cosine = cmp["min_cosine"], max_abs = cmp["max_abs"];
  double worst_cos = 1, worst_abs = 0;
  int64_t argmax_agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ours.data() + r * vocab;
    const float* b = ref.data() + r * vocab;
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      dot += double(a[i]) * b[i];
      na += double(a[i]) * a[i];
      nb += double(b[i]) * b[i];
      worst_abs = std::max(worst_abs, std::fabs(double(a[i]) - b[i]));
    }
    worst_cos = std::min(worst_cos, dot / std::sqrt(na * nb));
    argmax_agree += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
  }
  std::printf("%s MTP: min cosine %.8f max abs %.3g (bound %.3g), argmax agree %lld/%lld\n", arch.c_str(), worst_cos,
              worst_abs, max_abs, (long long)argmax_agree, (long long)rows);
  EXPECT_GE(worst_cos, min_cosine);
  EXPECT_LE(worst_abs, max_abs);
  EXPECT_EQ(argmax_agree, rows);
}

INSTANTIATE_TEST_SUITE_P(Reference, MtpFixture, ::testing::Values("qwen3_5_moe", "qwen4_exp"));

class MtpPieces : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpPieces, CatchUpThenSingleRowsEqualsOneWindowBitwise) {
  TempDir dir;
  backend::CpuBackend be(1);
  auto m = Model::load(convert_with_head(GetParam(), dir), be);
  const auto ids = fixture_ids(GetParam());
  const auto hidden = trunk_hidden(*m, ids);
  const int64_t rows = int64_t(ids.size()) - 1, cols = m->hidden_cols(), vocab = m->config().n_vocab;
  const auto next = std::span(ids).subspan(1);
  State whole = m->new_mtp_state(rows), pieces = m->new_mtp_state(rows);
  std::vector<float> out_whole, out_piece;
  const auto all = m->mtp_forward(next, std::span(hidden).first(size_t(rows * cols)), whole, LogitsMode::All, &out_whole);
  std::vector<float> got;
  const int64_t first = 200;
  auto part = m->mtp_forward(next.first(size_t(first)), std::span(hidden).first(size_t(first * cols)), pieces,
                             LogitsMode::All, &out_piece);
  got.insert(got.end(), part.begin(), part.end());
  for (int64_t r = first; r < rows; ++r) {
    part = m->mtp_forward(next.subspan(size_t(r), 1), std::span(hidden).subspan(size_t(r * cols), size_t(cols)), pieces,
                          LogitsMode::Last, &out_piece);
    got.insert(got.end(), part.begin(), part.end());
  }
  EXPECT_EQ(int64_t(got.size()), rows * vocab);
  EXPECT_TRUE(bitwise_equal(got, all));
  // The last row's output hidden state (what a chained step reads) agrees too.
  EXPECT_TRUE(bitwise_equal(std::vector<float>(out_whole.end() - cols, out_whole.end()), out_piece));
  EXPECT_THROW(m->mtp_forward(next.first(2), std::span(hidden).first(size_t(cols)), pieces, LogitsMode::Last, nullptr),
               Error);
}

INSTANTIATE_TEST_SUITE_P(HeadArchitectures, MtpPieces, ::testing::Values("qwen3_5_moe", "qwen4_exp"));

}  // namespace
}  // namespace strata::model
