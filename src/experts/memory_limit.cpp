#include "experts/memory_limit.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "util/error.h"
#include "util/progress.h"

namespace strata::experts {

namespace {

// v1 reports "unlimited" as LONG_MAX rounded down to a page; nothing real is that large.
constexpr uint64_t kV1Unlimited = uint64_t(1) << 62;
// Reader threads' stacks (touched part) and io_uring rings.
constexpr uint64_t kReaderThreadBytes = uint64_t(1) << 20;

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  return s;
}

struct Mount {
  std::string root, point, fstype, options;
};

// /proc/self/mountinfo: "ID PARENT MAJ:MIN ROOT POINT OPTS [TAGS...] - FSTYPE SOURCE SUPEROPTS".
std::vector<Mount> cgroup_mounts(const std::string& text) {
  std::vector<Mount> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::vector<std::string> f;
    for (std::string w; in >> w;) f.push_back(w);
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (dash == f.end() || dash - f.begin() < 5 || f.end() - dash < 4) continue;
    Mount m{f[3], f[4], *(dash + 1), *(dash + 3)};
    if (m.fstype == "cgroup" || m.fstype == "cgroup2") out.push_back(std::move(m));
  }
  return out;
}

bool has_word(const std::string& list, std::string_view word) {
  std::istringstream in(list);
  for (std::string w; std::getline(in, w, ',');)
    if (w == word) return true;
  return false;
}

// The smallest limit in `file` from the cgroup `path` (relative to the mount) up to the mount.
std::optional<MemoryLimit> smallest_limit(const std::string& dir, std::string path, const char* file) {
  std::optional<MemoryLimit> best;
  for (;;) {
    const std::string name = dir + path + (path.empty() || path.back() != '/' ? "/" : "") + file;
    if (const auto text = read_text(name)) {
      const std::optional<uint64_t> v = parse_cgroup_limit(*text, name);
      if (v && (!best || *v < best->bytes)) best = MemoryLimit{*v, name};
    }
    if (path.empty() || path == "/") break;
    const size_t slash = path.find_last_of('/');
    path = slash == std::string::npos ? std::string() : path.substr(0, slash);
  }
  return best;
}

}  // namespace

std::optional<uint64_t> parse_cgroup_limit(std::string_view text, const std::string& path) {
  const std::string_view t = trim(text);
  if (t == "max") return std::nullopt;
  uint64_t v = 0;
  const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size())
    fail(path, ": '", std::string(t), "' is not a memory limit (bytes, or max)");
  if (v >= kV1Unlimited) return std::nullopt;
  return v;
}

std::optional<MemoryLimit> cgroup_memory_limit(const std::string& proc_self, const std::string& root) {
  const auto cgroups = read_text(proc_self + "/cgroup");
  const auto mountinfo = read_text(proc_self + "/mountinfo");
  if (!cgroups || !mountinfo) return std::nullopt;
  const std::vector<Mount> mounts = cgroup_mounts(*mountinfo);
  std::optional<MemoryLimit> best;
  const auto consider = [&](const std::optional<MemoryLimit>& l) {
    if (l && (!best || l->bytes < best->bytes)) best = l;
  };
  std::istringstream lines(*cgroups);
  for (std::string line; std::getline(lines, line);) {
    // "ID:CONTROLLERS:PATH"; v2 is "0::PATH".
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    const bool v2 = line.substr(0, a) == "0" && controllers.empty();
    if (!v2 && !has_word(controllers, "memory")) continue;
    for (const Mount& m : mounts) {
      if ((m.fstype == "cgroup2") != v2) continue;
      if (!v2 && !has_word(m.options, "memory")) continue;
      // Inside a container without its own cgroup namespace the mount shows a subtree.
      std::string rel = path;
      if (m.root != "/" && rel.starts_with(m.root)) rel = rel.substr(m.root.size());
      consider(smallest_limit(root + m.point, rel, v2 ? "memory.max" : "memory.limit_in_bytes"));
    }
  }
  return best;
}

uint64_t activation_margin(uint64_t limit_bytes) {
  return std::max<uint64_t>(uint64_t(384) << 20, limit_bytes / 24);
}

MemorySplit split_memory(const MemoryLimit& limit, uint64_t trunk_bytes, int reader_threads,
                         uint64_t min_arena) {
  MemorySplit s;
  s.limit = limit;
  s.trunk = trunk_bytes;
  s.readers = uint64_t(std::max(reader_threads, 0)) * kReaderThreadBytes;
  s.activations = activation_margin(limit.bytes);
  const uint64_t set_aside = s.trunk + s.readers + s.activations;
  s.arena = limit.bytes > set_aside ? limit.bytes - set_aside : 0;
  if (s.arena < min_arena)
    fail(limit.source, ": a memory limit of ", format_bytes(limit.bytes), " leaves ", format_bytes(s.arena),
         " for the expert cache, below the ", format_bytes(min_arena), " it needs (trunk ",
         format_bytes(s.trunk), " + readers ", format_bytes(s.readers), " + activations and state ",
         format_bytes(s.activations), "); give more memory");
  return s;
}

std::string MemorySplit::describe() const {
  return cat("memory limit ", format_bytes(limit.bytes), " (", limit.source, "): trunk ", format_bytes(trunk),
             " + expert cache ", format_bytes(arena), " + readers ", format_bytes(readers),
             " + activations and state ", format_bytes(activations));
}

}  // namespace strata::experts
