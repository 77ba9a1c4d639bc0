// Multi-activation dot speed (quant::DotRows, the prefill kernels of matmul and the MoE tiles):
// dot_rows/FORMAT/count:N dots every row of a 1 MiB weight matrix (cached, so the kernel's compute
// speed) with N activations per call, over 8 activations. Counters, per CPU second of the one
// thread (thread_cpu_seconds, so a shared box reports what the kernel does when it runs):
//  - MAC/s_cpu: weight x activation products, the prefill rate; count:1 is the decode kernel.
//  - GB/s_cpu: weight bytes decoded per CPU second (each row once per call).
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "bench.h"
#include "quant/kernels.h"
#include "util/rng.h"

namespace strata::bench {

namespace {

constexpr int64_t kCols = 2048;  // Qwen3-Next's hidden width
constexpr size_t kWeightBytes = size_t(1) << 20;
constexpr int kActs = 8;

void run_dot_rows(benchmark::State& state, quant::Type t, int count) {
  const quant::FormatKernels& k = quant::kernels(t);
  const size_t stride = quant::row_bytes(t, kCols);
  const int64_t rows = int64_t(kWeightBytes / stride);
  Buffer weights(stride * size_t(rows));
  Rng rng(uint64_t(t) + 11);
  k.random_blocks(rng, weights.data(), int64_t(weights.size() / quant::type_info(t).block_bytes));
  const size_t act_bytes = quant::act_bytes(k.act, kCols);
  std::vector<uint8_t> acts(act_bytes * kActs);
  std::vector<float> x(static_cast<size_t>(kCols));
  for (int j = 0; j < kActs; ++j) {
    for (auto& v : x) v = rng.normal();
    quant::quantize_act(k.act, x.data(), acts.data() + act_bytes * size_t(j), kCols);
  }
  const quant::DotRows dots = quant::dot_rows_kernel(t);
  std::vector<float> out(size_t(rows) * kActs);
  double cpu = 0;
  for (auto _ : state) {
    const double c0 = thread_cpu_seconds();
    for (int j0 = 0; j0 < kActs; j0 += count) {
      const void* ptrs[quant::kMaxDotRows];
      for (int j = 0; j < count; ++j) ptrs[j] = acts.data() + act_bytes * size_t(j0 + j);
      for (int64_t r = 0; r < rows; ++r)
        dots(weights.data() + size_t(r) * stride, ptrs, count, kCols,
             out.data() + size_t(r) * kActs + size_t(j0));
    }
    benchmark::DoNotOptimize(out.data());
    cpu += thread_cpu_seconds() - c0;
  }
  const double macs = double(state.iterations()) * double(rows) * kCols * kActs;
  const double bytes = double(state.iterations()) * double(weights.size()) * (kActs / count);
  state.counters["MAC/s_cpu"] = macs / cpu;
  state.counters["GB/s_cpu"] = bytes / cpu * 1e-9;
}

}  // namespace

void register_dot_rows_benchmarks() {
  for (quant::Type t : {quant::Type::Q8_0, quant::Type::IQ2_XS, quant::Type::Q4_K, quant::Type::Q6_K,
                        quant::Type::F32})
    for (int count : {1, 2, 4, 8})
      benchmark::RegisterBenchmark(
          ("dot_rows/" + std::string(quant::type_name(t)) + "/count:" + std::to_string(count))
              .c_str(),
          run_dot_rows, t, count)
          ->Unit(benchmark::kMicrosecond);
}

}  // namespace strata::bench
