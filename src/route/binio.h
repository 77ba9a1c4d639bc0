// Little-endian byte encoding for the small route files (traces, usage history, expert profile):
// a growable writer, a bounds-checked reader whose errors name the file and the field, whole-file
// reads and atomic replacement (temp file, fsync, rename), so a crash never leaves half a file.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "util/error.h"

namespace strata::route {

static_assert(std::endian::native == std::endian::little, "route files are little-endian");

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <typename T>
  void put_all(std::span<const T> values) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(values.data());
    bytes_.insert(bytes_.end(), p, p + values.size_bytes());
  }
  // u32 length, then the bytes.
  void put_string(const std::string& s);
  std::vector<uint8_t>& bytes() { return bytes_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  // `source` names the file in every error.
  ByteReader(std::span<const uint8_t> bytes, std::string source)
      : bytes_(bytes), source_(std::move(source)) {}

  template <typename T>
  T get(const char* field) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  // A u32 length (at most max_len) and that many bytes.
  std::string get_string(const char* field, uint32_t max_len);
  std::span<const uint8_t> take(size_t n, const char* field);

  size_t offset() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }
  const std::string& source() const { return source_; }

  template <typename... Parts>
  [[noreturn]] void fail_at(Parts&&... parts) const {
    fail(source_, ": ", std::forward<Parts>(parts)..., " (at byte ", pos_, ")");
  }

 private:
  void need(size_t n, const char* field) const;

  std::span<const uint8_t> bytes_;
  std::string source_;
  size_t pos_ = 0;
};

// XXH64 with seed 0.
uint64_t checksum(std::span<const uint8_t> bytes);

// The start of every route file: 8 magic characters and a u32 version.
void put_preamble(ByteWriter& w, std::string_view magic, uint32_t version);
// Throws "SOURCE: not a strata KIND (bad magic)" or "SOURCE: KIND version V (this strata reads N)".
void expect_preamble(ByteReader& in, std::string_view magic, uint32_t version, const char* kind);
// u32 n_layers (1..4096) and u32 n_experts (1..65535), range-checked.
std::pair<int, int> get_shape(ByteReader& in);
// The last field of the history and profile files: the XXH64 of all bytes before it, then the end.
void expect_final_checksum(ByteReader& in, std::span<const uint8_t> all);
// Appends the checksum of everything written and replaces `path` atomically with the result.
void save_with_checksum(ByteWriter& w, const std::string& path, const char* kind);

// The whole file; `kind` ("routing trace", ...) goes into the error when it cannot be read.
std::vector<uint8_t> read_whole_file(const std::string& path, const char* kind);

// Writes `bytes` to path.tmp.PID, fsyncs it, renames it over `path` and syncs the directory:
// readers see the old file or the new one, never a mix, also after a crash at any step. The temp
// file is removed when any step fails (a process killed mid-save can leave it; it is never read).
void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes, const char* kind);

}  // namespace strata::route
