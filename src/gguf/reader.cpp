// GGUF v3 reader: maps the file and validates everything before handing out any view.
//
// Every read goes through a bounds-checked cursor that knows what it is reading, so a truncated
// or hostile file gives an error naming the byte and the item. Every count read from the file
// is checked against the bytes that remain before anything is reserved for it, so memory use is
// bounded by a small multiple of the file size whatever the header claims.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>

#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF is little-endian");

namespace {

// Fewest bytes one metadata entry can take: key length, value type, a one-byte value.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
// Fewest bytes one tensor info can take: name length and a 1-byte name, n_dims, one ne, type,
// offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;
constexpr uint32_t kMaxValueType = uint32_t(ValueType::F64);

bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Bytes one array element of this type takes at least (its exact size for fixed-size types).
uint64_t min_element_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 4 + 8;
  }
  return 1;
}

// A bounds-checked reader over the image that also tracks what it is reading, for messages.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* base, uint64_t size)
      : path_(path), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  // What is being read: section ("metadata key"), item index, item name once known, part.
  void at(const char* section, uint64_t item, const char* part) {
    section_ = section;
    item_ = item;
    name_ = {};
    part_ = part;
    depth_ = 0;
  }
  void named(std::string_view name) { name_ = name; }
  void part(const char* part) { part_ = part; }
  void enter_array() { path_indices_[depth_++] = 0; }
  void set_element(uint64_t i) { path_indices_[depth_ - 1] = i; }
  void leave_array() { --depth_; }
  int depth() const { return depth_; }

  std::string where() const {
    std::string out = section_;
    if (item_ != kNoItem) out += cat(" #", item_);
    if (!name_.empty()) out += cat(" ('", name_, "')");
    out += cat(" ", part_);
    for (int d = 0; d < depth_; ++d) out += cat(d == 0 ? ", element " : ".", path_indices_[d]);
    return out;
  }

  template <typename... Parts>
  [[noreturn]] void error(Parts&&... parts) const {
    fail(path_, ": ", where(), ": ", std::forward<Parts>(parts)...);
  }

  void need(uint64_t n) const {
    if (n > left())
      fail(path_, ": truncated at byte ", pos_, " while reading ", where(), " (need ", n,
           " bytes, ", left(), " left)");
  }

  template <typename T>
  T read() {
    need(sizeof(T));
    T x;
    std::memcpy(&x, base_ + pos_, sizeof x);
    pos_ += sizeof x;
    return x;
  }

  std::string read_string() {
    const auto n = read<uint64_t>();
    if (n > left())
      fail(path_, ": ", where(), ": string length ", n, " exceeds the ", left(),
           " bytes left in the file (at byte ", pos_, ")");
    std::string s(reinterpret_cast<const char*>(base_ + pos_), size_t(n));
    pos_ += n;
    return s;
  }

  static constexpr uint64_t kNoItem = std::numeric_limits<uint64_t>::max();

 private:
  const std::string& path_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const char* section_ = "header";
  uint64_t item_ = kNoItem;
  std::string_view name_;
  const char* part_ = "";
  uint64_t path_indices_[kMaxArrayDepth] = {};
  int depth_ = 0;
};

ValueType read_value_type(Cursor& in) {
  const auto t = in.read<uint32_t>();
  if (t > kMaxValueType) in.error("unknown value type ", t);
  return ValueType(t);
}

Value read_value(Cursor& in, ValueType type) {
  switch (type) {
    case ValueType::U8: return Value::u8(in.read<uint8_t>());
    case ValueType::I8: return Value::i8(in.read<int8_t>());
    case ValueType::U16: return Value::u16(in.read<uint16_t>());
    case ValueType::I16: return Value::i16(in.read<int16_t>());
    case ValueType::U32: return Value::u32(in.read<uint32_t>());
    case ValueType::I32: return Value::i32(in.read<int32_t>());
    case ValueType::U64: return Value::u64(in.read<uint64_t>());
    case ValueType::I64: return Value::i64(in.read<int64_t>());
    case ValueType::F32: return Value::f32(in.read<float>());
    case ValueType::F64: return Value::f64(in.read<double>());
    case ValueType::BOOL: {
      const auto b = in.read<uint8_t>();
      if (b > 1) in.error("bool byte is ", int(b), " (must be 0 or 1)");
      return Value::boolean(b != 0);
    }
    case ValueType::STRING: return Value::string(in.read_string());
    case ValueType::ARRAY: {
      if (in.depth() >= kMaxArrayDepth)
        in.error("arrays nested deeper than ", kMaxArrayDepth, " levels");
      const ValueType elem = read_value_type(in);
      const auto n = in.read<uint64_t>();
      const uint64_t min_bytes = min_element_bytes(elem);
      if (n > in.left() / min_bytes) {
        const bool wraps = n > std::numeric_limits<uint64_t>::max() / min_bytes;
        in.error("array of ", n, " ", value_type_name(elem), " elements needs at least ",
                 wraps ? std::string("2^64") : std::to_string(n * min_bytes), " bytes but only ",
                 in.left(), " are left in the file");
      }
      std::vector<Value> items;
      items.reserve(size_t(n));
      in.enter_array();
      for (uint64_t i = 0; i < n; ++i) {
        in.set_element(i);
        items.push_back(read_value(in, elem));
      }
      in.leave_array();
      return Value::array(elem, std::move(items));
    }
  }
  in.error("unknown value type ", uint32_t(type));
}

