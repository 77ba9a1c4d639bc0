#include "cli/ple_flags.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::cli {

void add_ple_flags(CLI::App* cmd, PleFlags& flags) {
  cmd->add_option("--ple-prefetch", flags.prefetch,
                  "qwen4exp: issue the reads of a window's PLE n-gram rows before layer 0 (on|off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--ple-cold", flags.cold,
                "qwen4exp: drop the PLE n-gram tables from the page cache and turn off read-around on "
                "them, so every row is read from the disk (a table far larger than RAM)");
}

void apply_ple_flags(const PleFlags& flags, model::Model& m) {
  m.set_ple_prefetch(flags.prefetch == "on");
  if (!flags.cold) return;
  const model::ModelConfig& c = m.config();
  const gguf::Reader& r = m.reader();
  if (!c.has_ple()) fail("--ple-cold: ", r.path(), " has no PLE n-gram tables");
  const int fd = ::open(r.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("--ple-cold: cannot open ", r.path(), ": ", std::strerror(errno));
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  std::string problem;
  for (size_t k = 0; k < c.ple_tables.size() && problem.empty(); ++k) {
    const gguf::TensorInfo& t = r.tensor(c.ple_table_name(int64_t(k)));
    // POSIX_FADV_DONTNEED drops the cached pages no process maps; on the CPU nothing has touched
    // the table yet (the PLE gather is its only reader), so all of its pages go.
    if (const int err = ::posix_fadvise(fd, off_t(r.data_offset() + t.offset), off_t(t.nbytes), POSIX_FADV_DONTNEED))
      problem = cat("cannot drop ", t.name, " from the page cache: ", std::strerror(err));
    // Keeps it cold: otherwise a row's fault also reads its neighbours in (the kernel's
    // read-around, up to read_ahead_kb around every fault: 8 MiB on some machines), and within a
    // run much of a table that fits in RAM ends up cached, which a table far larger than RAM
    // would not give.
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(t.data) + t.nbytes + page - 1) / page * page;
    if (problem.empty() && ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_RANDOM) != 0)
      problem = cat("cannot advise random access on ", t.name, ": ", std::strerror(errno));
  }
  ::close(fd);
  if (!problem.empty()) fail("--ple-cold: ", r.path(), ": ", problem);
}

nlohmann::ordered_json ple_json(const PleFlags& flags, int64_t tokens,
                                const model::PleCounters& before, const model::PleCounters& after) {
  const double per_token = tokens > 0 ? 1.0 / double(tokens) : 0.0;
  return {{"prefetch", flags.prefetch},
          {"cold", flags.cold},
          {"rows_per_token", double(after.rows - before.rows) * per_token},
          {"issue_ms_per_token", (after.issue_seconds - before.issue_seconds) * 1e3 * per_token},
          {"gather_ms_per_token", (after.gather_seconds - before.gather_seconds) * 1e3 * per_token}};
}

}  // namespace strata::cli
