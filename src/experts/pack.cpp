// Pack reader: validates header, layer layouts and record index before handing anything out.
//
// Counts are checked against the file size before any table is allocated (every record takes at
// least 4 KiB), so memory use is bounded by a small fraction of the file whatever the header
// claims. Checksums come first for the header and the tables, so a damaged pack is reported as
// damaged rather than by whichever field the damage happened to hit.
#include "experts/pack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "experts/pack_format.h"
#include "util/error.h"

namespace strata::experts {

static_assert(std::endian::native == std::endian::little, "the pack format is little-endian");

using namespace format;

namespace {

// Larger records are refused: an expert of the flagship is ~1.4 MB, the largest plausible (a
// 4096 x 16384 FFN at f32) is 0.8 GB.
constexpr uint64_t kMaxRecordBytes = uint64_t(4) << 30;
constexpr int64_t kMaxDim = int64_t(1) << 31;

// Reads exactly n bytes at offset, or fails naming the file.
void read_exact(int fd, const std::string& path, void* dst, size_t n, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      fail(path, ": read of ", n, " bytes at offset ", offset, " failed: ", std::strerror(errno));
    if (got == 0) fail(path, ": unexpected end of file at offset ", offset);
    p += got;
    n -= size_t(got);
    offset += uint64_t(got);
  }
}

// One part entry: type, rows, cols, row stride, offset, checked on its own and against the
// record it lives in.
Part parse_part(const uint8_t* e, const std::string& where, uint64_t record_bytes) {
  const uint32_t type_id = load<uint32_t>(e);
  if (load<uint32_t>(e + 4) != 0) fail(where, ": reserved field is not zero");
  const auto info = quant::find_type(type_id);
  if (!info) fail(where, ": unknown quant type id ", type_id);
  if (!info->weight_format) fail(where, ": type ", info->name, " is not a weight format");
  Part p;
  p.type = info->type;
  p.rows = load<int64_t>(e + 8);
  p.cols = load<int64_t>(e + 16);
  const uint64_t stride = load<uint64_t>(e + 24);
  p.offset = load<uint64_t>(e + 32);
  if (p.rows <= 0 || p.rows > kMaxDim || p.cols <= 0 || p.cols > kMaxDim)
    fail(where, ": shape [", p.rows, " rows, ", p.cols, " cols] out of range (1..2^31)");
  if (p.cols % info->block_elems != 0)
    fail(where, ": ", p.cols, " cols is not a multiple of ", info->name, "'s block of ",
         info->block_elems, " elements");
  const uint64_t want_stride = quant::row_bytes(*info, p.cols);
  if (stride != want_stride)
    fail(where, ": row stride ", stride, " bytes, but ", p.cols, " ", info->name, " elements take ",
         want_stride);
  p.row_stride = size_t(stride);
  if (stride > kMaxRecordBytes / uint64_t(p.rows))
    fail(where, ": ", p.rows, " rows of ", stride, " bytes exceed the largest record (4 GiB)");
  if (p.offset % kPartAlignment != 0)
    fail(where, ": offset ", p.offset, " is not a multiple of ", kPartAlignment);
  if (p.offset > record_bytes || p.bytes() > record_bytes - p.offset)
    fail(where, ": bytes [", p.offset, ", ", p.offset + p.bytes(), ") run past the record of ",
         record_bytes, " bytes");
  return p;
}

Layout parse_layout(const uint8_t* e, const std::string& file, int layer) {
  const std::string where = cat(file, ": layer ", layer);
  Layout l;
  l.record_bytes = load<uint64_t>(e);
  if (l.record_bytes == 0 || l.record_bytes % kPackAlignment != 0 ||
      l.record_bytes > kMaxRecordBytes)
    fail(where, ": record size ", l.record_bytes, " is not a non-zero multiple of ", kPackAlignment,
         " up to 4 GiB");
  Part* parts[3] = {&l.gate, &l.up, &l.down};
  for (int i = 0; i < 3; ++i)
    *parts[i] = parse_part(e + 8 + uint64_t(i) * kPartEntryBytes, cat(where, " ", part_name(i)),
                           l.record_bytes);
  if (l.up.rows != l.gate.rows || l.up.cols != l.gate.cols)
    fail(where, ": up is [", l.up.rows, " x ", l.up.cols, "], gate [", l.gate.rows, " x ",
         l.gate.cols, "]; they must match");
  // down's row may be zero-padded to whole blocks of its type (docs/ARCH_QWEN4EXP.md).
  const int64_t down_block = quant::type_info(l.down.type).block_elems;
  const int64_t padded = (l.gate.rows + down_block - 1) / down_block * down_block;
  if (l.down.rows != l.gate.cols || (l.down.cols != l.gate.rows && l.down.cols != padded))
    fail(where, ": down is [", l.down.rows, " x ", l.down.cols, "], expected [", l.gate.cols, " x ",
         l.gate.rows, "] (the transpose of gate) or [", l.gate.cols, " x ", padded,
         "] (rows zero-padded to whole blocks)");
  int order[3] = {0, 1, 2};
  std::sort(order, order + 3, [&](int a, int b) { return l.part(a).offset < l.part(b).offset; });
  for (int k = 1; k < 3; ++k) {
    const Part& prev = l.part(order[k - 1]);
    if (prev.offset + prev.bytes() > l.part(order[k]).offset)
      fail(where, ": ", part_name(order[k - 1]), " and ", part_name(order[k]), " overlap");
  }
  return l;
}

}  // namespace

