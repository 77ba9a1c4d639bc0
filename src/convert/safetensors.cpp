#include "convert/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"

namespace strata::convert {

namespace {

using nlohmann::json;

// Deepest JSON nesting a valid header needs: {name: {shape: [..]}} is 3.
constexpr int kMaxJsonDepth = 8;
constexpr size_t kMaxDims = 8;

struct DTypeInfo {
  const char* name;
  DType type;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {"F32", DType::F32, 4},         {"F16", DType::F16, 2}, {"BF16", DType::BF16, 2},
    {"F8_E4M3", DType::F8_E4M3, 1}, {"I64", DType::I64, 8}, {"I32", DType::I32, 4},
};

DType parse_dtype(const std::string& s, const std::string& where) {
  for (const auto& d : kDTypes)
    if (s == d.name) return d.type;
  fail(where, ": dtype ", s, " is not supported (supported: F32, F16, BF16, F8_E4M3, I64, I32)");
}

uint64_t get_u64(const json& v, const std::string& where, const char* what) {
  if (!v.is_number_unsigned()) fail(where, ": ", what, " must be a non-negative integer");
  return v.get<uint64_t>();
}

json parse_header(const uint8_t* p, size_t n, const std::string& path) {
  const json::parser_callback_t depth_guard = [&](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth) fail(path, ": header JSON nests deeper than ", kMaxJsonDepth);
    return true;
  };
  try {
    return json::parse(p, p + n, depth_guard);
  } catch (const json::exception& e) {
    fail(path, ": header is not valid JSON (", e.what(), ")");
  }
}

}  // namespace

const char* dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

int64_t StTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string StTensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, ": cannot stat: ", std::strerror(err));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = uint64_t(st.st_size);
  if (f->size_ > 0) {
    void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(path, ": cannot map: ", std::strerror(err));
    }
    f->mapping_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  f->parse();
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::from_memory(const uint8_t* data, size_t size,
                                                              std::string name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = std::move(name);
  f->base_ = data;
  f->size_ = size;
  f->parse();
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) munmap(mapping_, size_);
}

void SafetensorsFile::parse() {
  const std::string& p = path_;
  if (size_ < 8) fail(p, ": truncated: ", size_, " bytes, a safetensors file starts with an 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base_[i];
  if (header_len > kMaxHeaderBytes)
    fail(p, ": header length ", header_len, " exceeds the ", kMaxHeaderBytes, "-byte limit (corrupt file?)");
  if (header_len > size_ - 8)
    fail(p, ": header length ", header_len, " runs past the end of the file (", size_, " bytes): truncated?");
  const json header = parse_header(base_ + 8, size_t(header_len), p);
  if (!header.is_object()) fail(p, ": header must be a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size_ - data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = cat(p, ": tensor ", name);
    if (name.empty()) fail(p, ": a tensor has an empty name");
    if (!entry.is_object()) fail(where, ": entry must be an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) fail(where, ": missing dtype");
    if (!entry.contains("shape") || !entry["shape"].is_array()) fail(where, ": missing shape");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2)
      fail(where, ": data_offsets must be [begin, end]");
    StTensor t;
    t.name = name;
    t.dtype = parse_dtype(entry["dtype"].get<std::string>(), where);
    if (entry["shape"].size() > kMaxDims) fail(where, ": ", entry["shape"].size(), " dims (at most ", kMaxDims, ")");
    for (const auto& d : entry["shape"]) {
      const uint64_t v = get_u64(d, where, "every shape dim");
      if (v > uint64_t(INT64_MAX)) fail(where, ": shape dim ", v, " is out of range");
      t.shape.push_back(int64_t(v));
    }
    // Elements x dtype size, refusing anything past the data section before it can overflow.
    uint64_t bytes = 0;
    if (std::find(t.shape.begin(), t.shape.end(), 0) == t.shape.end()) {
      bytes = dtype_size(t.dtype);
      for (int64_t v : t.shape) {
        if (bytes > data_size / uint64_t(v))
          fail(where, ": shape ", t.shape_string(), " needs more bytes than the data section holds (", data_size, ")");
        bytes *= uint64_t(v);
      }
    }
    const uint64_t begin = get_u64(entry["data_offsets"][0], where, "data_offsets[0]");
    const uint64_t end = get_u64(entry["data_offsets"][1], where, "data_offsets[1]");
    if (begin > end) fail(where, ": data_offsets [", begin, ", ", end, "] are reversed");
    if (end > data_size)
      fail(where, ": data_offsets [", begin, ", ", end, "] run past the data section (", data_size, " bytes): truncated?");
    if (end - begin != bytes)
      fail(where, ": data_offsets span ", end - begin, " bytes, but ", dtype_name(t.dtype), " ",
           t.shape_string(), " needs ", bytes);
    t.data = base_ + data_start + begin;
    t.nbytes = bytes;
    t.file = &path_;
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const StTensor& a, const StTensor& b) { return a.data < b.data || (a.data == b.data && a.nbytes < b.nbytes); });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const StTensor& a = tensors_[i - 1];
    const StTensor& b = tensors_[i];
    if (a.nbytes > 0 && b.nbytes > 0 && a.data + a.nbytes > b.data)
      fail(p, ": tensors ", a.name, " and ", b.name, " overlap in the data section");
  }
}

Checkpoint Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint c;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail(index.string(), ": not valid JSON (", e.what(), ")");
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index.string(), ": missing the weight_map object");
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail(index.string(), ": weight_map entry ", name, " is not a file name");
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "..")
        fail(index.string(), ": weight_map entry ", name, " names a file outside the folder: ", f);
      shards.insert(f);
    }
    for (const auto& f : shards) c.add(SafetensorsFile::open((fs::path(dir) / f).string()));
    for (const auto& [name, file] : j["weight_map"].items()) {
      const StTensor* t = c.find(name);
      const std::string want = (fs::path(dir) / file.get<std::string>()).string();
      if (!t) fail(index.string(), ": tensor ", name, " is listed in ", file.get<std::string>(), " but not found there");
      if (*t->file != want)
        fail(index.string(), ": tensor ", name, " is listed in ", file.get<std::string>(), " but found in ", *t->file);
    }
    return c;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(single))
    fail(dir, ": no model.safetensors or model.safetensors.index.json (is this a Hugging Face model folder?)");
  c.add(SafetensorsFile::open(single.string()));
  return c;
}

void Checkpoint::add(std::unique_ptr<SafetensorsFile> file) {
  for (const auto& t : file->tensors()) {
    const auto [it, fresh] = by_name_.emplace(t.name, &t);
    if (!fresh) fail("tensor ", t.name, " is in both ", *it->second->file, " and ", file->path());
  }
  files_.push_back(std::move(file));
}

const StTensor* Checkpoint::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : by_name_) n += t->nbytes;
  return n;
}

}  // namespace strata::convert
