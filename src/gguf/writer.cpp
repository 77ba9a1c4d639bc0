// Streaming GGUF v3 writer: header and tensor table first, then tensor data in declaration order,
// through one large buffer so that tens of GB go out at disk speed.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF is little-endian");

namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;

bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

uint64_t align_up(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  if (n) std::memcpy(out.data() + at, p, n);
}

template <typename T>
void put_raw(std::vector<uint8_t>& out, T x) {
  put_bytes(out, &x, sizeof x);
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put_raw<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

// The value's bytes without its own type tag (array elements carry none).
void put_payload(std::vector<uint8_t>& out, const Value& v) {
  switch (v.type()) {
    case ValueType::U8: put_raw(out, uint8_t(v.as_u64())); break;
    case ValueType::I8: put_raw(out, int8_t(v.as_i64())); break;
    case ValueType::U16: put_raw(out, uint16_t(v.as_u64())); break;
    case ValueType::I16: put_raw(out, int16_t(v.as_i64())); break;
    case ValueType::U32: put_raw(out, uint32_t(v.as_u64())); break;
    case ValueType::I32: put_raw(out, int32_t(v.as_i64())); break;
    case ValueType::U64: put_raw(out, uint64_t(v.as_u64())); break;
    case ValueType::I64: put_raw(out, int64_t(v.as_i64())); break;
    case ValueType::F32: put_raw(out, float(v.as_f64())); break;
    case ValueType::F64: put_raw(out, double(v.as_f64())); break;
    case ValueType::BOOL: put_raw(out, uint8_t(v.as_bool() ? 1 : 0)); break;
    case ValueType::STRING: put_string(out, v.as_string()); break;
    case ValueType::ARRAY: {
      const auto& items = v.as_array();
      put_raw(out, uint32_t(v.elem_type()));
      put_raw<uint64_t>(out, items.size());
      for (const Value& item : items) put_payload(out, item);
      break;
    }
  }
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

Writer::Writer(std::string path, size_t alignment)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), alignment_(kDefaultAlignment) {
  if (!is_power_of_two(alignment) || alignment > std::numeric_limits<uint32_t>::max())
    fail(path_, ": alignment ", alignment, " is not a power of two that fits u32");
  if (alignment != kDefaultAlignment) set("general.alignment", Value::u32(uint32_t(alignment)));
}

Writer::~Writer() {
  if (fd_ >= 0) ::close(fd_);
  if (data_started_ && !finished_) ::unlink(tmp_path_.c_str());
}

void Writer::set(std::string key, Value value) {
  if (data_started_) fail(path_, ": metadata ", key, " set after begin_data()");
  if (key.empty()) fail(path_, ": metadata key is empty");
  if (key == "general.alignment") {
    if (value.type() != ValueType::U32)
      fail(path_, ": metadata general.alignment must be u32, not ", value_type_name(value.type()));
    if (!is_power_of_two(value.as_u64()))
      fail(path_, ": metadata general.alignment ", value.as_u64(), " is not a power of two");
    alignment_ = size_t(value.as_u64());
  }
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

void Writer::add_tensor(std::string name, quant::Type type, std::vector<int64_t> shape) {
  if (data_started_) fail(path_, ": tensor '", name, "' added after begin_data()");
  if (name.empty()) fail(path_, ": tensor name is empty");
  if (name.size() > kMaxTensorName)
    fail(path_, ": tensor '", name, "': name is ", name.size(), " bytes, the limit is ",
         kMaxTensorName);
  if (!names_.insert(name).second) fail(path_, ": tensor '", name, "' declared twice");
  TensorInfo t;
  try {
    t.nbytes = tensor_nbytes(type, shape);
  } catch (const Error& e) {
    names_.erase(name);
    fail(path_, ": tensor '", name, "': ", e.what());
  }
  t.name = std::move(name);
  t.type = type;
  t.shape = std::move(shape);
  tensors_.push_back(std::move(t));
}

uint64_t Writer::total_data_bytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors_) total += align_up(t.nbytes, alignment_);
  return total;
}

