#include "util/run_counters.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>

namespace strata::util {

namespace {

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void add(ThreadTimes& to, uint64_t cpu_ns, uint64_t runqueue_ns) {
  to.cpu_ns += cpu_ns;
  to.runqueue_ns += runqueue_ns;
  ++to.threads;
}

ThreadTimes minus(const ThreadTimes& a, const ThreadTimes& b) {
  // A group can lose a thread between samples; never report negative time.
  return {a.cpu_ns > b.cpu_ns ? a.cpu_ns - b.cpu_ns : 0,
          a.runqueue_ns > b.runqueue_ns ? a.runqueue_ns - b.runqueue_ns : 0, a.threads};
}

}  // namespace

void name_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

PoolCounters& pool_counters() {
  static PoolCounters counters;
  return counters;
}

bool parse_schedstat(std::string_view text, uint64_t& cpu_ns, uint64_t& runqueue_ns) {
  const char* p = text.data();
  const char* end = p + text.size();
  const auto field = [&](uint64_t& out) {
    while (p < end && *p == ' ') ++p;
    const auto r = std::from_chars(p, end, out);
    if (r.ec != std::errc() || r.ptr == p) return false;
    p = r.ptr;
    return true;
  };
  return field(cpu_ns) && field(runqueue_ns);
}

RunSample sample_run() {
  RunSample s;
  const long self = syscall(SYS_gettid);
  if (DIR* dir = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      const std::string task = std::string("/proc/self/task/") + e->d_name;
      uint64_t cpu = 0, runqueue = 0;
      if (!parse_schedstat(read_small_file(task + "/schedstat"), cpu, runqueue)) continue;
      s.schedstat = true;
      std::string name = read_small_file(task + "/comm");
      while (!name.empty() && name.back() == '\n') name.pop_back();
      if (std::strtol(e->d_name, nullptr, 10) == self)
        add(s.caller, cpu, runqueue);
      else if (name == kPoolThreadName)
        add(s.pool, cpu, runqueue);
      else if (name == kReaderThreadName)
        add(s.readers, cpu, runqueue);
      else
        add(s.other, cpu, runqueue);
    }
    closedir(dir);
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  s.minor_faults = uint64_t(u.ru_minflt);
  s.major_faults = uint64_t(u.ru_majflt);
  s.voluntary_switches = uint64_t(u.ru_nvcsw);
  s.involuntary_switches = uint64_t(u.ru_nivcsw);
  const PoolCounters& p = pool_counters();
  s.pool_steps = p.steps.load(std::memory_order_relaxed);
  s.pool_inline_steps = p.inline_steps.load(std::memory_order_relaxed);
  s.pool_inline_switches = p.inline_switches.load(std::memory_order_relaxed);
  s.pool_wait_ns = p.wait_ns.load(std::memory_order_relaxed);
  s.pool_caller_sleeps = p.caller_sleeps.load(std::memory_order_relaxed);
  s.pool_helper_wakes = p.helper_wakes.load(std::memory_order_relaxed);
  return s;
}

RunSample RunSample::since(const RunSample& e) const {
  RunSample d = *this;
  d.caller = minus(caller, e.caller);
  d.pool = minus(pool, e.pool);
  d.readers = minus(readers, e.readers);
  d.other = minus(other, e.other);
  d.minor_faults -= e.minor_faults;
  d.major_faults -= e.major_faults;
  d.voluntary_switches -= e.voluntary_switches;
  d.involuntary_switches -= e.involuntary_switches;
  d.pool_steps -= e.pool_steps;
  d.pool_inline_steps -= e.pool_inline_steps;
  d.pool_inline_switches -= e.pool_inline_switches;
  d.pool_wait_ns -= e.pool_wait_ns;
  d.pool_caller_sleeps -= e.pool_caller_sleeps;
  d.pool_helper_wakes -= e.pool_helper_wakes;
  return d;
}

}  // namespace strata::util
