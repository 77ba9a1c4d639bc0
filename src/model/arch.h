// The tensors of each architecture, as one list per architecture that every writer, loader and
// validator walks. A spec names the tensor as the GGUF file does, gives its shape in ggml ne
// order (ne[0] is the contiguous row), what part of the engine owns it and how synthetic values
// for it are drawn.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "quant/types.h"

namespace strata::gguf {
class Reader;
}

namespace strata::model {

// Who holds the tensor at run time.
enum class Role {
  Embedding,     // token_embd: rows fetched by token id
  Output,        // the LM head and its final mixer / norm
  Trunk,         // resident non-expert weights of a block
  RoutedExpert,  // [.., .., n_expert] stacks streamed from SSD into the arena
  NgramTable,    // the PLE n-gram table, read row by row from disk, never loaded whole
};

// Which requested type a tensor gets. Vector is always F32 (norms, biases, convs, routers,
// small per-head vectors), as llama.cpp's converter and quantizer keep them.
enum class TypeClass { Vector, Trunk, Expert, Ngram };

// How synthetic values are drawn (see synth/weights.cpp).
enum class Init {
  Matrix,  // normal, rms 1/sqrt(ne[0]) (the fan-in), so y = W x keeps unit scale
  Norm,    // ~1 (RMSNorm gains, stored as the converter stores them: already 1 + w)
  SsmA,    // -exp(A_log), A in [0.01, 16] as the reference initialises it: negative decay rates
  SsmDt,   // dt bias ~1
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // ne order
  Role role;
  TypeClass cls;
  Init init;
  bool required;  // false: llama.cpp's loader accepts the file without it
  int layer;      // block index, -1 for global tensors
  // The file may store each row zero-padded to whole blocks of its type (ne0 rounded up), for a
  // type whose block does not divide ne0. Only on our own architecture's stacks whose extra
  // columns meet exactly-zero activations (qwen4exp's ffn_down_exps: docs/ARCH_QWEN4EXP.md).
  bool pad_rows_to_block = false;
};

// The row length a tensor is stored with in type t: the spec's ne0, or for a pad_rows_to_block
// spec whose ne0 t's block does not divide, ne0 rounded up to whole blocks of t.
int64_t stored_ne0(const TensorSpec& s, quant::Type t);

// The spec's shape as stored in type t (ne0 = stored_ne0).
std::vector<int64_t> stored_shape(const TensorSpec& s, quant::Type t);

// Every tensor strata writes for this config, in file order. The config must be valid.
std::vector<TensorSpec> tensor_specs(const ModelConfig& c);

// Per-architecture lists (arch_*.cpp); tensor_specs dispatches on c.arch.
std::vector<TensorSpec> qwen4exp_tensors(const ModelConfig& c);
std::vector<TensorSpec> qwen3next_tensors(const ModelConfig& c);  // qwen3next and qwen35moe
std::vector<TensorSpec> qwen3moe_tensors(const ModelConfig& c);

// Checks a file against the list for its own config: every required tensor present with the
// spec's shape (or, for a pad_rows_to_block spec, its stored_shape in the file's type), no
// optional one with a wrong shape, no tensor the list does not know. Throws strata::Error naming
// the file and the first problem. With experts_in_file false (a trunk-only
// GGUF whose experts are in a .experts pack) the routed-expert stacks must all be absent.
void validate_tensors(const gguf::Reader& reader, const ModelConfig& c,
                      bool experts_in_file = true);

// Appends to a list while reading like a table: add(name, {ne0, ne1}, role, cls, init).
class SpecList {
 public:
  explicit SpecList(int layer = -1) : layer_(layer) {}
  void at_layer(int layer) { layer_ = layer; }
  void add(std::string name, std::vector<int64_t> shape, Role role, TypeClass cls, Init init,
           bool required = true);
  // Block tensor: "blk.N." + name.
  void blk(const std::string& name, std::vector<int64_t> shape, Role role, TypeClass cls,
           Init init, bool required = true);
  // Marks the last added tensor pad_rows_to_block.
  void pad_last_rows_to_block() { specs_.back().pad_rows_to_block = true; }
  std::vector<TensorSpec> take() { return std::move(specs_); }

 private:
  int layer_;
  std::vector<TensorSpec> specs_;
};

}  // namespace strata::model
