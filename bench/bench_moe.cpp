// The routed-expert FFN of one decode or verification window, as the CPU backend runs it
// (cpu::moe_experts): the Qwen3-Next-80B-A3B layer shape (2048 wide, 512 experts of 512 rows, top
// 10) with IQ2_XS experts, T rows routed at random over all 512 experts each call, so the expert
// bytes come from DRAM as in a decoding model (one layer's stack is 455 MB).
//  - BM_MoeWindow/rows:T/threads:N: GB/s counts the bytes of the distinct experts a call reads;
//    vs_read_bw divides it by read_bandwidth() at the same thread count; us_per_row is the call's
//    time over its rows (a verification window of T rows against T one-row windows).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/ops_common.h"
#include "backend/cpu/ops_moe.h"
#include "backend/cpu/thread_pool.h"
#include "bench.h"
#include "quant/kernels.h"
#include "util/rng.h"

namespace strata::bench {

namespace {

constexpr int64_t kEmbd = 2048;
constexpr int64_t kFf = 512;
constexpr int64_t kExperts = 512;
constexpr int64_t kTopK = 10;
constexpr quant::Type kType = quant::Type::IQ2_XS;
// Random blocks for this many bytes, repeated over the stack (see bench_matvec's Matrix).
constexpr size_t kTileBytes = size_t(4) << 20;

struct ExpertStack {
  size_t gate_up_stride = quant::row_bytes(kType, kEmbd);
  size_t down_stride = quant::row_bytes(kType, kFf);
  size_t expert_bytes = 2 * size_t(kFf) * gate_up_stride + size_t(kEmbd) * down_stride;
  Buffer weights{expert_bytes * size_t(kExperts)};
  std::vector<backend::ExpertWeights> experts;

  ExpertStack() {
    const size_t block = quant::type_info(kType).block_bytes;
    const size_t tile = kTileBytes / block * block;
    Rng rng(11);
    quant::kernels(kType).random_blocks(rng, weights.data(), int64_t(tile / block));
    for (size_t off = tile; off < weights.size(); off += tile)
      std::memcpy(weights.data() + off, weights.data(), std::min(tile, weights.size() - off));
    for (int64_t e = 0; e < kExperts; ++e) {
      const uint8_t* base = weights.data() + size_t(e) * expert_bytes;
      const uint8_t* up = base + size_t(kFf) * gate_up_stride;
      const uint8_t* down = up + size_t(kFf) * gate_up_stride;
      experts.push_back({{kType, base, kEmbd, kFf, gate_up_stride},
                         {kType, up, kEmbd, kFf, gate_up_stride},
                         {kType, down, kFf, kEmbd, down_stride}});
    }
  }
};

const ExpertStack& stack() {
  static const ExpertStack s;
  return s;
}

// Distinct top-k experts per row, with near-equal weights as a softmax over them gives.
backend::Routing random_routing(Rng& rng, int64_t rows) {
  backend::Routing r;
  r.top_k = kTopK;
  std::vector<int32_t> ids(kExperts);
  for (int64_t t = 0; t < rows; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    for (int64_t j = 0; j < kTopK; ++j) {
      std::swap(ids[size_t(j)], ids[size_t(j + int64_t(rng.next() % uint64_t(kExperts - j)))]);
      r.experts.push_back(ids[size_t(j)]);
      r.weights.push_back(1.0f / float(kTopK));
    }
  }
  return r;
}

void BM_MoeWindow(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int threads = int(state.range(1));
  const ExpertStack& s = stack();
  const Bandwidth dram = read_bandwidth(threads);
  cpu::ThreadPool pool(threads);
  cpu::Workspace ws;
  Rng rng(5);
  std::vector<float> x(size_t(rows * kEmbd)), y(x.size());
  for (float& v : x) v = rng.normal();
  double bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const backend::Routing routing = random_routing(rng, rows);
    std::vector<int32_t> distinct = routing.experts;
    std::sort(distinct.begin(), distinct.end());
    bytes += double(std::unique(distinct.begin(), distinct.end()) - distinct.begin()) *
             double(s.expert_bytes);
    state.ResumeTiming();
    cpu::moe_experts(pool, ws, {x.data(), rows, kEmbd, kEmbd}, routing, s.experts,
                     {y.data(), rows, kEmbd, kEmbd});
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsRate);
  state.counters["vs_read_bw"] = benchmark::Counter(bytes / dram.per_second, benchmark::Counter::kIsRate);
  state.counters["us_per_row"] = benchmark::Counter(
      double(state.iterations() * rows) * 1e-6,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void window_args(benchmark::internal::Benchmark* b) {
  for (int threads : thread_counts())
    for (int rows : {1, 2, 3, 4, 8}) b->Args({rows, threads});
  b->ArgNames({"rows", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_MoeWindow)->Apply(window_args);

}  // namespace

}  // namespace strata::bench
