// What `strata inspect` reports about a GGUF file: header, architecture and key hyperparameters,
// all metadata, the tensor table, bytes per type, and the split the engine cares about: routed
// experts (streamed from SSD) vs the resident trunk vs the PLE n-gram table (read row by row).
// The CLI only parses flags and prints these; tests call them directly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"

namespace strata::gguf {

enum class TensorGroup { Trunk, Expert, Ngram };
const char* tensor_group_name(TensorGroup g);  // "trunk", "experts", "ngram"

// Routed experts follow llama.cpp's naming, "_exps" in the name (blk.N.ffn_gate_exps.weight; our
// qwen4exp flagship and its MTP block use the same names). The n-gram table is any tensor named
// "*ngram*", and qwen4exp's PLE tables per_layer_token_embd.weight (the first PLE layer's) and
// blk.N.per_layer_token_embd.weight (further ones). Everything else is trunk.
TensorGroup tensor_group(std::string_view arch, std::string_view tensor_name);

// The report as JSON (ordered keys): file, version, alignment, file_size, data_offset,
// architecture, hyperparameters, metadata (key -> value; arrays over 16 items summarized as
// "[N types]"), tensors [{name, type, shape, n_elements, bytes, offset, group}], bytes_by_type
// {type: {tensors, bytes}}, groups {trunk|experts|ngram: {tensors, bytes, params}}, total.
nlohmann::ordered_json inspect_json(const Reader& reader);
// The same, as text for people.
std::string inspect_text(const Reader& reader);

// The first n values of a tensor (all of them if it has fewer), dequantized from whole blocks.
// Throws strata::Error for an unknown name, listing the most similar names in the file.
std::vector<float> tensor_values(const Reader& reader, std::string_view name, int64_t n);
// One value per line, "%.9g": enough digits to give back the same float.
std::string format_values(const std::vector<float>& values);

}  // namespace strata::gguf
