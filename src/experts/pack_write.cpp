// Writing a pack (PackWriter, strata pack) and re-reading one whole (strata pack --verify).
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "experts/pack.h"
#include "experts/pack_format.h"
#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::experts {

using namespace format;

namespace {

// Records are written in batches of this many bytes; verify reads this much at a time (larger
// reads ran faster on the development disk: 16 MiB O_DIRECT reads at 0.86 GB/s, 8 MiB at 0.64).
constexpr size_t kBatchBytes = size_t(8) << 20;
constexpr size_t kVerifyBytes = size_t(32) << 20;

std::string errno_text() { return std::strerror(errno); }

// Switches a descriptor from O_DIRECT to buffered I/O; false if it was not O_DIRECT (or cannot
// be switched). For filesystems that accept O_DIRECT at open but refuse it on a read or write.
bool clear_direct(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_DIRECT) && ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) == 0;
}

// Writes all n bytes at offset (see clear_direct for EINVAL).
void write_all(int fd, const std::string& path, const uint8_t* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, std::min(n, size_t(1) << 30), off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && clear_direct(fd)) continue;
    if (w < 0) fail(path, ": write of ", n, " bytes at offset ", offset, " failed: ", errno_text());
    p += w;
    n -= size_t(w);
    offset += uint64_t(w);
  }
}

// The first byte outside gate|up|down that is not zero, or -1.
int64_t stray_padding(const Layout& l, const uint8_t* record) {
  int order[3] = {0, 1, 2};
  std::sort(order, order + 3, [&](int a, int b) { return l.part(a).offset < l.part(b).offset; });
  uint64_t at = 0;
  for (int k = 0; k <= 3; ++k) {
    const uint64_t end = k < 3 ? l.part(order[k]).offset : l.record_bytes;
    for (uint64_t i = at; i < end; ++i)
      if (record[i] != 0) return int64_t(i);
    if (k < 3) at = end + l.part(order[k]).bytes();
  }
  return -1;
}

void check_free_space(const std::string& path, uint64_t need) {
  std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
  struct statvfs st;
  if (statvfs(dir.c_str(), &st) != 0) fail("cannot stat the output directory ", dir.string());
  const uint64_t avail = uint64_t(st.f_bavail) * st.f_frsize;
  if (avail < need)
    fail("not enough disk space for ", path, ": the pack needs ", need, " bytes, ", dir.string(),
         " has ", avail, " free");
}

}  // namespace

struct PackWriter::State {
  std::string tmp_path;
  int fd = -1;
  std::vector<Layout> layouts;
  int n_experts = 0;
  Geometry geometry;
  std::vector<Record> records;
  size_t next = 0;        // index of the next record (layer-major)
  uint64_t position = 0;  // file offset of the next record
  // Records go out in aligned batches through O_DIRECT: on a virtual disk buffered writeback ran
  // at a ninth of the direct write rate (docs/PACK.md), and the page cache gains nothing from a
  // file nobody reads back soon. Every batch is whole 4 KiB blocks at a 4 KiB-aligned offset.
  // Writes are synchronous: a background writer thread lost more to scheduling delays on the
  // loaded 2-core machine than it gained by overlapping (docs/PACK.md).
  AlignedBuffer batch{kBatchBytes};
  size_t batch_used = 0;
  uint64_t batch_offset = 0;
  SourceIdHasher id;
  bool finished = false;

  void put(const uint8_t* p, size_t n) {
    while (n > 0) {
      const size_t k = std::min(n, batch.size() - batch_used);
      std::memcpy(batch.data() + batch_used, p, k);
      batch_used += k;
      p += k;
      n -= k;
      if (batch_used == batch.size()) flush();
    }
  }
  void flush() {
    write_all(fd, tmp_path, batch.data(), batch_used, batch_offset);
    batch_offset += batch_used;
    batch_used = 0;
  }
};

