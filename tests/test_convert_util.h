// Helpers for the safetensors and convert tests: a scratch folder, a safetensors writer (for
// hand-made and deliberately broken files) and edited copies of the reference fixtures.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "convert/safetensors.h"

namespace strata::convert::testing {

namespace fs = std::filesystem;

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "strata-convert-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct Entry {
  std::string name;
  std::string dtype;  // "F32", "F8_E4M3", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

inline std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The 8-byte little-endian length n, then the header's bytes. (Sized once and copied: GCC 12 warned
// -Warray-bounds, falsely, on inserting the header after an 8-byte vector.)
inline std::vector<uint8_t> length_prefixed(uint64_t n, const std::string& header) {
  std::vector<uint8_t> out(8 + header.size());
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

// A safetensors image: 8-byte length, the header JSON, the data in entry order.
inline std::vector<uint8_t> safetensors_image(const std::vector<Entry>& entries) {
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const auto& e : entries) {
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + e.data.size()}}};
    off += e.data.size();
  }
  const std::string js = h.dump();
  std::vector<uint8_t> out = length_prefixed(js.size(), js);
  for (const auto& e : entries) out.insert(out.end(), e.data.begin(), e.data.end());
  return out;
}

// A raw image from a header string and data bytes (for broken headers).
inline std::vector<uint8_t> raw_image(const std::string& header, size_t data_bytes, uint64_t len_override = 0) {
  std::vector<uint8_t> out = length_prefixed(len_override ? len_override : header.size(), header);
  out.resize(out.size() + data_bytes);
  return out;
}

inline std::vector<Entry> read_entries(const std::string& path) {
  const auto f = SafetensorsFile::open(path);
  std::vector<Entry> out;
  for (const auto& t : f->tensors())
    out.push_back({t.name, dtype_name(t.dtype), t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
  return out;
}

inline fs::path fixture_dir(const std::string& name) { return fs::path(STRATA_SOURCE_DIR) / "tests/fixtures" / name; }

// Copies a fixture's config.json and model.safetensors into dst, editing both on the way.
inline void edited_fixture(const std::string& name, const fs::path& dst,
                           const std::function<void(std::vector<Entry>&)>& edit_tensors,
                           const std::function<void(nlohmann::json&)>& edit_config = {}) {
  fs::create_directories(dst);
  auto entries = read_entries((fixture_dir(name) / "model.safetensors").string());
  if (edit_tensors) edit_tensors(entries);
  write_file((dst / "model.safetensors").string(), safetensors_image(entries));
  auto config = nlohmann::json::parse(read_text((fixture_dir(name) / "config.json").string()));
  if (edit_config) edit_config(config);
  std::ofstream((dst / "config.json").string()) << config.dump(2);
}

}  // namespace strata::convert::testing
