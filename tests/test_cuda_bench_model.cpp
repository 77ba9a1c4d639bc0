// A first measurement of the whole forward pass on the CUDA backend (a disabled gtest, run by
// scripts/gpu_run.sh with --gtest_also_run_disabled_tests): a 2-layer Qwen3-Next-80B-A3B-shape
// synthetic model with IQ2_XS experts, prefill of 128 tokens and 32 decode steps, on the GPU and
// on the CPU backend of the same machine. Prints one JSON line per backend.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_CUDA

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "synth/synth.h"

namespace strata::model {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// gpu: the same backend as `be` when it is the CUDA one (for its weight bytes), else null.
void measure(const char* name, backend::Backend& be, const backend::CudaBackend* gpu,
             const std::string& path) {
  auto m = Model::load(path, be);
  const size_t device_bytes = gpu ? gpu->device_bytes_used() : 0;
  const int64_t prefill = 128, decode = 32, vocab = m->config().n_vocab;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < prefill + decode; ++i) tokens.push_back(int32_t((i * 7919) % vocab));
  State st = m->new_state(prefill + decode + 1);
  m->forward(std::span(tokens).first(8), st, LogitsMode::Last);  // warm-up (first launches)
  st.reset();
  auto t0 = Clock::now();
  m->forward(std::span(tokens).first(size_t(prefill)), st, LogitsMode::Last);
  const double prefill_s = seconds_since(t0);
  t0 = Clock::now();
  for (int64_t i = 0; i < decode; ++i)
    m->forward(std::span(tokens).subspan(size_t(prefill + i), 1), st, LogitsMode::Last);
  const double decode_s = seconds_since(t0);
  std::printf(
      "{\"bench\": \"forward\", \"backend\": \"%s\", \"model\": \"qwen3next 80b-a3b shape, 2 "
      "layers, iq2_xs experts\", \"prefill_tokens\": %lld, \"prefill_tok_s\": %.1f, "
      "\"decode_tokens\": %lld, \"decode_ms_per_token\": %.3f, \"decode_tok_s\": %.1f, "
      "\"device_weight_bytes\": %zu}\n",
      name, (long long)prefill, double(prefill) / prefill_s, (long long)decode,
      1e3 * decode_s / double(decode), double(decode) / decode_s, device_bytes);
}

TEST(CudaModelBench, DISABLED_TwoLayerQwen3NextShape) {
  if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason();
  gguf::testing::TempDir dir;
  synth::SynthOptions o;
  o.arch = "qwen3next";
  o.preset = "qwen3-next-80b-a3b";
  o.layers = 2;
  o.expert_type = "iq2_xs";
  o.output = dir.file("bench.gguf");
  o.progress = false;
  o.seed = 3;
  synth::run_synth(o);
  {
    backend::CudaBackend gpu(0);
    measure("cuda", gpu, &gpu, o.output);
  }
  backend::CpuBackend cpu(int(std::thread::hardware_concurrency()));
  measure("cpu", cpu, nullptr, o.output);
}

}  // namespace
}  // namespace strata::model

#endif
