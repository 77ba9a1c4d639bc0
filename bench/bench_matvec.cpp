// Mat-vec speed of every weight format with kernels, in weight bytes streamed per second:
//  - matvec_stream: 512 MiB of weights (several times the LLC), so the kernel has to keep up
//    with DRAM; vs_read_bw compares it with read_bandwidth() at the same thread count
//    (vs_read_bw_cpu: the same per CPU second, see thread_cpu_seconds).
//  - matvec_cached: 1 MiB (fits in L2), so the number is the kernel's compute speed.
//  - matvec_ref: the scalar reference dot, one thread, 8 MiB, for comparison.
//  - quantize_act: preparing the activation, once per mat-vec.
// The shape is the flagship's hidden width (2560 columns); rows fill the byte budget.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/matvec.h"
#include "backend/cpu/thread_pool.h"
#include "bench.h"
#include "quant/kernels.h"
#include "util/rng.h"

namespace strata::bench {

namespace {

constexpr int64_t kCols = 2560;
constexpr size_t kStreamBytes = size_t(512) << 20;
constexpr size_t kCachedBytes = size_t(1) << 20;
constexpr size_t kRefBytes = size_t(8) << 20;
// Random blocks are generated for a tile this large and repeated: the caches key on addresses,
// not contents, and generating 512 MiB block by block would take longer than the benchmark.
constexpr size_t kTileBytes = size_t(4) << 20;

struct Matrix {
  quant::Type type;
  size_t budget;
  size_t row_stride;
  int64_t rows;
  Buffer weights;

  Matrix(quant::Type t, size_t budget)
      : type(t),
        budget(budget),
        row_stride(quant::row_bytes(t, kCols)),
        rows(std::max<int64_t>(1, int64_t(budget / row_stride))),
        weights(row_stride * size_t(rows)) {
    const quant::TypeInfo& info = quant::type_info(t);
    const size_t tile = std::min(weights.size(), kTileBytes / row_stride * row_stride);
    Rng rng(uint64_t(t) * 7919 + 1);
    quant::kernels(t).random_blocks(rng, weights.data(), int64_t(tile / info.block_bytes));
    for (size_t off = tile; off < weights.size(); off += tile)
      std::memcpy(weights.data() + off, weights.data(), std::min(tile, weights.size() - off));
  }
  size_t bytes() const { return row_stride * size_t(rows); }
};

// Benchmarks run in registration order, so holding the last matrix built lets the runs of one
// format share it without keeping every format's 512 MiB alive at once.
const Matrix& matrix(quant::Type t, size_t budget) {
  static std::unique_ptr<Matrix> last;
  if (!last || last->type != t || last->budget != budget) {
    last.reset();
    last = std::make_unique<Matrix>(t, budget);
  }
  return *last;
}

std::vector<float> activation() {
  Rng rng(42);
  std::vector<float> x(kCols);
  for (float& v : x) v = rng.normal();
  return x;
}

// threads: the pool size; compare_to_dram: add vs_read_bw; cpu_seconds: the caller's CPU time
// in the timed loop (GB/s_cpu is only meaningful when the caller did all the work).
void report(benchmark::State& state, const Matrix& m, int threads, bool compare_to_dram,
            double cpu_seconds) {
  const double bytes = double(m.bytes());
  const double bytes_per_cpu_second = bytes * double(state.iterations()) / cpu_seconds;
  if (threads == 1) state.counters["GB/s_cpu"] = bytes_per_cpu_second * 1e-9;
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(m.bytes()));
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["rows"] = double(m.rows);
  if (compare_to_dram) {
    const Bandwidth dram = read_bandwidth(threads);
    state.counters["vs_read_bw"] =
        benchmark::Counter(bytes / dram.per_second, benchmark::Counter::kIsIterationInvariantRate);
    if (threads == 1) state.counters["vs_read_bw_cpu"] = bytes_per_cpu_second / dram.per_cpu_second;
  }
}

void run_matvec(benchmark::State& state, quant::Type t, size_t budget, bool compare_to_dram) {
  const int threads = int(state.range(0));
  const Matrix& m = matrix(t, budget);
  if (compare_to_dram) read_bandwidth(threads);  // measured before timing, not inside it
  cpu::ThreadPool pool(threads);
  const std::vector<float> x = activation();
  std::vector<float> y(size_t(m.rows));
  std::vector<uint8_t> act(quant::act_bytes(quant::kernels(t).act, kCols));
  const double cpu0 = thread_cpu_seconds();
  for (auto _ : state) {
    cpu::matvec_parallel(pool, t, m.weights.data(), m.row_stride, m.rows, kCols, x.data(),
                         y.data(), act.data());
    benchmark::ClobberMemory();
  }
  report(state, m, threads, compare_to_dram, thread_cpu_seconds() - cpu0);
}

void run_ref(benchmark::State& state, quant::Type t) {
  const quant::FormatKernels& k = quant::kernels(t);
  const Matrix& m = matrix(t, kRefBytes);
  const std::vector<float> x = activation();
  std::vector<float> y(size_t(m.rows));
  std::vector<uint8_t> act(quant::act_bytes(k.act, kCols));
  const double cpu0 = thread_cpu_seconds();
  for (auto _ : state) {
    quant::quantize_act_ref(k.act, x.data(), act.data(), kCols);
    for (int64_t r = 0; r < m.rows; ++r)
      y[size_t(r)] = k.dot_ref(m.weights.data() + size_t(r) * m.row_stride, act.data(), kCols);
    benchmark::ClobberMemory();
  }
  report(state, m, 1, false, thread_cpu_seconds() - cpu0);
}

const char* act_name(quant::ActFormat f) {
  switch (f) {
    case quant::ActFormat::F32: return "f32";
    case quant::ActFormat::Q8_0: return "q8_0";
    case quant::ActFormat::Q8_K: return "q8_K";
  }
  return "?";
}

void run_quantize_act(benchmark::State& state, quant::ActFormat f, bool ref) {
  const int64_t cols = state.range(0);
  Rng rng(7);
  std::vector<float> x(static_cast<size_t>(cols));
  for (float& v : x) v = rng.normal();
  std::vector<uint8_t> out(quant::act_bytes(f, cols));
  for (auto _ : state) {
    (ref ? quant::quantize_act_ref : quant::quantize_act)(f, x.data(), out.data(), cols);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * cols * int64_t(sizeof(float)));
}

}  // namespace

