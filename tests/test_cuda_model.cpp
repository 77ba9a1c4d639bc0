// The forward pass of every architecture on the CUDA backend: synthetic tiny models (as in
// test_model.cpp) give per-row logits within cosine 0.99999 of the CPU backend's, and on the GPU a
// T-row window gives bitwise the logits of T one-row windows (and of any other split). Skipped
// with the reason where there is no device.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_CUDA

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "synth/synth.h"
#include "test_util.h"

namespace strata::model {
namespace {

using gguf::testing::TempDir;

std::string synth_tiny(const TempDir& dir, const std::string& arch, const std::string& expert_type) {
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
  return out;
}

struct Case {
  std::string arch, expert_type;
};

class CudaModel : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason();
  }
};

TEST_P(CudaModel, MatchesCpuAndWindowsAreBitwise) {
  TempDir dir;
  const std::string path = synth_tiny(dir, GetParam().arch, GetParam().expert_type);
  backend::CpuBackend cpu(2);
  backend::CudaBackend gpu(0);
  auto mc = Model::load(path, cpu);
  auto mg = Model::load(path, gpu);
  const int64_t vocab = mc->config().n_vocab, n = 21;
  const auto tokens = some_tokens(n, vocab, 1);
  const auto want = run_windows(*mc, tokens, {n});
  const auto got = run_windows(*mg, tokens, {n});
  ASSERT_EQ(got.size(), want.size());
  double worst = 1.0;
  for (int64_t r = 0; r < n; ++r) {
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double a = got[size_t(r * vocab + i)], b = want[size_t(r * vocab + i)];
      ASSERT_TRUE(std::isfinite(a)) << "row " << r;
      dot += a * b, na += a * a, nb += b * b;
    }
    worst = std::min(worst, dot / std::sqrt(na * nb));
  }
  std::printf("[ cosine   ] %s/%s: worst row %.9f, %.1f MiB of weights on the device\n",
              GetParam().arch.c_str(), GetParam().expert_type.c_str(), worst,
              double(gpu.device_bytes_used()) / (1 << 20));
  EXPECT_GE(worst, 0.99999);
  const backend::BackendCounters before = gpu.counters();
  EXPECT_TRUE(strata::testing::bitwise_equal(got, run_windows(*mg, tokens, std::vector<int64_t>(n, 1))))
      << "T-row window vs one-row windows on the GPU (recorded as a graph and replayed)";
  const backend::BackendCounters after = gpu.counters();
  std::printf("[ graphs   ] %s: %llu captured, %llu replayed, %.1f kernels per replay\n",
              GetParam().arch.c_str(), (unsigned long long)(after.graph_captures - before.graph_captures),
              (unsigned long long)(after.graph_replays - before.graph_replays),
              after.graph_replays == before.graph_replays
                  ? 0.0
                  : double(after.graph_kernels - before.graph_kernels) /
                        double(after.graph_replays - before.graph_replays));
  // Every architecture replays: one-row windows at 21 positions, qwen4exp's QSA completing
  // blocks at some of them, all from one recording, made by the first two (op by op, captured).
  EXPECT_GT(after.graph_replays, before.graph_replays);
  EXPECT_EQ(after.warming_windows - before.warming_windows, 2u);
  EXPECT_TRUE(strata::testing::bitwise_equal(got, run_windows(*mg, tokens, {5, 1, 12, 3})))
      << "another split on the GPU";
}

// STRATA_CUDA_PROFILE=1: windows run op by op behind a gate the host raises at the window's end;
// the logits are the unprofiled backend's bits, and every op run has a device time.
TEST(CudaOpProfile, TimesEveryOpAndKeepsTheBits) {
  if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason();
  TempDir dir;
  const std::string path = synth_tiny(dir, "qwen3next", "iq2_xs");
  backend::CudaBackend plain(0);
  auto mp = Model::load(path, plain);
  const auto tokens = some_tokens(9, mp->config().n_vocab, 3);
  const auto want = run_windows(*mp, tokens, {4, 1, 1, 1, 1, 1});
  ASSERT_EQ(setenv("STRATA_CUDA_PROFILE", "1", 1), 0);
  backend::CudaBackend profiled(0);
  ASSERT_EQ(unsetenv("STRATA_CUDA_PROFILE"), 0);
  // The first windows size the backend's scratch, a host wait mid-window: the profile discards
  // them. Once warm, no window waits.
  auto warm = Model::load(path, profiled);
  run_windows(*warm, tokens, {4, 1, 1, 1, 1, 1});
  const uint64_t discarded_warming = profiled.counters().profiled_windows_discarded;
  auto mq = Model::load(path, profiled);
  EXPECT_TRUE(strata::testing::bitwise_equal(want, run_windows(*mq, tokens, {4, 1, 1, 1, 1, 1})));
  const backend::BackendCounters c = profiled.counters();
  EXPECT_EQ(c.graph_captures, 0u) << "profiled windows run op by op";
  EXPECT_EQ(c.profiled_windows_discarded, discarded_warming);
  uint64_t calls = 0;
  for (const auto& [name, t] : c.op_times) {
    EXPECT_GT(t.us, 0.0) << name;
    if (name != "alloc (zeroing)") calls += t.calls;
  }
  EXPECT_GT(calls, 0u);
  EXPECT_LE(calls, c.ops) << "ops outside windows (state set-up) are counted, not timed";
  EXPECT_TRUE(c.op_times.count("matmul") && c.op_times.count("moe_experts"));
  EXPECT_TRUE(plain.counters().op_times.empty());
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaModel,
                         ::testing::Values(Case{"qwen3moe", "q4_k"}, Case{"qwen3next", "q4_k"},
                                           Case{"qwen35moe", "q4_k"}, Case{"qwen4exp", "q4_k"},
                                           Case{"qwen3next", "iq2_xs"}, Case{"qwen35moe", "f32"}),
                         [](const auto& info) {
                           return info.param.arch + "_" + info.param.expert_type;
                         });

}  // namespace
}  // namespace strata::model

#else

TEST(CudaModel, NotCompiled) { GTEST_SKIP() << "the CUDA backend is not compiled in (no nvcc)"; }

#endif