uint64_t checksum(const void* bytes, size_t n) { return XXH3_64bits(bytes, n); }

format::SourceIdHasher::SourceIdHasher() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

format::SourceIdHasher::~SourceIdHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void format::SourceIdHasher::add_layer(const Layout& layout, int n_experts,
                                       const uint8_t* const parts[3]) {
  auto* s = static_cast<XXH3_state_t*>(state_);
  for (int i = 0; i < 3; ++i) {
    const Part& p = layout.part(i);
    uint8_t block[32] = {};
    store<uint32_t>(block, uint32_t(p.type));
    store<int64_t>(block + 8, p.rows);
    store<int64_t>(block + 16, p.cols);
    store<uint64_t>(block + 24, uint64_t(n_experts));
    XXH3_64bits_update(s, block, sizeof block);
    XXH3_64bits_update(s, parts[i], size_t(std::min(p.bytes(), kIdSampleBytes)));
  }
}

uint64_t format::SourceIdHasher::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

Layout make_layout(Part gate, Part up, Part down) {
  Layout l;
  Part* parts[3] = {&gate, &up, &down};
  uint64_t at = 0;
  for (int i = 0; i < 3; ++i) {
    Part& p = *parts[i];
    const auto& info = quant::type_info(p.type);
    if (p.rows <= 0 || p.cols <= 0 || p.cols % info.block_elems != 0)
      fail("expert ", part_name(i), " [", p.rows, " x ", p.cols, "]: ", info.name,
           " needs a positive shape whose row is whole blocks of ", info.block_elems);
    p.row_stride = quant::row_bytes(info, p.cols);
    p.offset = align_up(at, kPartAlignment);
    at = p.offset + p.bytes();
  }
  l.gate = gate;
  l.up = up;
  l.down = down;
  l.record_bytes = align_up(at, kPackAlignment);
  return l;
}

Pack::~Pack() {
  if (fd_ >= 0) ::close(fd_);
}

const Layout& Pack::layout(int layer) const {
  if (layer < 0 || layer >= n_layers())
    fail(path_, ": layer ", layer, " out of range (", n_layers(), " layers)");
  return layouts_[size_t(layer)];
}

const Record& Pack::record(int layer, int expert) const {
  if (layer < 0 || layer >= n_layers() || expert < 0 || expert >= n_experts_)
    fail(path_, ": record (layer ", layer, ", expert ", expert, ") out of range (", n_layers(),
         " layers x ", n_experts_, " experts)");
  return records_[size_t(layer) * size_t(n_experts_) + size_t(expert)];
}

