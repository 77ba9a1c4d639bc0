// Anonymous memory for a large, long-lived buffer the hot path writes and reads all the time (the
// CPU expert arena): backed by huge pages where the system offers them, and faulted in once when
// it is made, so that decoding never takes a first-touch page fault (docs/PERFORMANCE.md, "Arena
// memory"). An 8 GiB arena first touched in 4 KiB pages cost 1.89 million minor faults over a
// streamed run.
//
// Backing, best first: hugetlb pages (MAP_HUGETLB; only where the administrator reserved them,
// /proc/sys/vm/nr_hugepages), else a 2 MiB-aligned mapping advised MADV_HUGEPAGE (transparent
// huge pages, unless /sys/kernel/mm/transparent_hugepage/enabled says never), else 4 KiB pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::util {

enum class PageBacking { HugeTlb, Transparent, Small };

// "hugetlb", "transparent huge pages", "4 KiB pages".
const char* page_backing_name(PageBacking backing);

// The bracketed word of a sysfs choice file ("always [madvise] never" gives "madvise"); empty
// when there is none.
std::string sysfs_choice(std::string_view text);

struct ArenaMemoryOptions {
  bool huge_pages = true;  // try hugetlb, then transparent huge pages
  bool populate = true;    // fault every page in now (MADV_POPULATE_WRITE, else a write per page)
};

class ArenaMemory {
 public:
  // Throws strata::Error when the memory cannot be mapped or faulted in (naming its size).
  explicit ArenaMemory(size_t bytes, const ArenaMemoryOptions& options = {});
  ~ArenaMemory();
  ArenaMemory(const ArenaMemory&) = delete;
  ArenaMemory& operator=(const ArenaMemory&) = delete;

  uint8_t* data() const { return base_; }
  size_t bytes() const { return bytes_; }
  PageBacking backing() const { return backing_; }

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  // What was mapped: base_ lies inside it (aligned up for transparent huge pages).
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  PageBacking backing_ = PageBacking::Small;
};

}  // namespace strata::util
