// Hugging Face safetensors checkpoints, read-only and zero-copy: a file is an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, __metadata__},
// then the data section the offsets point into. open() maps the file and validates every entry
// up front (dtype known, offsets inside the data section and in order, size = elements x dtype
// size, no two tensors overlapping), so the views it hands out can be trusted. A checkpoint is one
// model.safetensors or the shards a model.safetensors.index.json lists.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace strata::convert {

enum class DType { F32, F16, BF16, F8_E4M3, I64, I32 };
const char* dtype_name(DType t);
size_t dtype_size(DType t);

struct StTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // torch order: the last dim is contiguous
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  const std::string* file = nullptr;  // the file it lives in, for messages

  int64_t n_elements() const;
  std::string shape_string() const;  // "[128, 64]"
};

// The longest JSON header accepted: real checkpoints have a few MiB at most (a 512-expert layer
// of per-expert tensors is ~100k entries); a larger length is a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = 256ull << 20;

class SafetensorsFile {
 public:
  // Maps and validates path. Throws strata::Error("FILE: problem").
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Validates an in-memory image (fuzzing, tests); `data` must outlive the object.
  static std::unique_ptr<SafetensorsFile> from_memory(const uint8_t* data, size_t size,
                                                      std::string name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }  // in data order

 private:
  SafetensorsFile() = default;
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;
  std::vector<StTensor> tensors_;
};

// All tensors of a checkpoint folder by name.
class Checkpoint {
 public:
  // dir/model.safetensors.index.json (its weight_map names every tensor's shard; each listed
  // tensor must be in that shard) or else dir/model.safetensors. A name in two shards is an error.
  static Checkpoint open(const std::string& dir);

  const StTensor* find(const std::string& name) const;
  const std::map<std::string, const StTensor*>& tensors() const { return by_name_; }
  uint64_t total_bytes() const;

 private:
  void add(std::unique_ptr<SafetensorsFile> file);

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const StTensor*> by_name_;
};

}  // namespace strata::convert
