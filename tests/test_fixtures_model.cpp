// The forward pass against the Hugging Face reference (docs/FIXTURES.md): each fixture folder is
// converted to an f32 GGUF by `strata convert`'s API, run on each backend (the CPU; CUDA where it
// is compiled in, skipped without a device), and compared row by row
// with the reference logits (cosine >= min_cosine, max |diff| <= max_abs from meta.json) over
// one full prefill window and over a token-by-token greedy decode that must reproduce
// greedy.json exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <tuple>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_test_util.h"
#include "convert/convert.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "util/npy.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;
using gguf::testing::TempDir;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

struct RowStats {
  double min_cosine = 1.0;
  double max_abs = 0.0;
  int64_t worst_row = -1;
};

// Compares `ours` rows against reference rows first_ref.. of `ref` ([rows, vocab]).
void compare_rows(const std::vector<float>& ours, const std::vector<float>& ref, int64_t vocab,
                  int64_t first_ref, RowStats& s) {
  const int64_t rows = int64_t(ours.size()) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ours.data() + r * vocab;
    const float* b = ref.data() + (first_ref + r) * vocab;
    double dot = 0, na = 0, nb = 0, mx = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      dot += double(a[i]) * b[i];
      na += double(a[i]) * a[i];
      nb += double(b[i]) * b[i];
      mx = std::max(mx, std::fabs(double(a[i]) - b[i]));
    }
    const double cosine = dot / std::sqrt(na * nb);
    if (cosine < s.min_cosine || mx > s.max_abs) s.worst_row = first_ref + r;
    s.min_cosine = std::min(s.min_cosine, cosine);
    s.max_abs = std::max(s.max_abs, mx);
  }
}

int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

// The fixtures' folder: $STRATA_FIXTURES where set (a GPU-machine bundle carries its own copy),
// else the source tree's.
fs::path fixture_root() {
  if (const char* dir = std::getenv("STRATA_FIXTURES")) return dir;
  return fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures";
}

// (fixture, backend)
class Fixture : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Fixture, MatchesReferenceLogitsAndGreedy) {
  const std::string& name = std::get<0>(GetParam());
  const std::string why = backend::testing::unavailable(std::get<1>(GetParam()));
  if (!why.empty()) GTEST_SKIP() << why;
  const fs::path src = fixture_root() / name;
  TempDir dir;
  convert::ConvertOptions co;
  co.input_dir = src.string();
  co.output = dir.file("model.gguf");
  co.trunk_type = co.expert_type = co.ngram_type = "f32";
  co.progress = false;
  convert::run_convert(co);

  // One CPU thread: results do not depend on it (test_model.cpp checks), and a pool on a busy CI
  // box spends more time in barriers than in these tiny ops.
  std::unique_ptr<backend::Backend> be = std::get<1>(GetParam()) == "cpu"
                                             ? std::make_unique<backend::CpuBackend>(1)
                                             : backend::testing::make_backend(std::get<1>(GetParam()));
  auto m = Model::load(co.output, *be);
  const int64_t vocab = m->config().n_vocab;
  const auto prompt = npy::read((src / "prompt.npy").string()).int32s();
  const npy::Array ref_arr = npy::read((src / "logits.npy").string());
  const auto ref = ref_arr.floats();
  const auto greedy = read_json(src / "greedy.json")["tokens"].get<std::vector<int32_t>>();
  const auto cmp = read_json(src / "meta.json")["comparison"];
  const double min_cosine = cmp["min_cosine"], max_abs = cmp["max_abs"];
  ASSERT_EQ(ref_arr.shape,
            (std::vector<int64_t>{int64_t(prompt.size() + greedy.size() - 1), vocab}));

  // One window over prompt + greedy[:-1], as the reference's full forward.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), greedy.begin(), greedy.end() - 1);
  State st = m->new_state(int64_t(all.size()));
  RowStats full;
  compare_rows(m->forward(all, st, LogitsMode::All), ref, vocab, 0, full);

  // Prefill the prompt, then decode greedily one token per window.
  st.reset();
  RowStats decode;
  auto logits = m->forward(prompt, st, LogitsMode::Last);
  std::vector<int32_t> ours;
  for (size_t i = 0; i < greedy.size(); ++i) {
    compare_rows(logits, ref, vocab, int64_t(prompt.size() + i - 1), decode);
    ours.push_back(argmax(logits.data(), vocab));
    if (i + 1 < greedy.size())
      logits = m->forward(std::span(&ours.back(), 1), st, LogitsMode::Last);
  }
  std::printf(
      "%s: full window min cosine %.8f max abs %.3g (row %lld); decode min cosine %.8f "
      "max abs %.3g; bound %.3g\n",
      (name + "/" + be->name()).c_str(), full.min_cosine, full.max_abs, (long long)full.worst_row,
      decode.min_cosine, decode.max_abs, max_abs);
  EXPECT_GE(full.min_cosine, min_cosine) << "worst row " << full.worst_row;
  EXPECT_LE(full.max_abs, max_abs) << "worst row " << full.worst_row;
  EXPECT_GE(decode.min_cosine, min_cosine) << "worst row " << decode.worst_row;
  EXPECT_LE(decode.max_abs, max_abs) << "worst row " << decode.worst_row;
  EXPECT_EQ(ours, greedy);
}

INSTANTIATE_TEST_SUITE_P(
    Reference, Fixture,
    ::testing::Combine(::testing::Values("qwen3_moe", "qwen3_next", "qwen3_5_moe", "qwen4_exp"),
                       ::testing::ValuesIn(backend::testing::backend_names())),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
}  // namespace strata::model
