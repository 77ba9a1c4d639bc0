#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/matvec.h"
#include "backend/cpu/thread_pool.h"
#include "quant/kernels.h"
#include "util/rng.h"

namespace strata::cpu {
namespace {

TEST(ThreadPool, PartitionCoversEveryTaskOnceInOrder) {
  for (int threads = 1; threads <= 5; ++threads) {
    for (int64_t n : {0, 1, 2, 3, 4, 5, 7, 64, 1001}) {
      int64_t next = 0;
      for (int i = 0; i < threads; ++i) {
        int64_t begin, end;
        ThreadPool::partition(n, i, threads, begin, end);
        EXPECT_EQ(begin, next);
        EXPECT_LE(begin, end);
        // Balanced: sizes differ by at most one.
        EXPECT_LE(end - begin, n / threads + 1);
        EXPECT_GE(end - begin, n / threads);
        next = end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(ThreadPool, EveryTaskRunsExactlyOnceOverManyRounds) {
  for (int threads : {1, 2, 3, 4}) {
    for (int spin_us : {0, ThreadPool::kDefaultSpinUs}) {
      ThreadPool pool(threads, spin_us);
      ASSERT_EQ(pool.size(), threads);
      std::vector<std::atomic<int>> hits(257);
      int64_t expected_total = 0;
      for (int round = 0; round < 1000; ++round) {
        const int64_t n = round % 258;  // includes 0, 1 and fewer tasks than threads
        pool.parallel_for(n, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
        expected_total += n;
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[size_t(i)].exchange(0), 1) << "threads " << threads << " round " << round;
        for (int64_t i = n; i < 257; ++i) ASSERT_EQ(hits[size_t(i)].load(), 0);
      }
      EXPECT_GT(expected_total, 0);
    }
  }
}

TEST(ThreadPool, EachThreadRunsItsStaticRange) {
  ThreadPool pool(3);
  std::vector<std::thread::id> owner(100);
  for (int round = 0; round < 50; ++round) {
    pool.parallel_for(100, [&](int64_t i) { owner[size_t(i)] = std::this_thread::get_id(); });
    // The caller is thread 0.
    EXPECT_EQ(owner[0], std::this_thread::get_id());
    if (owner[99] == owner[0]) {
      // On a loaded machine the helpers arrived late and the pool ran this step on the caller
      // alone (the run-alone fallback): every index is the caller's, and the pool said so.
      EXPECT_GT(pool.inline_switches(), 0u) << "round " << round;
      for (const std::thread::id& id : owner) EXPECT_EQ(id, owner[0]) << "round " << round;
      continue;
    }
    for (int t = 0; t < 3; ++t) {
      int64_t begin, end;
      ThreadPool::partition(100, t, 3, begin, end);
      for (int64_t i = begin; i < end; ++i) EXPECT_EQ(owner[size_t(i)], owner[size_t(begin)]);
    }
  }
}

TEST(ThreadPool, ExceptionsPropagateAndThePoolStaysUsable) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 100; ++round) {
      const int64_t bad = round % 30;
      std::atomic<int> ran{0};
      try {
        pool.parallel_for(30, [&](int64_t i) {
          ran.fetch_add(1);
          if (i == bad) throw std::runtime_error("task " + std::to_string(i));
        });
        FAIL() << "no exception";
      } catch (const std::runtime_error& e) {
        EXPECT_EQ(std::string(e.what()), "task " + std::to_string(bad));
      }
      EXPECT_GE(ran.load(), 1);
      std::atomic<int> after{0};
      pool.parallel_for(30, [&](int64_t) { after.fetch_add(1); });
      EXPECT_EQ(after.load(), 30);
    }
  }
}

TEST(ThreadPool, LowestThreadsExceptionWins) {
  ThreadPool pool(3);
  for (int round = 0; round < 100; ++round) {
    // Every task throws; each thread stops at its first, and thread 0's (task 0) is reported.
    try {
      pool.parallel_for(9, [](int64_t i) { throw std::runtime_error(std::to_string(i)); });
      FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "0");
    }
  }
}

TEST(ThreadPool, NestedParallelForRunsInline) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(20 * 20);
  pool.parallel_for(20, [&](int64_t i) {
    pool.parallel_for(20, [&](int64_t j) { hits[size_t(i * 20 + j)].fetch_add(1); });
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, SleepingHelpersWakeUp) {
  // No spinning: every step has to wake the helpers from the futex, and the caller sleeps too.
  ThreadPool pool(3, 0);
  for (int round = 0; round < 200; ++round) {
    std::atomic<int64_t> sum{0};
    pool.parallel_for(1000, [&](int64_t i) { sum.fetch_add(i); });
    ASSERT_EQ(sum.load(), 999 * 1000 / 2);
    if (round % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST(ThreadPool, LateHelpersSendStepsInlineUntilTheyAreOnTimeAgain) {
  // The helper's half of every step takes 2 ms while the caller's is instant: what a helper kept
  // off the CPU by other processes looks like. After kLateStepsToGoInline such steps the caller
  // runs whole steps alone (every task still exactly once), and after kInlineSteps it tries the
  // helper again.
  ThreadPool pool(2, 0);
  const std::thread::id caller = std::this_thread::get_id();
  auto step = [&](bool slow_helper) {
    std::vector<std::thread::id> ran(8);
    pool.parallel_for(8, [&](int64_t i) {
      ran[size_t(i)] = std::this_thread::get_id();
      if (slow_helper && std::this_thread::get_id() != caller)
        std::this_thread::sleep_for(std::chrono::microseconds(2000));
    });
    int on_caller = 0;
    for (const auto& id : ran) on_caller += id == caller;
    return on_caller;
  };
  for (int i = 0; i < ThreadPool::kLateStepsToGoInline; ++i) EXPECT_EQ(step(true), 4) << i;
  EXPECT_EQ(pool.inline_switches(), 1u);
  for (int i = 0; i < ThreadPool::kInlineSteps; ++i) EXPECT_EQ(step(false), 8) << i;
  EXPECT_EQ(step(false), 4) << "after the inline stretch the helper is tried again";
}

TEST(MatvecParallel, BitwiseEqualsSingleThreadedMatvecForEveryFormat) {
  constexpr int64_t kRows = 37, kCols = 1024;
  int formats = 0;
  for (uint32_t id = 0; id < 2048; ++id) {
    const auto info = quant::find_type(id);
    if (!info || !quant::has_kernels(info->type)) continue;
    ++formats;
    const quant::Type t = info->type;
    const quant::FormatKernels& k = quant::kernels(t);
    SCOPED_TRACE(info->name);

    Rng rng(1234 + id);
    const size_t row_stride = quant::row_bytes(t, kCols);
    std::vector<uint8_t> w(row_stride * kRows);
    k.random_blocks(rng, w.data(), int64_t(w.size() / info->block_bytes));
    std::vector<float> x(kCols);
    for (float& v : x) v = rng.normal();

    std::vector<uint8_t> act(quant::act_bytes(k.act, kCols));
    std::vector<float> want(kRows);
    quant::matvec(t, w.data(), row_stride, kRows, kCols, x.data(), want.data(), act.data());

    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<uint8_t> scratch(act.size());
      for (int round = 0; round < 3; ++round) {
        std::vector<float> got(kRows, -1.0f);
        matvec_parallel(pool, t, w.data(), row_stride, kRows, kCols, x.data(), got.data(),
                        scratch.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * kRows), 0)
            << threads << " threads";
      }
    }
  }
  EXPECT_GT(formats, 0);
}

}  // namespace
}  // namespace strata::cpu
