// A fixed pool of CPU threads for the decode hot path, where one mat-vec takes microseconds and
// so the cost of starting and joining a parallel step matters as much as the work in it.
//
// The calling thread is worker 0 and does its share; n_threads - 1 helper threads wait for work by
// spinning for a short while (spin_us) and then sleeping on a futex, so back-to-back steps of one
// forward pass never pay a wake-up, and an idle engine costs no CPU.
//
// parallel_for splits tasks [0, n) into n_threads contiguous ranges, the same ranges for the same
// (n, n_threads): every task runs exactly once, on one thread, so a task that writes its own
// outputs gives the same bits whatever the thread count.
//
// When the machine has no core to spare for the helpers (other processes keep them off the CPU),
// every step waits for a helper to be scheduled, and a decode step of hundreds of parallel ops
// became 5-10x slower than running on one thread (measured on the loaded 2-core dev box). So the
// caller measures how long it waits for the helpers after finishing its own range: after
// kLateStepsToGoInline steps in a row whose wait exceeds its own work by kLateSlackUs, it runs
// the next kInlineSteps steps alone, then tries the helpers again. Which thread runs a task never
// changes its result, so this changes speed only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace strata::cpu {

class ThreadPool {
 public:
  // How long an idle helper spins before it sleeps. On the 2-core dev box (docs/PERFORMANCE.md)
  // a spinning helper starts a step in under a microsecond, a sleeping one in about 30; 200 us
  // covers the single-threaded gaps between the mat-vecs of one decode step.
  static constexpr int kDefaultSpinUs = 200;

  // n_threads <= 0 means one per hardware thread. The pool always has at least the caller.
  explicit ThreadPool(int n_threads = 0, int spin_us = kDefaultSpinUs);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // How often the pool has switched to running steps on the caller alone (see above).
  uint64_t inline_switches() const { return inline_switches_; }

  static constexpr int kLateSlackUs = 200;
  static constexpr int kLateStepsToGoInline = 16;
  static constexpr int kInlineSteps = 512;

  // The tasks [begin, end) thread `index` of `n_threads` runs for n tasks.
  static void partition(int64_t n, int index, int n_threads, int64_t& begin, int64_t& end);

  // Calls fn(i) once for each i in [0, n_tasks) and returns when all calls have returned. If
  // calls throw, the exception of the lowest-numbered thread is rethrown here, after every
  // thread has stopped (a thread skips the rest of its range once one of its calls throws).
  // Called from inside a task, or with one thread, it runs the tasks inline on the caller.
  // Concurrent callers from different threads take turns.
  template <typename Fn>
  void parallel_for(int64_t n_tasks, Fn&& fn) {
    auto* ctx = &fn;
    run(n_tasks, [](void* c, int64_t begin, int64_t end) {
      auto& f = *static_cast<std::remove_reference_t<Fn>*>(c);
      for (int64_t i = begin; i < end; ++i) f(i);
    }, const_cast<void*>(static_cast<const void*>(ctx)));
  }

 private:
  using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);

  // One per thread on its own cache line: the error a thread's range raised.
  struct alignas(64) Slot {
    std::exception_ptr error;
  };

  void run(int64_t n_tasks, RangeFn fn, void* ctx);
  void run_range(int index);
  void worker_loop(int index);
  void wait_for_helpers();
  void note_wait(std::chrono::nanoseconds own, std::chrono::nanoseconds waited);

  const int n_threads_;
  const int spin_us_;
  std::vector<std::thread> helpers_;
  std::vector<Slot> slots_;
  std::mutex callers_;

  // The current step, written by the caller before it bumps generation_.
  RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_tasks_ = 0;
  bool stopping_ = false;
  // Lateness of the helpers, guarded by callers_.
  int late_streak_ = 0;
  int inline_steps_ = 0;
  uint64_t inline_switches_ = 0;

  // Bumped once per step; helpers wait for it to change (futex word).
  alignas(64) std::atomic<uint32_t> generation_{0};
  std::atomic<uint32_t> sleeping_helpers_{0};
  // Helpers still running the current step; the caller waits for 0 (futex word).
  alignas(64) std::atomic<uint32_t> pending_{0};
  std::atomic<uint32_t> caller_sleeping_{0};
};

}  // namespace strata::cpu