bool Pack::checksum_ok(int layer, int expert, const void* bytes) const {
  const Record& r = record(layer, expert);
  return checksum(bytes, size_t(r.length)) == r.checksum;
}

uint64_t Pack::data_bytes() const {
  uint64_t total = 0;
  for (const auto& l : layouts_) total += l.record_bytes * uint64_t(n_experts_);
  return total;
}

std::unique_ptr<Pack> Pack::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  std::unique_ptr<Pack> pack(new Pack);
  pack->fd_ = fd;
  pack->path_ = path;
  struct stat st;
  if (::fstat(fd, &st) != 0) fail(path, ": cannot stat: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, ": not a regular file");
  pack->file_size_ = uint64_t(st.st_size);
  if (pack->file_size_ < kHeaderBytes)
    fail(path, ": ", pack->file_size_, " bytes is too small for a pack header (", kHeaderBytes,
         ")");
  std::vector<uint8_t> front(kHeaderBytes);
  read_exact(fd, path, front.data(), front.size(), 0);
  // The header alone tells how long the tables are; parse() re-checks it with them.
  const uint64_t tables_end = pack->parse_header_end(front.data());
  front.resize(size_t(tables_end));
  read_exact(fd, path, front.data() + kHeaderBytes, size_t(tables_end - kHeaderBytes),
             kHeaderBytes);
  pack->parse(front.data(), front.size());
  return pack;
}

std::unique_ptr<Pack> Pack::from_memory(const uint8_t* data, size_t size, std::string name) {
  std::unique_ptr<Pack> pack(new Pack);
  pack->path_ = std::move(name);
  pack->file_size_ = size;
  if (size < kHeaderBytes)
    fail(pack->path_, ": ", size, " bytes is too small for a pack header (", kHeaderBytes, ")");
  pack->parse(data, size_t(pack->parse_header_end(data)));
  return pack;
}

uint64_t Pack::parse_header_end(const uint8_t* h) const {
  const std::string& f = path_;
  if (std::memcmp(h + kAtMagic, kMagic, sizeof kMagic) != 0)
    fail(f, ": not a strata expert pack (bad magic; make one with `strata pack MODEL.gguf`)");
  const uint32_t version = load<uint32_t>(h + kAtVersion);
  if (version != kVersion)
    fail(f, ": pack version ", version, ", this strata reads version ", kVersion);
  if (load<uint64_t>(h + kHeaderChecksumAt) != checksum(h, kHeaderChecksumAt))
    fail(f, ": header checksum mismatch (the pack is damaged; remake it with `strata pack`)");
  if (load<uint32_t>(h + kAtHeaderBytes) != kHeaderBytes)
    fail(f, ": header size ", load<uint32_t>(h + kAtHeaderBytes), ", expected ", kHeaderBytes);
  for (uint64_t i = kAtReserved; i < kHeaderChecksumAt; ++i)
    if (h[i] != 0) fail(f, ": reserved header byte ", i, " is not zero");
  const uint32_t n_layers = load<uint32_t>(h + kAtLayers);
  const uint32_t n_experts = load<uint32_t>(h + kAtExperts);
  if (n_layers == 0 || n_layers > kMaxLayers)
    fail(f, ": layer count ", n_layers, " out of range (1..", kMaxLayers, ")");
  if (n_experts == 0 || n_experts > kMaxExperts)
    fail(f, ": expert count ", n_experts, " out of range (1..", kMaxExperts, ")");
  if (uint64_t(n_layers) * n_experts > kMaxRecords)
    fail(f, ": ", n_layers, " layers x ", n_experts, " experts is more than ", kMaxRecords,
         " records");
  const Geometry g = geometry(n_layers, n_experts);
  // Every record takes at least kPackAlignment bytes after the tables.
  const uint64_t min_size = g.data_offset + uint64_t(n_layers) * n_experts * kPackAlignment;
  if (file_size_ < min_size)
    fail(f, ": ", file_size_, " bytes cannot hold ", n_layers, " layers x ", n_experts,
         " experts (at least ", min_size, " bytes; truncated?)");
  const std::pair<uint64_t, uint64_t> fields[] = {{kAtLayersOffset, g.layers_offset},
                                                  {kAtIndexOffset, g.index_offset},
                                                  {kAtDataOffset, g.data_offset}};
  const char* names[] = {"layer table offset", "index offset", "data offset"};
  for (int i = 0; i < 3; ++i)
    if (load<uint64_t>(h + fields[i].first) != fields[i].second)
      fail(f, ": ", names[i], " ", load<uint64_t>(h + fields[i].first), ", expected ",
           fields[i].second, " for ", n_layers, " layers x ", n_experts, " experts");
  return g.index_end;
}

