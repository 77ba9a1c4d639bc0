// A replayed window launches its graph at its last upload (backend/cuda/window_graphs.h), so the
// later a window uploads, the less of the host's walk of the model runs beside the GPU. Every
// window therefore uploads all its inputs before its first layer: token ids, positions,
// qwen4exp's PLE n-gram ids and QSA key blocks, a draw's uniforms. Checked here on the CPU
// backend, which sees the same calls in the same order: no upload after the window's first
// matrix product, for greedy, drawn and plain windows, one sequence and several.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "synth/synth.h"
#include "test_util.h"

namespace strata::model {
namespace {

using gguf::testing::TempDir;
using strata::testing::some_tokens;

// The CPU backend, counting the uploads each window makes after its first matrix product (matmuls
// runs through matmul on it).
class UploadOrderBackend : public backend::CpuBackend {
 public:
  UploadOrderBackend() : CpuBackend(1) {}

  void begin_window(uint64_t key) override {
    computing_ = false;
    CpuBackend::begin_window(key);
  }
  void upload(const float* host, backend::Tensor dst) override {
    note_upload();
    CpuBackend::upload(host, dst);
  }
  void upload_ids(const int32_t* host, backend::Ids dst) override {
    note_upload();
    CpuBackend::upload_ids(host, dst);
  }
  void matmul(const backend::Weight& w, const backend::Tensor& x, backend::Tensor y) override {
    computing_ = true;
    CpuBackend::matmul(w, x, y);
  }
  // The CPU's router writes its results with upload calls of its own: not a window's input.
  void route_softmax_topk(const backend::Tensor& logits, bool renormalize, backend::Ids experts,
                          backend::Tensor weights) override {
    in_op_ = true;
    CpuBackend::route_softmax_topk(logits, renormalize, experts, weights);
    in_op_ = false;
  }

  int uploads = 0, late_uploads = 0;

 private:
  void note_upload() {
    if (in_op_) return;
    ++uploads;
    if (computing_) ++late_uploads;
  }
  bool computing_ = false, in_op_ = false;
};

class WindowInputs : public ::testing::TestWithParam<std::string> {};

TEST_P(WindowInputs, EveryUploadComesBeforeTheFirstLayer) {
  TempDir dir;
  synth::SynthOptions o;
  o.arch = GetParam();
  o.preset = "tiny";
  o.output = dir.file(o.arch + ".gguf");
  o.progress = false;
  o.seed = 5;
  synth::run_synth(o);
  UploadOrderBackend be;
  auto m = Model::load(o.output, be);
  const int64_t v = m->config().n_vocab;
  const auto expect_early = [&](const std::string& what, auto&& window) {
    be.uploads = be.late_uploads = 0;
    window();
    EXPECT_GT(be.uploads, 0) << what;
    EXPECT_EQ(be.late_uploads, 0) << what << ": " << be.late_uploads << " of " << be.uploads
                                  << " uploads came after the first matrix product";
  };

  // Past a QSA block boundary (the tiny qwen4exp's blocks are shorter than 9 rows), so that the
  // windows complete blocks.
  State st = m->new_state(64);
  const std::vector<int32_t> prompt = some_tokens(9, v, 3);
  expect_early("a 9-row prefill", [&] { m->forward(prompt, st, LogitsMode::All); });
  std::vector<int32_t> greedy;
  const std::vector<int32_t> next = some_tokens(1, v, 4);
  expect_early("a greedy decode window", [&] { m->forward(next, st, LogitsMode::Last, {.greedy = &greedy}); });
  TopLogits draw;
  draw.draw_temperature = 0.8f;
  draw.uniforms = {0.25f};
  expect_early("a drawn decode window", [&] { m->forward(next, st, LogitsMode::Last, {.top_k = &draw}); });
  EXPECT_EQ(draw.columns.size(), 1u);

  State a = m->new_state(64), b = m->new_state(64);
  const std::vector<int32_t> ta = some_tokens(7, v, 5), tb = some_tokens(3, v, 6);
  TopLogits draw_b;
  draw_b.draw_temperature = 1.1f;
  draw_b.uniforms = {0.5f, 0.75f, 0.125f};
  std::vector<int32_t> greedy_a;
  const std::vector<Model::SequenceRows> rows = {{ta, &a, LogitsMode::Last, &greedy_a},
                                                 {tb, &b, LogitsMode::All, nullptr, &draw_b}};
  expect_early("two sequences sharing a window", [&] { m->forward_batch(rows); });
  EXPECT_EQ(greedy_a.size(), 1u);
  EXPECT_EQ(draw_b.columns.size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Archs, WindowInputs, ::testing::Values("qwen3next", "qwen4exp", "qwen3moe"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::model
