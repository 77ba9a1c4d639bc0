// The counters behind strata bench's per-phase accounting (util/run_counters.h).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "backend/cpu/thread_pool.h"
#include "util/run_counters.h"

namespace strata::util {
namespace {

TEST(RunCounters, ParsesSchedstat) {
  uint64_t cpu = 0, runqueue = 0;
  ASSERT_TRUE(parse_schedstat("4454939 8994664 18\n", cpu, runqueue));
  EXPECT_EQ(cpu, 4454939u);
  EXPECT_EQ(runqueue, 8994664u);
  EXPECT_FALSE(parse_schedstat("", cpu, runqueue));
  EXPECT_FALSE(parse_schedstat("12", cpu, runqueue));
  EXPECT_FALSE(parse_schedstat("x 1 2", cpu, runqueue));
}

TEST(RunCounters, GroupsThreadsByName) {
  std::atomic<bool> named{false}, done{false};
  std::thread reader([&] {
    name_thread(kReaderThreadName);
    named = true;
    while (!done) std::this_thread::yield();
  });
  while (!named) std::this_thread::yield();
  const RunSample s = sample_run();
  done = true;
  reader.join();
  if (!s.schedstat) GTEST_SKIP() << "this kernel has no per-thread schedstat";
  EXPECT_EQ(s.caller.threads, 1u);
  EXPECT_EQ(s.readers.threads, 1u);
  EXPECT_GT(s.caller.cpu_ns, 0u);
}

TEST(RunCounters, EveryPoolStepIsCountedOnceAsSharedOrRunAlone) {
  cpu::ThreadPool pool(2);
  const RunSample before = sample_run();
  std::atomic<int64_t> sum{0};
  for (int i = 0; i < 50; ++i) pool.parallel_for(8, [&](int64_t t) { sum += t; });
  const RunSample d = sample_run().since(before);
  EXPECT_EQ(sum.load(), 50 * 28);
  EXPECT_EQ(d.pool_steps + d.pool_inline_steps, 50u);
}

}  // namespace
}  // namespace strata::util
