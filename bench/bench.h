// Shared pieces of the strata_bench microbenchmarks (bench/*.cpp, one Google Benchmark binary).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace strata::bench {

// A page-aligned buffer, backed by transparent huge pages where the kernel offers them (as the
// engine's expert arena is), and touched so no page faults land inside a timed loop.
class Buffer {
 public:
  explicit Buffer(size_t bytes);
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_;
};

// Read bandwidth in bytes/s with n_threads (the same sum-reduce as bench_memory's read
// benchmark, over a 1 GiB buffer), measured once per thread count and remembered; the mat-vec
// benchmarks divide by it. per_cpu_second: bytes per second of the caller's CPU time, the
// measure that matches GB/s_cpu (see thread_cpu_seconds), meaningful for one thread only.
struct Bandwidth {
  double per_second;
  double per_cpu_second;
};
Bandwidth read_bandwidth(int n_threads);

// Registers the benchmarks that depend on which formats have kernels (called by main, after
// static initialisation, so the registry is complete).
void register_matvec_benchmarks();
// The same for the multi-activation dot benchmarks (bench_dot_rows.cpp).
void register_dot_rows_benchmarks();

// CPU time the calling thread has run, in seconds. On a shared box the bytes a one-thread
// benchmark moves per CPU second (the GB/s_cpu counters) is close to what it reaches alone: a
// preempted thread is not running, not slow. Its GB/s (per wall second) is what it got.
double thread_cpu_seconds();

// The thread counts benchmarks run with: 1, 2 and the hardware thread count if larger.
std::vector<int> thread_counts();

}  // namespace strata::bench