PackWriter::PackWriter(std::string path, std::vector<Layout> layouts, int n_experts)
    : path_(std::move(path)), state_(std::make_unique<State>()) {
  State& s = *state_;
  if (layouts.empty() || layouts.size() > kMaxLayers)
    fail(path_, ": a pack holds 1..", kMaxLayers, " layers, not ", layouts.size());
  if (n_experts <= 0 || uint32_t(n_experts) > kMaxExperts)
    fail(path_, ": a pack holds 1..", kMaxExperts, " experts per layer, not ", n_experts);
  if (layouts.size() * uint64_t(n_experts) > kMaxRecords)
    fail(path_, ": ", layouts.size(), " layers x ", n_experts, " experts is more than ",
         kMaxRecords, " records");
  s.layouts = std::move(layouts);
  s.n_experts = n_experts;
  s.geometry = geometry(s.layouts.size(), uint64_t(n_experts));
  s.records.resize(s.layouts.size() * size_t(n_experts));
  s.position = s.geometry.data_offset;
  s.batch_offset = s.position;
  check_free_space(path_, total_bytes());
  s.tmp_path = path_ + ".tmp";
  s.fd = ::open(s.tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
  if (s.fd < 0 && errno == EINVAL)
    s.fd = ::open(s.tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (s.fd < 0) fail(s.tmp_path, ": cannot create: ", errno_text());
}

PackWriter::~PackWriter() {
  if (state_->fd >= 0) ::close(state_->fd);
  if (!state_->finished) ::unlink(state_->tmp_path.c_str());
}

uint64_t PackWriter::total_bytes() const {
  uint64_t total = state_->geometry.data_offset;
  for (const auto& l : state_->layouts) total += l.record_bytes * uint64_t(state_->n_experts);
  return total;
}

uint64_t PackWriter::source_id() const { return state_->id.digest(); }

void PackWriter::append(const uint8_t* record) {
  State& s = *state_;
  if (s.finished) fail(path_, ": append() after finish()");
  if (s.next == s.records.size())
    fail(path_, ": append() past the last record (", s.records.size(), ")");
  const int layer = int(s.next / size_t(s.n_experts)), expert = int(s.next % size_t(s.n_experts));
  const Layout& l = s.layouts[size_t(layer)];
  if (const int64_t at = stray_padding(l, record); at >= 0)
    fail(path_, ": record (layer ", layer, ", expert ", expert, ") has a non-zero padding byte at ",
         at);
  if (expert == 0) {
    const uint8_t* parts[3] = {record + l.gate.offset, record + l.up.offset,
                               record + l.down.offset};
    s.id.add_layer(l, s.n_experts, parts);
  }
  s.records[s.next] = {s.position, l.record_bytes, checksum(record, size_t(l.record_bytes))};
  s.put(record, size_t(l.record_bytes));
  s.position += l.record_bytes;
  ++s.next;
}

void PackWriter::finish() {
  State& s = *state_;
  if (s.finished) fail(path_, ": finish() called twice");
  if (s.next != s.records.size())
    fail(path_, ": finish() after ", s.next, " of ", s.records.size(), " records");
  s.flush();

  // Tables first, header last: a file without its header never opens as a pack. Both writes are
  // whole aligned blocks (O_DIRECT): the tables with the header zeroed, then the first block again.
  const Geometry& g = s.geometry;
  AlignedBuffer front(size_t(g.data_offset));
  for (size_t l = 0; l < s.layouts.size(); ++l) {
    uint8_t* e = front.data() + g.layers_offset + l * kLayerEntryBytes;
    store<uint64_t>(e, s.layouts[l].record_bytes);
    for (int i = 0; i < 3; ++i) {
      const Part& p = s.layouts[l].part(i);
      uint8_t* pe = e + 8 + uint64_t(i) * kPartEntryBytes;
      store<uint32_t>(pe, uint32_t(p.type));
      store<int64_t>(pe + 8, p.rows);
      store<int64_t>(pe + 16, p.cols);
      store<uint64_t>(pe + 24, p.row_stride);
      store<uint64_t>(pe + 32, p.offset);
    }
  }
  for (size_t i = 0; i < s.records.size(); ++i) {
    uint8_t* e = front.data() + g.index_offset + i * kIndexEntryBytes;
    store<uint64_t>(e, s.records[i].offset);
    store<uint64_t>(e + 8, s.records[i].length);
    store<uint64_t>(e + 16, s.records[i].checksum);
  }
  write_all(s.fd, s.tmp_path, front.data(), front.size(), 0);
  if (::fdatasync(s.fd) != 0) fail(s.tmp_path, ": fsync failed: ", errno_text());
  uint8_t* h = front.data();
  std::memcpy(h + kAtMagic, kMagic, sizeof kMagic);
  store<uint32_t>(h + kAtVersion, kVersion);
  store<uint32_t>(h + kAtHeaderBytes, uint32_t(kHeaderBytes));
  store<uint32_t>(h + kAtLayers, uint32_t(s.layouts.size()));
  store<uint32_t>(h + kAtExperts, uint32_t(s.n_experts));
  store<uint64_t>(h + kAtSourceId, s.id.digest());
  store<uint64_t>(h + kAtLayersOffset, g.layers_offset);
  store<uint64_t>(h + kAtIndexOffset, g.index_offset);
  store<uint64_t>(h + kAtDataOffset, g.data_offset);
  store<uint64_t>(h + kAtTablesChecksum,
                  checksum(h + g.layers_offset, size_t(g.index_end - g.layers_offset)));
  store<uint64_t>(h + kHeaderChecksumAt, checksum(h, kHeaderChecksumAt));
  write_all(s.fd, s.tmp_path, h, size_t(kPackAlignment), 0);
  if (::fsync(s.fd) != 0) fail(s.tmp_path, ": fsync failed: ", errno_text());
  const int fd = s.fd;
  s.fd = -1;
  if (::close(fd) != 0) fail(s.tmp_path, ": close failed: ", errno_text());
  if (::rename(s.tmp_path.c_str(), path_.c_str()) != 0)
    fail(path_, ": cannot rename ", s.tmp_path, " into place: ", errno_text());
  s.finished = true;
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

PackReport write_pack(const gguf::Reader& model, const std::string& out,
                      const std::function<void(uint64_t)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const ExpertShape shape = expert_shape(model);
  PackWriter writer(out, shape.layers, shape.n_experts);
  uint64_t max_record = 0;
  for (const auto& l : shape.layers) max_record = std::max(max_record, l.record_bytes);
  AlignedBuffer record{size_t(max_record)};
  for (int layer = 0; layer < int(shape.layers.size()); ++layer) {
    const Layout& l = shape.layers[size_t(layer)];
    const gguf::TensorInfo* stacks[3];
    for (int i = 0; i < 3; ++i) stacks[i] = &model.tensor(expert_stack_name(layer, i));
    for (int e = 0; e < shape.n_experts; ++e) {
      std::memset(record.data(), 0, size_t(l.record_bytes));
      for (int i = 0; i < 3; ++i) {
        const Part& p = l.part(i);
        std::memcpy(record.data() + p.offset, stacks[i]->data + uint64_t(e) * p.bytes(),
                    size_t(p.bytes()));
      }
      writer.append(record.data());
      if (progress) progress(l.record_bytes);
    }
  }
  writer.finish();
  PackReport r;
  r.bytes = writer.total_bytes();
  r.source_id = writer.source_id();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

VerifyReport verify_pack(const Pack& pack, const gguf::Reader* model,
                         const std::function<void(uint64_t)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  if (model) {
    const ExpertShape shape = expert_shape(*model);
    if (int(shape.layers.size()) != pack.n_layers() || shape.n_experts != pack.n_experts())
      fail(pack.path(), ": holds ", pack.n_layers(), " layers x ", pack.n_experts(), " experts, ",
           model->path(), " has ", shape.layers.size(), " x ", shape.n_experts);
    for (int l = 0; l < pack.n_layers(); ++l)
      for (int i = 0; i < 3; ++i) {
        const Part& a = pack.layout(l).part(i);
        const Part& b = shape.layers[size_t(l)].part(i);
        if (a.type != b.type || a.rows != b.rows || a.cols != b.cols)
          fail(pack.path(), ": layer ", l, " ", part_name(i), " is ", quant::type_name(a.type),
               " [", a.rows, " x ", a.cols, "], ", model->path(), " has ", quant::type_name(b.type),
               " [", b.rows, " x ", b.cols, "]");
      }
  }
  int fd = ::open(pack.path().c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0 && errno == EINVAL) fd = ::open(pack.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(pack.path(), ": cannot open: ", errno_text());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  const int n_experts = pack.n_experts();
  std::vector<uint32_t> order(size_t(pack.n_layers()) * size_t(n_experts));
  std::iota(order.begin(), order.end(), 0u);
  const auto rec = [&](uint32_t i) -> const Record& {
    return pack.record(int(i / n_experts), int(i % n_experts));
  };
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return rec(a).offset < rec(b).offset; });
  // Runs of adjacent records of up to kVerifyBytes (at least one record each).
  struct Run {
    size_t first, last;  // positions in `order`, [first, last)
    uint64_t start, end;
  };
  const size_t capacity = std::max<size_t>(kVerifyBytes, size_t(pack.max_record_bytes()));
  std::vector<Run> runs;
  for (size_t k = 0; k < order.size();) {
    Run run{k, k + 1, rec(order[k]).offset, rec(order[k]).offset + rec(order[k]).length};
    while (run.last < order.size() && rec(order[run.last]).offset == run.end &&
           run.end + rec(order[run.last]).length - run.start <= capacity)
      run.end += rec(order[run.last++]).length;
    runs.push_back(run);
    k = run.last;
  }
  const auto read_run = [&pack, fd](const Run& run, uint8_t* dst) {
    size_t done = 0;
    while (done < run.end - run.start) {
      const ssize_t got =
          ::pread(fd, dst + done, size_t(run.end - run.start - done), off_t(run.start + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && errno == EINVAL && clear_direct(fd)) continue;
      if (got <= 0)
        fail(pack.path(), ": reading records at offset ", run.start + done,
             " failed: ", got < 0 ? errno_text() : std::string("unexpected end of file"));
      done += size_t(got);
    }
  };
  // One synchronous read per run: a background reader lost more to scheduling delays on the
  // loaded 2-core machine than it gained (docs/PACK.md).
  AlignedBuffer buffer(capacity);
  VerifyReport report;
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    read_run(runs[ri], buffer.data());
    const uint64_t start = runs[ri].start;
    for (size_t k = runs[ri].first; k < runs[ri].last; ++k) {
      const int layer = int(order[k] / uint32_t(n_experts)),
                expert = int(order[k] % uint32_t(n_experts));
      const Record& r = rec(order[k]);
      const uint8_t* bytes = buffer.data() + (r.offset - start);
      const std::string where = cat(pack.path(), ": record (layer ", layer, ", expert ", expert,
                                    ") at offset ", r.offset, " (", r.length, " bytes)");
      const uint64_t sum = checksum(bytes, size_t(r.length));
      if (sum != r.checksum)
        fail(where, ": checksum mismatch (index ", std::hex, r.checksum, ", bytes ", sum, ")");
      const Layout& l = pack.layout(layer);
      if (const int64_t at = stray_padding(l, bytes); at >= 0)
        fail(where, ": non-zero padding byte at ", at);
      if (model)
        for (int i = 0; i < 3; ++i) {
          const Part& p = l.part(i);
          const gguf::TensorInfo& t = model->tensor(expert_stack_name(layer, i));
          const uint8_t* want = t.data + uint64_t(expert) * p.bytes();
          if (std::memcmp(bytes + p.offset, want, size_t(p.bytes())) != 0)
            fail(where, ": ", part_name(i), " differs from ", model->path(), "'s ", t.name,
                 " expert ", expert);
        }
      report.bytes += r.length;
      ++report.records;
      if (progress) progress(r.length);
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace strata::experts
