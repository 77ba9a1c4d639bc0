// Memory bandwidth of this machine: what a mat-vec over weights far larger than the last-level
// cache can at best reach. Read: a sum-reduce with 256-bit loads; copy: memcpy, counted as the
// bytes read plus the bytes written (STREAM's convention). Both over buffers far larger than the
// LLC, each thread on its own contiguous slice.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "bench.h"
#include "util/cpu.h"

namespace strata::bench {

namespace {

constexpr size_t kReadBytes = size_t(1) << 30;
constexpr size_t kCopyBytes = size_t(512) << 20;  // each of source and destination
constexpr size_t kHugePage = size_t(2) << 20;

__attribute__((target("avx2"))) uint64_t sum_avx2(const uint8_t* p, size_t n) {
  // Eight independent accumulators so the adds never wait on each other; integer adds so the
  // result does not depend on the (arbitrary) buffer contents being valid floats.
  __m256i acc[8];
  for (auto& a : acc) a = _mm256_setzero_si256();
  const auto* v = reinterpret_cast<const __m256i*>(p);
  for (size_t i = 0; i + 8 <= n / 32; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_add_epi64(acc[k], _mm256_load_si256(v + i + k));
  for (int k = 1; k < 8; ++k) acc[0] = _mm256_add_epi64(acc[0], acc[k]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t sum_scalar(const uint8_t* p, size_t n) {
  const auto* v = reinterpret_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n / 8; i += 4) {
    a += v[i];
    b += v[i + 1];
    c += v[i + 2];
    d += v[i + 3];
  }
  return a + b + c + d;
}

// Sums buf with every thread of the pool, each over its own slice (a multiple of 256 bytes).
uint64_t parallel_sum(cpu::ThreadPool& pool, const Buffer& buf) {
  const bool avx2 = cpu_features().avx2;
  const size_t chunks = buf.size() / 256;
  std::vector<uint64_t> partial(size_t(pool.size()) * 8);  // a cache line per thread
  pool.parallel_for(pool.size(), [&](int64_t t) {
    int64_t begin, end;
    cpu::ThreadPool::partition(int64_t(chunks), int(t), pool.size(), begin, end);
    const uint8_t* p = buf.data() + size_t(begin) * 256;
    const size_t n = size_t(end - begin) * 256;
    partial[size_t(t) * 8] = avx2 ? sum_avx2(p, n) : sum_scalar(p, n);
  });
  uint64_t s = 0;
  for (size_t t = 0; t < size_t(pool.size()); ++t) s += partial[t * 8];
  return s;
}

void parallel_copy(cpu::ThreadPool& pool, uint8_t* dst, const uint8_t* src, size_t bytes) {
  const size_t chunks = bytes / 4096;
  pool.parallel_for(pool.size(), [&](int64_t t) {
    int64_t begin, end;
    cpu::ThreadPool::partition(int64_t(chunks), int(t), pool.size(), begin, end);
    std::memcpy(dst + size_t(begin) * 4096, src + size_t(begin) * 4096,
                size_t(end - begin) * 4096);
  });
}

void BM_MemoryRead(benchmark::State& state) {
  cpu::ThreadPool pool(int(state.range(0)));
  Buffer buf(kReadBytes);
  const double cpu0 = thread_cpu_seconds();
  for (auto _ : state) benchmark::DoNotOptimize(parallel_sum(pool, buf));
  const double bytes = double(state.iterations()) * double(buf.size());
  state.SetBytesProcessed(int64_t(bytes));
  if (pool.size() == 1) state.counters["GB/s_cpu"] = bytes * 1e-9 / (thread_cpu_seconds() - cpu0);
}

void BM_MemoryCopy(benchmark::State& state) {
  cpu::ThreadPool pool(int(state.range(0)));
  Buffer src(kCopyBytes), dst(kCopyBytes);
  for (auto _ : state) {
    parallel_copy(pool, dst.data(), src.data(), kCopyBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * kCopyBytes));
}

void thread_args(benchmark::internal::Benchmark* b) {
  for (int t : thread_counts()) b->Arg(t);
  b->ArgName("threads")->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_MemoryRead)->Apply(thread_args);
BENCHMARK(BM_MemoryCopy)->Apply(thread_args);

}  // namespace

Buffer::Buffer(size_t bytes) : size_(bytes) {
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kHugePage, rounded)));
  if (!data_) throw std::bad_alloc();
  madvise(data_.get(), rounded, MADV_HUGEPAGE);
  std::memset(data_.get(), 0x5a, rounded);
}

void Buffer::Free::operator()(uint8_t* p) const { std::free(p); }

Bandwidth read_bandwidth(int n_threads) {
  static std::mutex mu;
  static std::map<int, Bandwidth> measured;
  std::lock_guard lock(mu);
  if (auto it = measured.find(n_threads); it != measured.end()) return it->second;
  cpu::ThreadPool pool(n_threads);
  Buffer buf(kReadBytes);
  benchmark::DoNotOptimize(parallel_sum(pool, buf));  // warm-up: TLB, frequency
  // Mean over passes, as Google Benchmark reports the mat-vecs it is compared with.
  constexpr int kPasses = 5;
  const auto start = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_seconds();
  for (int i = 0; i < kPasses; ++i) benchmark::DoNotOptimize(parallel_sum(pool, buf));
  const double cpu = thread_cpu_seconds() - cpu0;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double bytes = double(kPasses) * double(buf.size());
  return measured[n_threads] = Bandwidth{bytes / seconds, bytes / cpu};
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

std::vector<int> thread_counts() {
  std::vector<int> counts{1, 2};
  if (int hw = int(std::thread::hardware_concurrency()); hw > 2) counts.push_back(hw);
  return counts;
}

}  // namespace strata::bench
