// CpuBackend::prefetch_rows. A qwen4exp n-gram table is a read-only file mapping far larger than
// RAM, so most rows a window gathers are not in the page cache, and touching one is a synchronous
// read from the disk inside the gather, one row after another. madvise(MADV_WILLNEED) hands the
// rows' pages to the kernel's readahead instead: it queues their reads and returns without
// waiting, so the reads of all of a window's rows are in flight together (the disk serves them in
// parallel) while the layers before the PLE layer compute; the gather then finds the pages in
// memory, or waits only for a read already under way. The bytes it reads are the same.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace strata::backend {

void CpuBackend::prefetch_rows(const Weight& table, std::span<const int32_t> ids) {
  if (!table.data || ids.empty()) return;
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<uintptr_t>(table.data);
  // Each row's first and last page, sorted and merged, so that a page several rows share is asked
  // for once and neighbouring pages go out in one call.
  std::vector<std::pair<uintptr_t, uintptr_t>> pages;
  pages.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= table.rows) continue;  // get_rows reports it with the row it belongs to
    const uintptr_t begin = base + uintptr_t(id) * table.row_stride;
    pages.emplace_back(begin / page, (begin + table.row_stride - 1) / page);
  }
  std::sort(pages.begin(), pages.end());
  for (size_t i = 0; i < pages.size();) {
    const uintptr_t first = pages[i].first;
    uintptr_t last = pages[i].second;
    for (++i; i < pages.size() && pages[i].first <= last + 1; ++i) last = std::max(last, pages[i].second);
    // Only a hint: where it fails (memory that is not a file mapping) the gather faults the rows
    // in itself, as without it.
    ::madvise(reinterpret_cast<void*>(first * page), size_t(last - first + 1) * page, MADV_WILLNEED);
  }
}

}  // namespace strata::backend