std::string magic_text(uint32_t magic) {
  std::string out;
  for (int i = 0; i < 4; ++i) {
    const char c = char((magic >> (8 * i)) & 0xff);
    out += (c >= 0x20 && c < 0x7f) ? c : '.';
  }
  return out;
}

}  // namespace

std::unique_ptr<Reader> Reader::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, ": cannot stat: ", std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    fail(path, ": is a directory, not a GGUF file");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    fail(path, ": empty file, not GGUF");
  }
  std::unique_ptr<Reader> r(new Reader());
  r->path_ = path;
  r->size_ = uint64_t(st.st_size);
  void* m = ::mmap(nullptr, size_t(r->size_), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (m == MAP_FAILED) fail(path, ": cannot map ", r->size_, " bytes: ", std::strerror(err));
  r->mapping_ = m;
  r->base_ = static_cast<const uint8_t*>(m);
  r->parse();
  return r;
}

std::unique_ptr<Reader> Reader::from_memory(const uint8_t* data, size_t size, std::string name) {
  std::unique_ptr<Reader> r(new Reader());
  r->path_ = std::move(name);
  r->base_ = data;
  r->size_ = size;
  if (size == 0) fail(r->path_, ": empty file, not GGUF");
  r->parse();
  return r;
}

Reader::~Reader() {
  if (mapping_) ::munmap(mapping_, size_t(size_));
}

