#include "util/memory_lock.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "util/error.h"
#include "util/progress.h"

namespace strata::util {

LockResult lock_in_memory(std::span<const ByteRange> ranges) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (const ByteRange& r : ranges) {
    if (r.bytes == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(r.data) / page * page;
    const auto end = (reinterpret_cast<uintptr_t>(r.data) + r.bytes + page - 1) / page * page;
    spans.emplace_back(begin, end);
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& s : spans) {
    if (!merged.empty() && s.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, s.second);
    else
      merged.push_back(s);
  }
  LockResult result;
  for (const auto& m : merged) result.asked += m.second - m.first;
  if (rlimit lim{}; getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_MEMLOCK, &lim);
  }
  for (const auto& m : merged) {
    if (mlock(reinterpret_cast<const void*>(m.first), m.second - m.first) != 0) {
      const int err = errno;
      rlimit lim{};
      getrlimit(RLIMIT_MEMLOCK, &lim);
      result.failure = cat(std::strerror(err), " (RLIMIT_MEMLOCK ",
                           lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : format_bytes(lim.rlim_cur),
                           "; raise it with ulimit -l or LimitMEMLOCK=, or run with CAP_IPC_LOCK)");
      break;
    }
    result.locked += m.second - m.first;
  }
  return result;
}

}  // namespace strata::util
