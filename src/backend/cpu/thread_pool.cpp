#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "util/run_counters.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace strata::cpu {

namespace {

// Set on helper threads and while the caller runs its own range, so a nested parallel_for runs
// inline instead of waiting on helpers that are busy with the outer step.
thread_local bool t_in_task = false;

// Sleeps while *word == expected (returns at once if it already differs, or spuriously).
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
#else
  word.wait(expected, std::memory_order_seq_cst);
#endif
}

void futex_wake_all(std::atomic<uint32_t>& word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
#else
  word.notify_all();
#endif
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until done() holds or spin_us have passed; true if done() held.
template <typename Done>
bool spin_until(int spin_us, Done&& done) {
  if (done()) return true;
  if (spin_us <= 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    // About a microsecond of pauses between clock reads.
    for (int i = 0; i < 16; ++i) {
      cpu_relax();
      if (done()) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
    // With more runnable threads than cores, a spinner that never yields can hold the core the
    // thread it waits for needs: on the loaded 2-core dev box that made a step take hundreds of
    // microseconds instead of a few (docs/PERFORMANCE.md). On an idle core this returns at once.
    std::this_thread::yield();
  }
}

struct InTask {
  bool saved = t_in_task;
  InTask() { t_in_task = true; }
  ~InTask() { t_in_task = saved; }
};

}  // namespace

ThreadPool::ThreadPool(int n_threads, int spin_us)
    : n_threads_(std::max(1, n_threads > 0 ? n_threads
                                           : int(std::thread::hardware_concurrency()))),
      spin_us_(std::max(0, spin_us)),
      slots_(size_t(n_threads_)) {
  helpers_.reserve(size_t(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) helpers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(callers_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(generation_);
  }
  for (auto& t : helpers_) t.join();
}

void ThreadPool::partition(int64_t n, int index, int n_threads, int64_t& begin, int64_t& end) {
  // The first n % n_threads threads take one extra task.
  const int64_t base = n / n_threads, extra = n % n_threads;
  begin = index * base + std::min<int64_t>(index, extra);
  end = begin + base + (index < extra ? 1 : 0);
}

void ThreadPool::run(int64_t n_tasks, RangeFn fn, void* ctx) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1 || t_in_task) {
    InTask in_task;
    fn(ctx, 0, n_tasks);
    return;
  }
  std::lock_guard lock(callers_);
  util::PoolCounters& counters = util::pool_counters();
  if (inline_steps_ > 0) {
    --inline_steps_;
    counters.inline_steps.fetch_add(1, std::memory_order_relaxed);
    InTask in_task;
    fn(ctx, 0, n_tasks);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  n_tasks_ = n_tasks;
  pending_.store(uint32_t(n_threads_ - 1), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  counters.steps.fetch_add(1, std::memory_order_relaxed);
  if (sleeping_helpers_.load(std::memory_order_seq_cst) > 0) {
    futex_wake_all(generation_);
    counters.helper_wakes.fetch_add(1, std::memory_order_relaxed);
  }

  const auto start = std::chrono::steady_clock::now();
  run_range(0);
  const auto own_done = std::chrono::steady_clock::now();
  wait_for_helpers();
  const auto waited = std::chrono::steady_clock::now() - own_done;
  counters.wait_ns.fetch_add(uint64_t(std::chrono::nanoseconds(waited).count()), std::memory_order_relaxed);
  note_wait(own_done - start, waited);

  std::exception_ptr first;
  for (Slot& s : slots_) {
    if (s.error && !first) first = s.error;
    s.error = nullptr;
  }
  if (first) std::rethrow_exception(first);
}

void ThreadPool::note_wait(std::chrono::nanoseconds own, std::chrono::nanoseconds waited) {
  const bool late = waited > own + std::chrono::microseconds(kLateSlackUs);
  late_streak_ = late ? late_streak_ + 1 : 0;
  if (late_streak_ >= kLateStepsToGoInline) {
    inline_steps_ = kInlineSteps;
    // One more late step after the inline stretch sends it straight back inline.
    late_streak_ = kLateStepsToGoInline - 1;
    ++inline_switches_;
    util::pool_counters().inline_switches.fetch_add(1, std::memory_order_relaxed);
  }
}

void ThreadPool::run_range(int index) {
  int64_t begin, end;
  partition(n_tasks_, index, n_threads_, begin, end);
  if (begin >= end) return;
  InTask in_task;
  try {
    fn_(ctx_, begin, end);
  } catch (...) {
    slots_[size_t(index)].error = std::current_exception();
  }
}

void ThreadPool::wait_for_helpers() {
  const auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (spin_until(spin_us_, done)) return;
  // Announce the sleep before re-reading pending_, so the last helper either sees the flag and
  // wakes us or finished before our read (both sides are seq_cst).
  caller_sleeping_.store(1, std::memory_order_seq_cst);
  util::pool_counters().caller_sleeps.fetch_add(1, std::memory_order_relaxed);
  for (uint32_t p; (p = pending_.load(std::memory_order_seq_cst)) != 0;) futex_wait(pending_, p);
  caller_sleeping_.store(0, std::memory_order_relaxed);
}

void ThreadPool::worker_loop(int index) {
  util::name_thread(util::kPoolThreadName);
  t_in_task = true;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = 0;
    const auto changed = [&] { return (g = generation_.load(std::memory_order_acquire)) != seen; };
    if (!spin_until(spin_us_, changed)) {
      // Same handshake as wait_for_helpers: count ourselves as sleeping, then re-check.
      sleeping_helpers_.fetch_add(1, std::memory_order_seq_cst);
      while ((g = generation_.load(std::memory_order_seq_cst)) == seen) futex_wait(generation_, seen);
      sleeping_helpers_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = g;
    if (stopping_) return;
    run_range(index);
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst))
      futex_wake_all(pending_);
  }
}

}  // namespace strata::cpu
