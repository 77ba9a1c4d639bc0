// Weight bandwidth of the routed experts on the CUDA backend (Backend::moe_experts) for decode
// windows of 1 to 8 rows, in the style of llm.c's dev/cuda: the Qwen3-Next-80B-A3B expert shape
// (512 experts of gate/up [512, 2048] and down [2048, 512], IQ2_XS, top-10), each window first
// checked bit for bit against the CPU backend, then recorded as a graph and replayed, so the time
// is the device's and not the host's launches. A measurement, not a check, so it is disabled:
//   strata_tests --gtest_also_run_disabled_tests --gtest_filter='CudaMoeBandwidth.*'
// (STRATA_MOE_BENCH_ROWS=N measures only windows of N rows, e.g. under ncu.)
// One JSON object per line ("[ json ]" prefix). docs/CUDA.md records the H200 figures.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_CUDA

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include "backend_test_util.h"
#include "cuda_bench_util.h"

namespace strata::backend::testing {
namespace {

constexpr int64_t kExperts = 512, kEmbd = 2048, kFf = 512, kTopK = 10;
constexpr int kWarmupWindows = 3, kTimedWindows = 200;

TEST(CudaMoeBandwidth, DISABLED_DecodeWindows) {
  if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason();
  double copy_gbs;
  {
    cuda::Device dev(0);
    copy_gbs = cuda_bench::copy_rate(dev, size_t(1) << 30).gbs;
  }
  std::unique_ptr<Backend> gpu = cuda::make_cuda_backend(0);
  CpuBackend cpu(2);
  std::vector<HostTensor> tensors;
  for (int64_t e = 0; e < kExperts; ++e) {
    tensors.push_back(random_tensor("gate", quant::Type::IQ2_XS, kFf, kEmbd, 1, 3 * e + 1));
    tensors.push_back(random_tensor("up", quant::Type::IQ2_XS, kFf, kEmbd, 1, 3 * e + 2));
    tensors.push_back(random_tensor("down", quant::Type::IQ2_XS, kEmbd, kFf, 1, 3 * e + 3));
  }
  const size_t expert_bytes =
      tensors[0].bytes.size() + tensors[1].bytes.size() + tensors[2].bytes.size();
  const auto table_on = [&](Backend& b) {
    std::vector<ExpertWeights> table;
    for (size_t i = 0; i < tensors.size(); i += 3)
      table.push_back({b.weight(tensors[i].info), b.weight(tensors[i + 1].info),
                       b.weight(tensors[i + 2].info)});
    return table;
  };
  const std::vector<ExpertWeights> gpu_table = table_on(*gpu), cpu_table = table_on(cpu);
  std::printf("[ json ] {\"copy_gbs\": %.1f, \"expert_bytes\": %zu}\n", copy_gbs, expert_bytes);

  const char* only = std::getenv("STRATA_MOE_BENCH_ROWS");
  Rng rng(7);
  for (const int64_t rows : {1, 2, 4, 8}) {
    if (only && std::atoll(only) != rows) continue;
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    const Routing routing = random_routing(rng, rows, kExperts, kTopK, 0.3f);
    const std::set<int32_t> distinct(routing.experts.begin(), routing.experts.end());
    const Floats x = normal_floats(size_t(rows * kEmbd), 100 + rows);
    const auto run_once = [&](Backend& b, std::span<const ExpertWeights> table) {
      Ids ids = b.alloc_ids(rows, kTopK);
      Tensor weights = b.alloc(rows, kTopK), xt = make(b, rows, kEmbd, x),
             y = b.alloc(rows, kEmbd);
      upload_routing(b, routing, ids, weights);
      b.moe_experts(xt, ids, weights, table, y);
      return read(b, y);
    };
    expect_bitwise(run_once(*gpu, gpu_table), run_once(cpu, cpu_table), "moe_experts vs the CPU");

    Ids ids = gpu->alloc_ids(rows, kTopK);
    Tensor weights = gpu->alloc(rows, kTopK), xt = make(*gpu, rows, kEmbd, x),
           y = gpu->alloc(rows, kEmbd);
    upload_routing(*gpu, routing, ids, weights);
    const uint64_t key = 0x40e0000 + uint64_t(rows);
    const auto window = [&] {
      gpu->begin_window(key);
      gpu->moe_experts(xt, ids, weights, gpu_table, y);
      gpu->end_window(true);
    };
    for (int i = 0; i < kWarmupWindows; ++i) window();
    read(*gpu, y.rows_view(0, 1));
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kTimedWindows; ++i) window();
    read(*gpu, y.rows_view(0, 1));
    const double us = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - start)
                          .count() /
                      kTimedWindows;
    const double bytes = double(distinct.size() * expert_bytes);
    std::printf(
        "[ json ] {\"bench\": \"moe_experts\", \"format\": \"iq2_xs\", \"rows\": %lld, "
        "\"pairs\": %lld, \"distinct_experts\": %zu, \"us\": %.2f, \"expert_gbs\": %.1f, "
        "\"of_copy\": %.3f}\n",
        (long long)rows, (long long)(rows * kTopK), distinct.size(), us, bytes / us / 1e3,
        bytes / us / 1e3 / copy_gbs);
  }
}

}  // namespace
}  // namespace strata::backend::testing

#endif
