// The `.experts` pack: every routed expert of a model as one contiguous, 4 KiB-aligned record per
// (layer, expert) holding its gate|up|down matrices, so one O_DIRECT read fetches one expert
// (docs/DESIGN.md, "Files"). docs/PACK.md describes the format byte by byte.
//
// Pack: opens and validates a pack (header, per-layer layouts, the record index) up front, so code
// holding a Pack may trust every offset, length and shape it returns. Any problem is one
// strata::Error naming the file and the problem. Record bytes are not read here: ExpertReader
// (expert_reader.h) reads and checks them.
//
// PackWriter: streams records in (layer, expert) order into PATH.tmp and renames it to PATH only
// when finish() succeeds; the header is written last, so an interrupted pack never looks valid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "quant/types.h"

namespace strata::gguf {
class Reader;
}

namespace strata::model {
struct ModelConfig;
}

namespace strata::experts {

// Records start on, and are padded to, this boundary (O_DIRECT reads exactly one record).
constexpr uint64_t kPackAlignment = 4096;
// Each matrix starts on this boundary inside its record.
constexpr uint64_t kPartAlignment = 64;
// Metadata keys of a trunk-only GGUF (strata synth --pack) whose experts live only in a pack:
// the pack's file name (relative to the GGUF's folder) and the pack's source id.
inline constexpr const char* kPackKey = "strata.experts.pack";
inline constexpr const char* kSourceIdKey = "strata.experts.source_id";

// One matrix of an expert inside its record: `rows` outputs of `cols` inputs (ne0 = cols), rows
// `row_stride` bytes apart starting `offset` bytes into the record.
struct Part {
  quant::Type type = quant::Type::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_stride = 0;
  uint64_t offset = 0;

  uint64_t bytes() const { return uint64_t(rows) * row_stride; }
  backend::Weight weight(const uint8_t* record) const {
    return {type, record + offset, cols, rows, row_stride};
  }
};

// The record layout of one layer (all experts of a layer share it).
struct Layout {
  // gate, up: [n_ff_exp rows, n_embd cols]; down: [n_embd rows, n_ff_exp cols].
  Part gate, up, down;
  uint64_t record_bytes = 0;  // padded to kPackAlignment

  // 0 gate, 1 up, 2 down.
  const Part& part(int i) const { return i == 0 ? gate : i == 1 ? up : down; }

  // The expert's weights as views into a record's bytes (e.g. an arena slot).
  backend::ExpertWeights weights(const uint8_t* record) const {
    return {gate.weight(record), up.weight(record), down.weight(record)};
  }
};

// "gate", "up", "down" for part 0, 1, 2, and the GGUF stack the part comes from:
// blk.LAYER.ffn_{gate,up,down}_exps.weight.
const char* part_name(int part);
std::string expert_stack_name(int layer, int part);

// Packs gate, up, down (type, rows, cols given; row_stride, offsets and record_bytes filled in)
// back to back at kPartAlignment, the record padded to kPackAlignment. Throws on a shape the
// type's block does not divide.
Layout make_layout(Part gate, Part up, Part down);

// Where one (layer, expert) record lies in the file; `checksum` is XXH3-64 of all `length` bytes
// (padding included).
struct Record {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
};

class Pack {
 public:
  // Opens and validates path. Throws strata::Error("PATH: problem").
  static std::unique_ptr<Pack> open(const std::string& path);
  // Validates an in-memory image (fuzzing, tests); the records are checked against `size` as the
  // file size. fd() is -1. `data` need only live during the call.
  static std::unique_ptr<Pack> from_memory(const uint8_t* data, size_t size, std::string name);
  ~Pack();
  Pack(const Pack&) = delete;
  Pack& operator=(const Pack&) = delete;

