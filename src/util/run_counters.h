// Where a run's time goes, for the per-phase accounting of `strata bench` (docs/PERFORMANCE.md,
// "Where a streamed token's time goes"): the kernel's per-thread scheduler times, grouped by
// what each thread does (named with name_thread), the process's page faults and context
// switches, and the CPU thread pool's own counters. Reading them costs a few /proc reads, so they
// are sampled at phase boundaries, never per op.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::util {

// Thread names (at most 15 characters) that sample_run() groups by.
inline constexpr const char* kPoolThreadName = "strata-pool";
inline constexpr const char* kReaderThreadName = "strata-read";

// Names the calling thread (shown by top -H and perf too).
void name_thread(const char* name);

// Counted by every CPU thread pool of the process (relaxed atomics: one add per parallel step).
struct PoolCounters {
  std::atomic<uint64_t> steps{0};            // parallel steps handed to the helpers
  std::atomic<uint64_t> inline_steps{0};     // steps run on the caller alone: helpers were late
  std::atomic<uint64_t> inline_switches{0};  // times the pool switched to running alone
  std::atomic<uint64_t> wait_ns{0};          // caller's wait for helpers after its own range
  std::atomic<uint64_t> caller_sleeps{0};    // ... that ended in a futex sleep
  std::atomic<uint64_t> helper_wakes{0};     // futex wakes of sleeping helpers
};
PoolCounters& pool_counters();

// Scheduler times of a group of threads (/proc/self/task/*/schedstat).
struct ThreadTimes {
  uint64_t cpu_ns = 0;       // on a CPU
  uint64_t runqueue_ns = 0;  // runnable but waiting for a CPU
  uint64_t threads = 0;
};

struct RunSample {
  ThreadTimes caller;   // the thread that called sample_run (the forward thread)
  ThreadTimes pool;     // pool helpers
  ThreadTimes readers;  // expert readers (reads, checksums)
  ThreadTimes other;
  uint64_t minor_faults = 0, major_faults = 0;  // getrusage, whole process
  uint64_t voluntary_switches = 0, involuntary_switches = 0;
  uint64_t pool_steps = 0, pool_inline_steps = 0, pool_inline_switches = 0, pool_wait_ns = 0,
           pool_caller_sleeps = 0, pool_helper_wakes = 0;
  bool schedstat = false;  // the kernel exposes per-thread schedstat (CONFIG_SCHED_INFO)

  // Counters of this sample minus `earlier`'s (threads that ended in between are lost from the
  // thread groups; pool helpers and readers live as long as the model).
  RunSample since(const RunSample& earlier) const;
};

RunSample sample_run();

// "cpu_ns runqueue_ns timeslices" of a schedstat file; false when it does not parse.
bool parse_schedstat(std::string_view text, uint64_t& cpu_ns, uint64_t& runqueue_ns);

}  // namespace strata::util