void register_matvec_benchmarks() {
  // Every type id strata knows, so formats get benchmarked as soon as their kernels register.
  std::vector<quant::Type> formats;
  for (uint32_t id = 0; id < 4096; ++id)
    if (auto info = quant::find_type(id); info && info->weight_format && quant::has_kernels(info->type))
      formats.push_back(info->type);

  for (quant::Type t : formats) {
    const std::string name = quant::type_name(t);
    auto* stream = benchmark::RegisterBenchmark(("matvec_stream/" + name).c_str(), run_matvec, t,
                                                kStreamBytes, true);
    auto* cached = benchmark::RegisterBenchmark(("matvec_cached/" + name).c_str(), run_matvec, t,
                                                kCachedBytes, false);
    for (auto* b : {stream, cached}) {
      for (int threads : thread_counts()) b->Arg(threads);
      b->ArgName("threads")->UseRealTime()->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("matvec_ref/" + name).c_str(), run_ref, t)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }

  std::vector<quant::ActFormat> acts;
  for (quant::Type t : formats)
    if (std::find(acts.begin(), acts.end(), quant::kernels(t).act) == acts.end())
      acts.push_back(quant::kernels(t).act);
  for (quant::ActFormat f : acts)
    for (bool ref : {false, true})
      benchmark::RegisterBenchmark(
          (std::string("quantize_act/") + act_name(f) + (ref ? "/ref" : "")).c_str(),
          run_quantize_act, f, ref)
          ->Arg(640)
          ->Arg(kCols)
          ->ArgName("cols")
          ->Unit(benchmark::kNanosecond);
}

}  // namespace strata::bench