  int n_layers() const { return int(layouts_.size()); }
  int n_experts() const { return n_experts_; }
  const Layout& layout(int layer) const;              // throws on a layer out of range
  const Record& record(int layer, int expert) const;  // throws on ids out of range
  // XXH3-64 of `record(layer, expert).length` bytes equals the stored checksum.
  bool checksum_ok(int layer, int expert, const void* bytes) const;
  // The identity of the model the pack was made from (see model_source_id).
  uint64_t source_id() const { return source_id_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t max_record_bytes() const { return max_record_bytes_; }
  uint64_t data_bytes() const;  // sum of every record's length

  // Opened read-only, buffered; ExpertReader opens its own O_DIRECT descriptor on path().
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  // Checks the pack holds the experts of `model` (config `c`): counts and shapes from the config,
  // and, when the GGUF has its own expert stacks, their types and shapes and the source id; when
  // it is a trunk-only GGUF, its kSourceIdKey. Throws strata::Error saying what differs and how
  // to remake the pack.
  void check_model(const gguf::Reader& model, const model::ModelConfig& c) const;

 private:
  Pack() = default;
  // Validates the header against file_size_; returns where the index ends.
  uint64_t parse_header_end(const uint8_t* header) const;
  void parse(const uint8_t* front, size_t front_size);

  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  int n_experts_ = 0;
  uint64_t source_id_ = 0;
  uint64_t max_record_bytes_ = 0;
  std::vector<Layout> layouts_;
  std::vector<Record> records_;  // layer-major
};

// XXH3-64, the record checksum.
uint64_t checksum(const void* bytes, size_t n);

// The expert stacks (blk.L.ffn_{gate,up,down}_exps.weight) of a GGUF as pack layouts: one per
// block, blocks 0..L-1 all present. Throws naming the GGUF and the missing / inconsistent stack.
struct ExpertShape {
  int n_experts = 0;
  std::vector<Layout> layers;
};
ExpertShape expert_shape(const gguf::Reader& model);
bool has_expert_stacks(const gguf::Reader& model);

// A model's identity as a pack records it: XXH3-64 over, per layer and part, the type, rows,
// cols and expert count, then the first min(part bytes, 4096) bytes of expert 0's part
// (docs/PACK.md). Stable across copies, renames and touches of the file; differs when the expert
// tensors' types, shapes or contents (a different seed, a requantisation) differ.
uint64_t model_source_id(const gguf::Reader& model);

// The pack a model uses: `explicit_path` if not empty; else the GGUF's kPackKey (relative to the
// GGUF's folder); else MODEL.gguf.experts.
std::string pack_path_for(const gguf::Reader& model, const std::string& explicit_path = "");
// Finds (pack_path_for), opens and checks (check_model) the model's pack. A missing pack is an
// error that says how to make it (`strata pack MODEL.gguf`).
std::unique_ptr<Pack> open_model_pack(const gguf::Reader& model, const model::ModelConfig& c,
                                      const std::string& explicit_path = "");

class PackWriter {
 public:
  // Records follow in (layer, expert) order, each layer's record_bytes long.
  PackWriter(std::string path, std::vector<Layout> layouts, int n_experts);
  ~PackWriter();  // removes PATH.tmp unless finish() succeeded
  PackWriter(const PackWriter&) = delete;
  PackWriter& operator=(const PackWriter&) = delete;

  // The next record: layout(layer).record_bytes bytes, gate|up|down at the layout's offsets, zero
  // elsewhere (checked, so padding never carries stray bytes).
  void append(const uint8_t* record);
  // Writes the index and header, fsyncs and renames PATH.tmp to PATH. Every record must be there.
  void finish();

  uint64_t source_id() const;    // valid once every layer's expert 0 was appended
  uint64_t total_bytes() const;  // the size the finished file has
  const std::string& path() const { return path_; }

 private:
  struct State;
  std::string path_;
  std::unique_ptr<State> state_;
};

// strata pack MODEL.gguf: streams the GGUF's expert stacks into `out`. `progress` gets bytes as
// they are written (may be empty).
struct PackReport {
  uint64_t bytes = 0;
  double seconds = 0;
  uint64_t source_id = 0;
};
PackReport write_pack(const gguf::Reader& model, const std::string& out,
                      const std::function<void(uint64_t)>& progress = {});

// strata pack --verify: reads every record (O_DIRECT where the filesystem allows) and checks its
// checksum and its zero padding, and with `model` that its parts equal the GGUF's slices. Throws
// strata::Error naming the first bad record by layer, expert and offset.
struct VerifyReport {
  uint64_t records = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};
VerifyReport verify_pack(const Pack& pack, const gguf::Reader* model,
                         const std::function<void(uint64_t)>& progress = {});

// 4 KiB-aligned heap bytes (O_DIRECT buffers); zeroed.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace strata::experts