void Pack::parse(const uint8_t* front, size_t front_size) {
  const std::string& f = path_;
  const uint32_t n_layers = load<uint32_t>(front + kAtLayers);
  n_experts_ = int(load<uint32_t>(front + kAtExperts));
  source_id_ = load<uint64_t>(front + kAtSourceId);
  const Geometry g = geometry(n_layers, uint64_t(n_experts_));
  if (front_size < g.index_end)
    fail(f, ": tables end at ", g.index_end, ", past the end of the file");
  if (load<uint64_t>(front + kAtTablesChecksum) !=
      checksum(front + g.layers_offset, size_t(g.index_end - g.layers_offset)))
    fail(f,
         ": layer table / index checksum mismatch (the pack is damaged; remake it with `strata "
         "pack`)");

  layouts_.reserve(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) {
    layouts_.push_back(parse_layout(front + g.layers_offset + l * kLayerEntryBytes, f, int(l)));
    max_record_bytes_ = std::max(max_record_bytes_, layouts_.back().record_bytes);
  }

  const size_t n_records = size_t(n_layers) * size_t(n_experts_);
  records_.resize(n_records);
  std::vector<uint32_t> by_offset(n_records);
  for (size_t i = 0; i < n_records; ++i) {
    const uint8_t* e = front + g.index_offset + i * kIndexEntryBytes;
    Record& r = records_[i];
    r.offset = load<uint64_t>(e);
    r.length = load<uint64_t>(e + 8);
    r.checksum = load<uint64_t>(e + 16);
    const size_t layer = i / size_t(n_experts_), expert = i % size_t(n_experts_);
    const auto where = [&] { return cat(f, ": record (layer ", layer, ", expert ", expert, ")"); };
    if (r.length != layouts_[layer].record_bytes)
      fail(where(), ": length ", r.length, ", but the layer's records are ",
           layouts_[layer].record_bytes, " bytes");
    if (r.offset % kPackAlignment != 0)
      fail(where(), ": offset ", r.offset, " is not a multiple of ", kPackAlignment);
    if (r.offset < g.data_offset)
      fail(where(), ": offset ", r.offset, " lies inside the tables (data starts at ",
           g.data_offset, ")");
    if (r.offset > file_size_ || r.length > file_size_ - r.offset)
      fail(where(), ": bytes [", r.offset, ", ", r.offset + r.length,
           ") run past the end of the file (", file_size_, " bytes; truncated?)");
    by_offset[i] = uint32_t(i);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [&](uint32_t a, uint32_t b) { return records_[a].offset < records_[b].offset; });
  for (size_t k = 1; k < n_records; ++k) {
    const Record& a = records_[by_offset[k - 1]];
    const Record& b = records_[by_offset[k]];
    if (a.offset + a.length > b.offset)
      fail(f, ": records (layer ", by_offset[k - 1] / uint32_t(n_experts_), ", expert ",
           by_offset[k - 1] % uint32_t(n_experts_), ") and (layer ",
           by_offset[k] / uint32_t(n_experts_), ", expert ", by_offset[k] % uint32_t(n_experts_),
           ") overlap at offset ", b.offset);
  }
}

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  data_ =
      static_cast<uint8_t*>(std::aligned_alloc(kPackAlignment, align_up(bytes, kPackAlignment)));
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, bytes);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

}  // namespace strata::experts