void Writer::begin_data() {
  if (data_started_) fail(path_, ": begin_data() called twice");
  uint64_t offset = 0;
  for (auto& t : tensors_) {
    if (t.nbytes > std::numeric_limits<uint64_t>::max() - alignment_ - offset)
      fail(path_, ": tensor '", t.name, "': the data section would exceed 2^64 bytes");
    t.offset = offset;
    offset = align_up(offset + t.nbytes, alignment_);
  }

  std::vector<uint8_t> header;
  put_raw(header, kMagic);
  put_raw(header, kVersion);
  put_raw<uint64_t>(header, tensors_.size());
  put_raw<uint64_t>(header, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    put_string(header, key);
    put_raw(header, uint32_t(value.type()));
    try {
      put_payload(header, value);
    } catch (const Error& e) {
      fail(path_, ": metadata ", key, ": ", e.what());
    }
  }
  for (const auto& t : tensors_) {
    put_string(header, t.name);
    put_raw(header, uint32_t(t.shape.size()));
    for (int64_t d : t.shape) put_raw(header, d);
    put_raw(header, uint32_t(t.type));
    put_raw(header, t.offset);
  }

  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(tmp_path_, ": cannot create: ", errno_text());
  data_started_ = true;
  buffer_.reserve(kBufferBytes);
  put(header.data(), header.size());
  pad_to_alignment();
}

void Writer::write(const void* data, size_t nbytes) {
  if (!data_started_) fail(path_, ": write() before begin_data()");
  if (finished_) fail(path_, ": write() after finish()");
  if (current_ == tensors_.size()) {
    if (nbytes == 0) return;
    fail(path_, ": write() of ", nbytes, " bytes after the last tensor was complete");
  }
  const TensorInfo& t = tensors_[current_];
  const uint64_t left = t.nbytes - current_written_;
  if (nbytes > left)
    fail(path_, ": tensor '", t.name, "': chunk of ", nbytes, " bytes but only ", left,
         " bytes of the tensor remain (a chunk may not span tensors)");
  put(data, nbytes);
  current_written_ += nbytes;
  if (current_written_ == t.nbytes) {
    pad_to_alignment();
    ++current_;
    current_written_ = 0;
  }
}

void Writer::finish() {
  if (finished_) fail(path_, ": finish() called twice");
  if (!data_started_) begin_data();
  if (current_ < tensors_.size()) {
    const TensorInfo& t = tensors_[current_];
    fail(path_, ": finish() with tensor '", t.name, "' at ", current_written_, " of ", t.nbytes,
         " bytes (", tensors_.size() - current_, " of ", tensors_.size(),
         " tensors incomplete)");
  }
  flush_buffer();
  if (::fsync(fd_) != 0) fail(tmp_path_, ": fsync failed: ", errno_text());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(tmp_path_, ": close failed: ", errno_text());
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    fail(path_, ": cannot rename ", tmp_path_, " into place: ", errno_text());
  finished_ = true;
  // Makes the rename itself durable; filesystems that cannot fsync a directory lose nothing else.
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void Writer::put(const void* data, size_t nbytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  position_ += nbytes;
  if (buffer_.size() + nbytes <= kBufferBytes) {
    buffer_.insert(buffer_.end(), p, p + nbytes);
    return;
  }
  flush_buffer();
  if (nbytes < kBufferBytes) {
    buffer_.insert(buffer_.end(), p, p + nbytes);
    return;
  }
  // A large chunk goes straight to the file: copying it through the buffer would only cost time.
  while (nbytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min(nbytes, size_t(1) << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(tmp_path_, ": write failed: ", errno_text());
    }
    p += n;
    nbytes -= size_t(n);
  }
}

void Writer::flush_buffer() {
  const uint8_t* p = buffer_.data();
  size_t left = buffer_.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(tmp_path_, ": write failed: ", errno_text());
    }
    p += n;
    left -= size_t(n);
  }
  buffer_.clear();
}

void Writer::pad_to_alignment() {
  static const uint8_t kZeros[4096] = {};
  uint64_t pad = align_up(position_, alignment_) - position_;
  while (pad > 0) {
    const size_t n = size_t(std::min<uint64_t>(pad, sizeof kZeros));
    put(kZeros, n);
    pad -= n;
  }
}

}  // namespace strata::gguf
