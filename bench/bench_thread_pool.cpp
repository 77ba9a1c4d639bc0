// What one parallel step costs: the caller publishes a step of empty tasks and waits for every
// thread to finish it. The gap is single-threaded work the caller does between steps (norms, the
// router...), during which idle helpers either keep spinning or fall asleep. Only the step is
// timed. The baseline is the textbook pool (mutex + condition variables), the design the
// spin-then-futex pool replaced.
#include <benchmark/benchmark.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace strata::bench {

namespace {

using Clock = std::chrono::steady_clock;

class CondvarPool {
 public:
  explicit CondvarPool(int n) : n_(n) {
    for (int i = 1; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~CondvarPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      ++generation_;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
  }
  template <typename Fn>
  void step(Fn&& fn) {
    {
      std::lock_guard lock(mu_);
      pending_ = n_ - 1;
      ++generation_;
    }
    start_.notify_all();
    fn();
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock lock(mu_);
      start_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      if (--pending_ == 0) done_.notify_one();
    }
  }
  int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

void busy_wait_us(int64_t us) {
  const auto until = Clock::now() + std::chrono::microseconds(us);
  while (Clock::now() < until) {
  }
}

template <typename Step>
void time_steps(benchmark::State& state, int64_t gap_us, Step&& step) {
  for (auto _ : state) {
    busy_wait_us(gap_us);
    const auto start = Clock::now();
    step();
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
  }
}

// Args: threads, spin_us, gap_us.
void BM_PoolStep(benchmark::State& state) {
  const int threads = int(state.range(0));
  cpu::ThreadPool pool(threads, int(state.range(1)));
  std::vector<int64_t> sink(size_t(threads) * 8);
  time_steps(state, state.range(2), [&] {
    pool.parallel_for(threads, [&](int64_t i) { benchmark::DoNotOptimize(sink[size_t(i) * 8] = i); });
  });
}

// Args: threads, gap_us.
void BM_CondvarPoolStep(benchmark::State& state) {
  CondvarPool pool(int(state.range(0)));
  time_steps(state, state.range(1), [&] { pool.step([] {}); });
}

BENCHMARK(BM_PoolStep)
    ->ArgNames({"threads", "spin_us", "gap_us"})
    ->ArgsProduct({{2}, {0, 20, cpu::ThreadPool::kDefaultSpinUs}, {0, 50, 1000}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CondvarPoolStep)
    ->ArgNames({"threads", "gap_us"})
    ->ArgsProduct({{2}, {0, 50, 1000}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

}  // namespace strata::bench
