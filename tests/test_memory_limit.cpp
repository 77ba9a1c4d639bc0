// The memory limit: parsing cgroup files (in a temporary tree, never the host's cgroup), the
// split of a limit between trunk, readers, activations and the expert arena, and locking.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "experts/memory_limit.h"
#include "gguf_test_util.h"
#include "util/error.h"
#include "util/memory_lock.h"

namespace strata::experts {
namespace {

using gguf::testing::TempDir;

constexpr uint64_t kMiB = uint64_t(1) << 20, kGiB = uint64_t(1) << 30;

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// A fake /proc/self (cgroup, mountinfo) and cgroup mounts under `root`.
struct FakeCgroups {
  TempDir dir;
  std::string proc() const { return dir.file("proc"); }
  std::string root() const { return dir.file("root"); }
  void proc_files(const std::string& cgroup, const std::string& mountinfo) const {
    write_text(dir.path() / "proc" / "cgroup", cgroup);
    write_text(dir.path() / "proc" / "mountinfo", mountinfo);
  }
  void limit(const std::string& path_under_root, const std::string& text) const {
    write_text(dir.path() / "root" / path_under_root, text);
  }
};

const char* kV2Mounts =
    "22 1 0:21 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
    "23 22 0:5 / /proc rw,nosuid - proc proc rw\n";
const char* kV1Mounts =
    "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

TEST(MemoryLimit, ParsesCgroupLimitFiles) {
  EXPECT_EQ(parse_cgroup_limit("11811160064\n", "memory.max"), 11811160064u);
  EXPECT_EQ(parse_cgroup_limit("4096", "memory.max"), 4096u);
  EXPECT_EQ(parse_cgroup_limit("max\n", "memory.max"), std::nullopt);
  // v1's unlimited: LONG_MAX rounded down to a page.
  EXPECT_EQ(parse_cgroup_limit("9223372036854771712\n", "memory.limit_in_bytes"), std::nullopt);
  for (const char* bad : {"", "\n", "lots", "12G", "-1", "12 34", "99999999999999999999999"}) {
    try {
      parse_cgroup_limit(bad, "/sys/fs/cgroup/x/memory.max");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("/sys/fs/cgroup/x/memory.max"), std::string::npos) << e.what();
    }
  }
}

TEST(MemoryLimit, CgroupV2TakesTheSmallestLimitUpToTheRoot) {
  FakeCgroups f;
  f.proc_files("0::/user.slice/app.scope\n", kV2Mounts);
  f.limit("sys/fs/cgroup/user.slice/app.scope/memory.max", "max\n");
  f.limit("sys/fs/cgroup/user.slice/memory.max", "12884901888\n");
  const auto limit = cgroup_memory_limit(f.proc(), f.root());
  ASSERT_TRUE(limit);
  EXPECT_EQ(limit->bytes, 12 * kGiB);
  EXPECT_NE(limit->source.find("user.slice/memory.max"), std::string::npos) << limit->source;
  // A tighter limit below wins.
  f.limit("sys/fs/cgroup/user.slice/app.scope/memory.max", "11811160064\n");
  EXPECT_EQ(cgroup_memory_limit(f.proc(), f.root())->bytes, 11 * kGiB);
}

TEST(MemoryLimit, CgroupV1ReadsTheMemoryHierarchy) {
  FakeCgroups f;
  f.proc_files("9:name=systemd:/\n8:pids:/\n4:memory:/llcap\n1:cpu:/\n0::/\n", kV1Mounts);
  f.limit("sys/fs/cgroup/memory/llcap/memory.limit_in_bytes", "11811160064\n");
  f.limit("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  // The cpu hierarchy's files are not memory limits.
  f.limit("sys/fs/cgroup/cpu/llcap/memory.limit_in_bytes", "1024\n");
  const auto limit = cgroup_memory_limit(f.proc(), f.root());
  ASSERT_TRUE(limit);
  EXPECT_EQ(limit->bytes, 11 * kGiB);
  EXPECT_NE(limit->source.find("memory/llcap/memory.limit_in_bytes"), std::string::npos) << limit->source;
}

TEST(MemoryLimit, NoLimitSetMeansNone) {
  FakeCgroups f;
  f.proc_files("4:memory:/a/b\n0::/\n", kV1Mounts);
  f.limit("sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", "9223372036854771712\n");
  f.limit("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(cgroup_memory_limit(f.proc(), f.root()), std::nullopt);
  // No files at all (no hierarchy mounted, or no /proc): none either.
  FakeCgroups empty;
  EXPECT_EQ(cgroup_memory_limit(empty.proc(), empty.root()), std::nullopt);
}

TEST(MemoryLimit, ContainerMountOfASubtree) {
  // Without a cgroup namespace a container sees its own cgroup as the mount's root.
  FakeCgroups f;
  f.proc_files("0::/docker/abc\n",
               "22 1 0:21 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  f.limit("sys/fs/cgroup/memory.max", "2147483648\n");
  const auto limit = cgroup_memory_limit(f.proc(), f.root());
  ASSERT_TRUE(limit);
  EXPECT_EQ(limit->bytes, 2 * kGiB);
}

TEST(MemoryLimit, ABadLimitFileIsAnErrorNamingIt) {
  FakeCgroups f;
  f.proc_files("0::/x\n", kV2Mounts);
  f.limit("sys/fs/cgroup/x/memory.max", "garbage\n");
  try {
    cgroup_memory_limit(f.proc(), f.root());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x/memory.max"), std::string::npos) << e.what();
  }
}

TEST(MemoryLimit, SplitSetsAsideTrunkReadersAndActivations) {
  // The case: an 11 GiB cap, the 80B shape's 2.48 GiB trunk, 8 readers.
  const uint64_t trunk = uint64_t(2.48 * double(kGiB));
  const MemorySplit s = split_memory({11 * kGiB, "--memory-limit"}, trunk, 8, 512 * kMiB);
  EXPECT_EQ(s.trunk, trunk);
  EXPECT_EQ(s.readers, 8 * kMiB);
  EXPECT_EQ(s.activations, 11 * kGiB / 24);
  EXPECT_EQ(s.trunk + s.readers + s.activations + s.arena, 11 * kGiB);
  EXPECT_GE(s.arena, 8 * kGiB);  // an 8 GiB budget fits
  const std::string d = s.describe();
  EXPECT_NE(d.find("11.00 GiB (--memory-limit)"), std::string::npos) << d;
  EXPECT_NE(d.find("expert cache"), std::string::npos) << d;
  // Small limits set aside at least 384 MiB for activations.
  EXPECT_EQ(activation_margin(2 * kGiB), 384 * kMiB);
  EXPECT_EQ(activation_margin(48 * kGiB), 2 * kGiB);
}

TEST(MemoryLimit, SplitThatLeavesTooLittleNamesTheLimit) {
  try {
    split_memory({3 * kGiB, "--memory-limit"}, 2 * kGiB + 512 * kMiB, 8, 512 * kMiB);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("--memory-limit", 0), 0u) << what;
    EXPECT_NE(what.find("trunk 2.50 GiB"), std::string::npos) << what;
  }
  // With no minimum it never throws; nothing is left.
  EXPECT_EQ(split_memory({kGiB, "x"}, 2 * kGiB, 8, 0).arena, 0u);
}

TEST(MemoryLock, LocksOrSaysWhyNot) {
  std::vector<uint8_t> buffer(size_t(3) * 4096 + 100, 1);
  const util::ByteRange ranges[] = {{buffer.data(), 100}, {buffer.data() + 50, buffer.size() - 50}, {nullptr, 0}};
  const util::LockResult r = util::lock_in_memory(ranges);
  // The overlapping ranges merge into the pages under the buffer (4 or 5 of them).
  EXPECT_GE(r.asked, 4u * 4096);
  EXPECT_LE(r.asked, 5u * 4096);
  if (r.failure.empty())
    EXPECT_EQ(r.locked, r.asked);
  else
    EXPECT_NE(r.failure.find("RLIMIT_MEMLOCK"), std::string::npos) << r.failure;
  munlock(buffer.data(), buffer.size());
}

}  // namespace
}  // namespace strata::experts
