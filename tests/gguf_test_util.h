// Helpers for the GGUF tests: a scratch directory, whole-file I/O and a byte builder for
// hand-made (and deliberately broken) GGUF images.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::gguf::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "strata-gguf-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// Little-endian GGUF pieces, appended in order.
struct Bytes {
  std::vector<uint8_t> b;

  template <typename T>
  Bytes& raw(T x) {
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    b.insert(b.end(), p, p + sizeof x);
    return *this;
  }
  Bytes& u8(uint8_t x) { return raw(x); }
  Bytes& u32(uint32_t x) { return raw(x); }
  Bytes& u64(uint64_t x) { return raw(x); }
  Bytes& i64(int64_t x) { return raw(x); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(kMagic).u32(version).u64(n_tensors).u64(n_kv);
  }
  Bytes& kv_u32(const std::string& key, uint32_t v) {
    return str(key).u32(uint32_t(ValueType::U32)).u32(v);
  }
  Bytes& kv_str(const std::string& key, const std::string& v) {
    return str(key).u32(uint32_t(ValueType::STRING)).str(v);
  }
  Bytes& tensor(const std::string& name, std::vector<int64_t> shape, uint32_t type,
                uint64_t offset) {
    str(name).u32(uint32_t(shape.size()));
    for (int64_t d : shape) i64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t alignment = kDefaultAlignment) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

inline ::testing::AssertionResult contains(const char* hay_expr, const char* needle_expr,
                                          const std::string& hay, const std::string& needle) {
  if (hay.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << hay_expr << " is \"" << hay << "\"\n  expected it to "
                                       << "contain " << needle_expr << " = \"" << needle << "\"";
}

#define EXPECT_CONTAINS(hay, needle) \
  EXPECT_PRED_FORMAT2(::strata::gguf::testing::contains, hay, needle)

// The message of the strata::Error that parsing `bytes` throws, or "" if it parses.
inline std::string parse_error(const std::vector<uint8_t>& bytes, const char* name = "t.gguf") {
  try {
    Reader::from_memory(bytes.data(), bytes.size(), name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace strata::gguf::testing
