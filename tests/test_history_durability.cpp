// The usage history on disk is always either the old file or the new one (issue 14): a disk that
// fills up part-way through a save (ENOSPC from the kernel, through /dev/full) and a process
// killed with SIGKILL at random points of thousands of saves both leave a file that loads and
// equals one of the two histories.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gguf_test_util.h"
#include "route/usage_history.h"
#include "test_util.h"

namespace strata::route {
namespace {

using gguf::testing::TempDir;
using strata::testing::error_of;

// Two histories that differ everywhere, large enough (4 MiB) that a save takes a while.
UsageHistory history(int which) {
  UsageHistory h(512, 1024, 4096.0, "durability");
  std::vector<int32_t> ids(1024);
  for (int32_t e = 0; e < 1024; ++e) ids[size_t(e)] = e;
  for (int l = 0; l < 512; ++l)
    for (int k = 0; k <= which; ++k) h.observe(l, ids);
  h.advance(which + 1);
  return h;
}

// Which of the two the file holds: 0, 1, or -1 (neither, or it does not load).
int which_on_disk(const std::string& path) {
  try {
    const UsageHistory h = UsageHistory::load(path);
    if (h.tokens() == 1 && h.count(7, 9) > 0) return 0;
    if (h.tokens() == 2 && h.count(7, 9) > 0) return 1;
  } catch (const Error&) {
  }
  return -1;
}

size_t temp_files(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    n += e.path().filename().string().find(".tmp.") != std::string::npos;
  return n;
}

// The kernel's own ENOSPC: the temp file this process would write is /dev/full. The save fails
// naming the path and the reason, the old file is untouched, and the temp name is gone.
TEST(HistoryDurability, ADiskFullDuringTheSaveKeepsTheOldFile) {
  TempDir dir;
  const std::string path = dir.file("m.gguf.experts.history");
  history(0).save(path);
  UsageHistory next = history(1);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::filesystem::create_symlink("/dev/full", tmp);
  const std::string e = error_of([&] { next.save(path); });
  EXPECT_NE(e.find("usage history " + path + ": writing " + tmp + " failed: No space left on device"),
            std::string::npos)
      << e;
  EXPECT_EQ(which_on_disk(path), 0);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(tmp)));
  EXPECT_TRUE(next.dirty()) << "a failed save leaves the history to be saved again";
  next.save(path);
  EXPECT_EQ(which_on_disk(path), 1);
}

// A child saves the two histories in turn, forever; it is killed with SIGKILL at a random moment,
// 150 times. After every kill the file loads and is one of the two.
TEST(HistoryDurability, KillNineAtAnyPointLeavesTheOldOrTheNewFile) {
  TempDir dir;
  const std::string path = dir.file("m.gguf.experts.history");
  history(0).save(path);
  UsageHistory h[2] = {history(0), history(1)};
  std::mt19937 rng(7);
  int old_or_new[2] = {0, 0}, torn = 0, mid_save = 0;
  for (int round = 0; round < 150; ++round) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = ::fork();
    if (child == 0) {
      // Says when its first save is done, then saves on until killed.
      h[1].save(path);
      const char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
      for (int i = 0;; ++i) h[i % 2].save(path);
    }
    ASSERT_GT(child, 0);
    ::close(ready[1]);
    char byte;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    ::close(ready[0]);
    // A save of the 4 MiB file takes milliseconds: a random moment inside the next few saves.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 15000));
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    const int w = which_on_disk(path);
    if (w < 0)
      ++torn;
    else
      ++old_or_new[w];
    // A temp file left behind means the kill landed inside a save.
    mid_save += temp_files(dir.path().string()) > 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      if (e.path().filename().string().find(".tmp.") != std::string::npos)
        std::filesystem::remove(e.path());
  }
  EXPECT_EQ(torn, 0);
  EXPECT_GT(mid_save, 0) << "no kill landed inside a save; the test exercised nothing";
  std::printf("[durability] 150 kills: %d found the first history, %d the second, %d torn; %d "
              "landed inside a save\n",
              old_or_new[0], old_or_new[1], torn, mid_save);
}

}  // namespace
}  // namespace strata::route
