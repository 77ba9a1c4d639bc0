// Which Hugging Face tensors feed each GGUF tensor of tensor_specs(config), and how.
//
// Every GGUF tensor is described as a 2-D matrix [rows, cols] with cols = ne0 (the contiguous
// row) and rows = ne1 * ne2 * ..., assembled from rectangular pieces of 2-D views of HF tensors
// (a torch [..., in] tensor viewed as [product of leading dims, in]: the same bytes, since ggml's
// ne order is torch's shape reversed). Copies, expert stacking, splitting fused projections,
// re-ordering heads and side-by-side concatenation are all piece lists; an element-wise transform
// (1 + w, -exp(w)) may follow. The transforms are those of llama.cpp's convert_hf_to_gguf.py for
// qwen3moe / qwen3next / qwen35moe and docs/ARCH_QWEN4EXP.md for qwen4exp; docs/CONVERT.md lists them.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "convert/safetensors.h"
#include "model/arch.h"

namespace strata::convert {

// An HF tensor viewed as [rows, cols]; FP8 weights come with their block scales.
struct Source {
  const StTensor* weight = nullptr;
  const StTensor* scale = nullptr;  // F8_E4M3 only: weight_scale_inv, one per block
  int64_t rows = 0, cols = 0;
  int64_t inner_rows = 1;  // shape[-2] (1 for 1-D): the row count one scale grid covers
  int64_t block_rows = 128, block_cols = 128;
};

// Copies src[src_row .. +nrows, src_col .. +ncols] to dst[dst_row.., dst_col..].
struct Piece {
  int src;
  int64_t src_row, nrows, src_col, ncols, dst_row, dst_col;
};

enum class Transform { None, PlusOne, NegExp };

struct TensorPlan {
  model::TensorSpec spec;
  bool present = true;  // false: an optional tensor the checkpoint does not have (tied head)
  int64_t rows = 0, cols = 0;
  std::vector<Source> sources;
  std::vector<Piece> pieces;
  Transform transform = Transform::None;
};

struct MapOptions {
  int64_t fp8_block_rows = 128, fp8_block_cols = 128;
  bool tied_embeddings = false;
};

class TensorMapper {
 public:
  // Indexes the checkpoint's names ("model.language_model." is read as "model."; vision tensors
  // and rotary inv_freq buffers are set aside). The config must be final (n_mtp decided).
  TensorMapper(const Checkpoint& ckpt, const model::ModelConfig& config, MapOptions options);

  // The plan for one spec; throws strata::Error naming the GGUF tensor and the missing or
  // mis-shaped HF tensor.
  TensorPlan plan(const model::TensorSpec& spec);

  // HF tensors no plan used, except those set aside; call after planning every spec.
  std::vector<std::string> unused() const;
  // Names set aside on purpose, one line per group ("12 vision tensors (model.visual.*)").
  std::vector<std::string> skipped() const;
  // MTP layer count the checkpoint holds (mtp.layers.N.*).
  static int64_t mtp_layers_in(const Checkpoint& ckpt);

 private:
  class Builder;
  void set_aside(const std::string& name, const std::string& why);
  void check_ple_buffers(const std::string& prefix, const model::ModelConfig::PleTable& table);
  // Index k of the PLE layer whose n-gram table is GGUF tensor `name`, or -1.
  int64_t ple_table_index(const std::string& name) const;

  const model::ModelConfig& c_;
  MapOptions opt_;
  std::unordered_map<std::string, const StTensor*> by_name_;  // normalized names
  std::set<std::string> used_;
  std::vector<std::pair<std::string, std::string>> aside_;  // name, why
};

// The whole checkpoint planned: one plan per spec, then the unused-tensor check.
std::vector<TensorPlan> plan_all(const Checkpoint& ckpt, const model::ModelConfig& config,
                                 const MapOptions& options, std::vector<std::string>& notes);

}  // namespace strata::convert
