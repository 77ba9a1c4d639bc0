#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>

#include "util/arena_memory.h"
#include "util/error.h"

namespace strata::util {
namespace {

// Minor faults of the calling thread so far.
long thread_minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// Writes one byte per 4 KiB page and returns the minor faults that took.
long faults_touching(const ArenaMemory& m) {
  const long before = thread_minor_faults();
  for (size_t off = 0; off < m.bytes(); off += 4096) static_cast<volatile uint8_t*>(m.data())[off] = 1;
  return thread_minor_faults() - before;
}

TEST(ArenaMemory, SysfsChoiceIsTheBracketedWord) {
  EXPECT_EQ(sysfs_choice("always [madvise] never\n"), "madvise");
  EXPECT_EQ(sysfs_choice("[always] madvise never"), "always");
  EXPECT_EQ(sysfs_choice("always madvise [never]\n"), "never");
  EXPECT_EQ(sysfs_choice(""), "");
  EXPECT_EQ(sysfs_choice("always madvise never"), "");
  EXPECT_EQ(sysfs_choice("[unclosed"), "");
}

TEST(ArenaMemory, IsZeroedWritableAndAlignedToItsPages) {
  for (bool huge : {false, true}) {
    ArenaMemory m(size_t(5) << 20, {.huge_pages = huge, .populate = true});
    ASSERT_NE(m.data(), nullptr);
    EXPECT_EQ(m.bytes(), size_t(5) << 20);
    if (!huge) {
      EXPECT_EQ(m.backing(), PageBacking::Small);
    }
    const uintptr_t align = m.backing() == PageBacking::Small ? 4096 : uintptr_t(2) << 20;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data()) % align, 0u) << page_backing_name(m.backing());
    for (size_t i = 0; i < m.bytes(); i += 4093) ASSERT_EQ(m.data()[i], 0) << i;
    m.data()[m.bytes() - 1] = 7;
    EXPECT_EQ(m.data()[m.bytes() - 1], 7);
  }
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
constexpr bool kAddressSanitizer = __has_feature(address_sanitizer);
#else
constexpr bool kAddressSanitizer = false;
#endif

// The point of populating: the hot path's first write to a page costs no fault. (Under
// AddressSanitizer every write also checks the region's shadow, an eighth of its size that the
// sanitizer maps lazily: its pages fault on first touch, one per 4 KiB of shadow.)
TEST(ArenaMemory, PopulatedMemoryTakesNoFaultOnFirstTouch) {
  constexpr size_t kBytes = size_t(16) << 20;
  const long shadow_faults = kAddressSanitizer ? long(kBytes / 8 / 4096) : 0;
  for (bool huge : {false, true}) {
    ArenaMemory populated(kBytes, {.huge_pages = huge, .populate = true});
    EXPECT_LE(faults_touching(populated), 2 + shadow_faults) << page_backing_name(populated.backing());
    ArenaMemory lazy(kBytes, {.huge_pages = huge, .populate = false});
    // 4 KiB pages fault once per page, huge pages once per 2 MiB.
    EXPECT_GE(faults_touching(lazy), 8) << page_backing_name(lazy.backing());
  }
}

TEST(ArenaMemory, ZeroBytesIsAnError) { EXPECT_THROW(ArenaMemory(0), Error); }

}  // namespace
}  // namespace strata::util
