// Tensor element types. The numeric ids are ggml's (and so GGUF's) type ids, bit-exact with its
// block layouts; FP8_E4M3 is strata's own (see docs/FORMATS.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata::quant {

enum class Type : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,  // activation-only format (dot products of K and IQ weights)
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ4_XS = 23,
  I32 = 26,   // integer tensors some GGUFs carry; not a weight format
  BF16 = 30,
  // FP8 e4m3 with the 128x128 tile scales of native FP8 checkpoints. Stored row-major in blocks
  // of 32 elements along a row: fp32 scale (the dequant multiplier of the tile holding the block)
  // then 32 e4m3 bytes, so one row is one contiguous read with its scales (the PLE table is fetched
  // row by row) and any row width that is a multiple of 32 fits.
  FP8_E4M3 = 1024,
};

struct TypeInfo {
  Type type;
  const char* name;      // as ggml spells it: "q4_K", "iq2_xs", "f32"...
  int64_t block_elems;   // elements per block (1 for plain scalar types)
  size_t block_bytes;    // bytes per block
  bool weight_format;    // may appear as a weight tensor type in a model
};

// Info for a type id read from a file; nullopt for ids strata does not know.
std::optional<TypeInfo> find_type(uint32_t id);
// Info for a known type.
const TypeInfo& type_info(Type t);
// Parse "q4_k", "Q4_K", "iq2_xs", "fp8"... (case-insensitive); nullopt if unknown.
std::optional<Type> parse_type(std::string_view name);
const char* type_name(Type t);

// Bytes for n elements of a row; n must be a multiple of the block size (checked by callers
// that read files, since a bad shape must be an error there, not an assert here).
inline size_t row_bytes(const TypeInfo& info, int64_t n) {
  return size_t(n / info.block_elems) * info.block_bytes;
}
size_t row_bytes(Type t, int64_t n);

}  // namespace strata::quant