void Reader::parse() {
  Cursor in(path_, base_, size_);
  in.at("header", Cursor::kNoItem, "magic");
  const auto magic = in.read<uint32_t>();
  if (magic != kMagic)
    fail(path_, ": not a GGUF file (starts with '", magic_text(magic), "', expected 'GGUF')");
  in.part("version");
  version_ = in.read<uint32_t>();
  if (version_ != kVersion) {
    if (version_ == 0x03000000u)  // version 3 written big-endian
      fail(path_, ": big-endian GGUF; only little-endian files are supported");
    if (version_ == 1 || version_ == 2)
      fail(path_, ": GGUF version ", version_, " is not supported (only version 3; ",
           "re-convert the model with a current converter)");
    fail(path_, ": unsupported GGUF version ", version_, " (only version 3 is supported)");
  }
  in.part("tensor count");
  const auto n_tensors = in.read<uint64_t>();
  in.part("metadata key count");
  const auto n_kv = in.read<uint64_t>();
  if (n_kv > in.left() / kMinKvBytes || n_tensors > in.left() / kMinTensorInfoBytes ||
      n_kv * kMinKvBytes + n_tensors * kMinTensorInfoBytes > in.left())
    fail(path_, ": header claims ", n_tensors, " tensors and ", n_kv,
         " metadata keys, more than the remaining ", in.left(), " bytes can hold");

  // Reserved up front so the names that the indexes view never move.
  metadata_.reserve(size_t(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    in.at("metadata key", i, "name");
    std::string key = in.read_string();
    in.named(key);
    if (const auto it = key_index_.find(key); it != key_index_.end())
      in.error("duplicate key (also metadata key #", it->second, ")");
    in.part("value type");
    const ValueType type = read_value_type(in);
    in.part("value");
    Value value = read_value(in, type);
    metadata_.emplace_back(std::move(key), std::move(value));
    key_index_.emplace(metadata_.back().first, i);
  }

  if (const Value* a = find("general.alignment")) {
    if (a->type() != ValueType::U32)
      fail(path_, ": general.alignment must be u32, found ", value_type_name(a->type()));
    if (!is_power_of_two(a->as_u64()))
      fail(path_, ": general.alignment ", a->as_u64(), " is not a power of two");
    alignment_ = size_t(a->as_u64());
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    in.at("tensor info", i, "name");
    TensorInfo t;
    t.name = in.read_string();
    in.named(t.name);
    if (t.name.empty()) in.error("empty tensor name");
    if (t.name.size() > kMaxTensorName)
      in.error("name is ", t.name.size(), " bytes, the limit is ", kMaxTensorName,
               " (ggml's GGML_MAX_NAME)");
    if (const auto it = tensor_index_.find(t.name); it != tensor_index_.end())
      in.error("duplicate tensor name (also tensor info #", it->second, ")");
    in.part("n_dims");
    const auto n_dims = in.read<uint32_t>();
    if (n_dims < 1 || n_dims > uint32_t(kMaxDims))
      in.error("n_dims is ", n_dims, " (must be 1 to ", kMaxDims, ")");
    in.part("shape");
    for (uint32_t d = 0; d < n_dims; ++d) t.shape.push_back(in.read<int64_t>());
    in.part("type");
    const auto type_id = in.read<uint32_t>();
    const auto info = quant::find_type(type_id);
    if (!info) in.error("unknown tensor type id ", type_id);
    t.type = info->type;
    in.part("offset");
    t.offset = in.read<uint64_t>();
    try {
      t.nbytes = tensor_nbytes(t.type, t.shape);
    } catch (const Error& e) {
      fail(path_, ": tensor '", t.name, "': ", e.what());
    }
    if (t.offset % alignment_ != 0)
      fail(path_, ": tensor '", t.name, "': offset ", t.offset, " is not a multiple of the ",
           "alignment ", alignment_);
    tensors_.push_back(std::move(t));
    tensor_index_.emplace(tensors_.back().name, i);
  }

  data_offset_ = (in.pos() + alignment_ - 1) / alignment_ * alignment_;
  check_tensor_data();
}

void Reader::check_tensor_data() {
  const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (auto& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail(path_, ": tensor '", t.name, "': data [offset ", t.offset, ", ", t.nbytes,
           " bytes] ends past end of file (data section starts at ", data_offset_,
           ", file size ", size_, ")");
    t.data = base_ + data_offset_ + t.offset;
  }
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& a = tensors_[order[i - 1]];
    const TensorInfo& b = tensors_[order[i]];
    if (a.offset + a.nbytes > b.offset)
      fail(path_, ": tensors '", a.name, "' [offset ", a.offset, ", ", a.nbytes, " bytes] and '",
           b.name, "' [offset ", b.offset, ", ", b.nbytes, " bytes] overlap");
  }
}

const Value* Reader::find(std::string_view key) const {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

const Value& Reader::get(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail(path_, ": missing metadata key ", key);
  return *v;
}

namespace {
template <typename Fn>
auto checked(const std::string& path, std::string_view key, const Value& v, Fn fn) {
  try {
    return fn(v);
  } catch (const Error& e) {
    fail(path, ": metadata ", key, ": ", e.what());
  }
}
}  // namespace

uint64_t Reader::get_u64(std::string_view key) const {
  return checked(path_, key, get(key), [](const Value& v) { return v.as_u64(); });
}

uint64_t Reader::get_u64(std::string_view key, uint64_t fallback) const {
  const Value* v = find(key);
  return v ? checked(path_, key, *v, [](const Value& x) { return x.as_u64(); }) : fallback;
}

double Reader::get_f64(std::string_view key) const {
  return checked(path_, key, get(key), [](const Value& v) { return v.as_f64(); });
}

double Reader::get_f64(std::string_view key, double fallback) const {
  const Value* v = find(key);
  return v ? checked(path_, key, *v, [](const Value& x) { return x.as_f64(); }) : fallback;
}

std::string Reader::get_string(std::string_view key) const {
  return checked(path_, key, get(key), [](const Value& v) { return v.as_string(); });
}

std::string Reader::get_string(std::string_view key, std::string fallback) const {
  const Value* v = find(key);
  return v ? checked(path_, key, *v, [](const Value& x) { return x.as_string(); })
           : std::move(fallback);
}

const TensorInfo* Reader::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& Reader::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) fail(path_, ": no tensor named '", name, "'");
  return *t;
}

}  // namespace strata::gguf
