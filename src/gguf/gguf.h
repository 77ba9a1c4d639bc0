// GGUF v3: the container of every model file strata reads or writes.
//
// Reader: maps the file and validates all of it up front (header, metadata, tensor table, every
// offset and size against the file), so code that holds a Reader may trust what it returns.
// Tensor data are zero-copy views into the mapping. Any problem is one strata::Error that names
// the file and what is wrong.
//
// Writer: streams. The tensor table is declared first, the header written, then tensor data are
// appended in declaration order, chunk by chunk, so a model never has to be held in memory. The
// file appears under its name only when finish() succeeds. After an I/O error (disk full) the
// Writer can only be destroyed, which removes the partial file. docs/GGUF.md has the details.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "quant/types.h"

namespace strata::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Integers of every width are held as int64/uint64 but keep their file type,
// so a file rewritten by the Writer has the same bytes.
class Value {
 public:
  Value() = default;
  static Value u8(uint8_t v) { return Value(ValueType::U8, uint64_t(v)); }
  static Value i8(int8_t v) { return Value(ValueType::I8, int64_t(v)); }
  static Value u16(uint16_t v) { return Value(ValueType::U16, uint64_t(v)); }
  static Value i16(int16_t v) { return Value(ValueType::I16, int64_t(v)); }
  static Value u32(uint32_t v) { return Value(ValueType::U32, uint64_t(v)); }
  static Value i32(int32_t v) { return Value(ValueType::I32, int64_t(v)); }
  static Value u64(uint64_t v) { return Value(ValueType::U64, v); }
  static Value i64(int64_t v) { return Value(ValueType::I64, v); }
  static Value f32(float v) { return Value(ValueType::F32, double(v)); }
  static Value f64(double v) { return Value(ValueType::F64, v); }
  static Value boolean(bool v) { return Value(ValueType::BOOL, v); }
  static Value string(std::string v) { return Value(ValueType::STRING, std::move(v)); }
  // An array whose elements all have type elem_type (checked).
  static Value array(ValueType elem_type, std::vector<Value> items);
  static Value strings(const std::vector<std::string>& items);
  static Value i32s(const std::vector<int32_t>& items);
  static Value f32s(const std::vector<float>& items);

  ValueType type() const { return type_; }
  ValueType elem_type() const { return elem_type_; }  // for arrays
  bool is_integer() const;
  bool is_number() const;  // integer or float

  // Checked accessors: throw strata::Error (the caller adds the key name) on a type mismatch or
  // a value out of the target's range.
  uint64_t as_u64() const;
  int64_t as_i64() const;
  double as_f64() const;
  bool as_bool() const;
  const std::string& as_string() const;
  const std::vector<Value>& as_array() const;

  // Human-readable rendering ("[248320 strings]" style summaries for long arrays).
  std::string to_string(size_t max_items = 8) const;

 private:
  using Data = std::variant<std::monostate, uint64_t, int64_t, double, bool, std::string,
                            std::vector<Value>>;
  Value(ValueType t, Data d) : type_(t), data_(std::move(d)) {}
  ValueType type_ = ValueType::U32;
  ValueType elem_type_ = ValueType::U32;
  Data data_;
};

struct TensorInfo {
  std::string name;
  quant::Type type;
  std::vector<int64_t> shape;  // ne[0] first: ne[0] is the contiguous (row) dimension
  uint64_t offset = 0;         // relative to the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping (reader only)

  int64_t n_elements() const;
  int64_t row_elems() const { return shape.empty() ? 1 : shape[0]; }
  int64_t n_rows() const;  // product of ne[1..]
  size_t row_stride() const { return quant::row_bytes(type, row_elems()); }
  std::string shape_string() const;  // "[2560, 248320]"
};

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kVersion = 3;
constexpr size_t kDefaultAlignment = 32;
// Longest tensor name, in bytes: ggml keeps names in char[GGML_MAX_NAME = 64] with a NUL, so a
// longer name would make the file unreadable by llama.cpp. Both Reader and Writer enforce it.
constexpr size_t kMaxTensorName = 63;
constexpr int kMaxDims = 4;
// Deepest nesting of arrays inside arrays the Reader accepts (1 = a plain array).
constexpr int kMaxArrayDepth = 8;

// Checks a tensor shape against its type (1..kMaxDims dims, each > 0, element count within
// int64, ne[0] a multiple of the type's block) and returns the tensor's size in bytes. Throws
// strata::Error saying what is wrong; callers prefix the file and tensor name.
uint64_t tensor_nbytes(quant::Type type, const std::vector<int64_t>& shape);

class Reader {
 public:
  // Maps and validates path. Throws strata::Error("FILE: problem").
  static std::unique_ptr<Reader> open(const std::string& path);
  // Validates an in-memory image (fuzzing, tests); `data` must outlive the Reader.
  static std::unique_ptr<Reader> from_memory(const uint8_t* data, size_t size, std::string name);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }
  const uint8_t* base() const { return base_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  // Throws "FILE: missing metadata key KEY" / "FILE: metadata KEY: expected u32, found string".
  const Value& get(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;
  uint64_t get_u64(std::string_view key, uint64_t fallback) const;
  double get_f64(std::string_view key) const;
  double get_f64(std::string_view key, double fallback) const;
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, std::string fallback) const;
  std::string architecture() const { return get_string("general.architecture"); }

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const TensorInfo& tensor(std::string_view name) const;  // throws naming file and tensor

 private:
  Reader() = default;
  void parse();
  void check_tensor_data();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // non-null when this Reader owns an mmap
  uint32_t version_ = 0;
  size_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<TensorInfo> tensors_;
  // Views into the names held by metadata_ / tensors_, which never reallocate after parse().
  std::unordered_map<std::string_view, size_t> key_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

class Writer {
 public:
  // An alignment other than the default is recorded as general.alignment (u32).
  explicit Writer(std::string path, size_t alignment = kDefaultAlignment);
  ~Writer();  // removes the partial file if finish() was not reached
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Replaces an existing key in place (insertion order is kept). Setting general.alignment (u32,
  // a power of two) changes the alignment. Only before begin_data().
  void set(std::string key, Value value);
  // Declares a tensor; its size follows from type and shape (ne[0] must be a multiple of the
  // type's block). Names must be unique.
  void add_tensor(std::string name, quant::Type type, std::vector<int64_t> shape);

  // Writes header and tensor table; after this only tensor data may be written.
  void begin_data();
  // Appends bytes of the current tensor (declaration order); a tensor may come in many chunks of
  // any size, but one chunk never spans two tensors. The padding after a complete tensor is
  // written here, so the caller only ever supplies tensor bytes.
  void write(const void* data, size_t nbytes);
  // Checks every tensor got exactly its bytes, flushes, fsyncs and renames PATH.tmp to PATH.
  // Calls begin_data() first if it was not called (a file of metadata only).
  void finish();

  // Size of the data section: every tensor padded to the alignment.
  uint64_t total_data_bytes() const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

 private:
  void put(const void* data, size_t nbytes);
  void flush_buffer();
  void pad_to_alignment();

  std::string path_;
  std::string tmp_path_;
  size_t alignment_;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_set<std::string> names_;
  int fd_ = -1;
  std::vector<uint8_t> buffer_;  // pending bytes; large chunks bypass it
  bool data_started_ = false;
  bool finished_ = false;
  size_t current_ = 0;            // tensor being written
  uint64_t current_written_ = 0;  // bytes of it so far
  uint64_t position_ = 0;         // bytes written to the file
};

}  // namespace strata::gguf
