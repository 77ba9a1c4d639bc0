#include "util/arena_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "util/error.h"
#include "util/progress.h"

// Linux 5.14; older headers lack it, older kernels answer EINVAL.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace strata::util {

namespace {

constexpr size_t kSmallPage = 4096;
constexpr size_t kHugePage = size_t(2) << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

bool transparent_huge_pages_allowed() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string choice = sysfs_choice(text);
  return choice == "always" || choice == "madvise";
}

}  // namespace

const char* page_backing_name(PageBacking backing) {
  switch (backing) {
    case PageBacking::HugeTlb: return "hugetlb";
    case PageBacking::Transparent: return "transparent huge pages";
    case PageBacking::Small: return "4 KiB pages";
  }
  return "?";
}

std::string sysfs_choice(std::string_view text) {
  const size_t open = text.find('[');
  if (open == std::string_view::npos) return {};
  const size_t close = text.find(']', open);
  if (close == std::string_view::npos) return {};
  return std::string(text.substr(open + 1, close - open - 1));
}

ArenaMemory::ArenaMemory(size_t bytes, const ArenaMemoryOptions& o) : bytes_(bytes) {
  if (bytes == 0) fail("expert arena: zero bytes asked for");
  const int prot = PROT_READ | PROT_WRITE;
  if (o.huge_pages) {
    // Succeeds only when enough hugetlb pages are reserved; the reservation is made here, so a
    // later fault never lacks a page.
    const size_t rounded = round_up(bytes, kHugePage);
    void* p = mmap(nullptr, rounded, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p != MAP_FAILED) {
      mapping_ = p;
      mapped_bytes_ = rounded;
      backing_ = PageBacking::HugeTlb;
    }
  }
  if (!mapping_ && o.huge_pages && transparent_huge_pages_allowed()) {
    // Map one huge page more than needed and trim both ends, leaving a 2 MiB-aligned range the
    // kernel can back with whole huge pages.
    const size_t rounded = round_up(bytes, kHugePage);
    void* p = mmap(nullptr, rounded + kHugePage, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      auto* raw = static_cast<uint8_t*>(p);
      auto* aligned = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(raw), kHugePage));
      if (aligned > raw) munmap(raw, size_t(aligned - raw));
      const size_t tail = size_t(raw + rounded + kHugePage - (aligned + rounded));
      if (tail > 0) munmap(aligned + rounded, tail);
      mapping_ = aligned;
      mapped_bytes_ = rounded;
      if (madvise(aligned, rounded, MADV_HUGEPAGE) == 0) backing_ = PageBacking::Transparent;
    }
  }
  if (!mapping_) {
    const size_t rounded = round_up(bytes, kSmallPage);
    void* p = mmap(nullptr, rounded, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      fail("expert arena: cannot map ", format_bytes(bytes), ": ", std::strerror(errno));
    mapping_ = p;
    mapped_bytes_ = rounded;
  }
  base_ = static_cast<uint8_t*>(mapping_);
  if (!o.populate) return;
  if (madvise(mapping_, mapped_bytes_, MADV_POPULATE_WRITE) == 0) return;
  if (errno != EINVAL) {
    const int err = errno;
    munmap(mapping_, mapped_bytes_);
    fail("expert arena: cannot fault in ", format_bytes(bytes), " (", page_backing_name(backing_),
         "): ", std::strerror(err), "; give the expert cache less memory (--expert-budget, --memory-limit)");
  }
  // A kernel before 5.14: one write per page does the same.
  for (size_t off = 0; off < mapped_bytes_; off += kSmallPage)
    static_cast<volatile uint8_t*>(mapping_)[off] = 0;
}

ArenaMemory::~ArenaMemory() { munmap(mapping_, mapped_bytes_); }

}  // namespace strata::util
