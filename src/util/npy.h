// NumPy .npy files (format 1.0-3.0, C order, little endian): how logits, token lists and
// activation dumps travel between strata and the Python reference.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace strata::npy {

// One array as read from a file. dtype is the header's descr ("<f4", "<i4", "<i8", ...).
struct Array {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // shape product x item size, C order

  int64_t size() const;
  // The values as fp32 / int32; throws strata::Error naming the dtype when it does not fit
  // (only "<f4" for floats; "<i4", "<i8", "<u4" and "<u8" in int32 range for ints).
  std::vector<float> floats() const;
  std::vector<int32_t> int32s() const;
};

// Reads a .npy; throws strata::Error("FILE: problem") on a malformed header, Fortran order,
// a big-endian or unknown dtype, or a file shorter than its shape says.
Array read(const std::string& path);

// Writes fp32 / int32 values of the given shape (C order); throws strata::Error on I/O failure.
void write(const std::string& path, std::span<const float> values, std::span<const int64_t> shape);
void write(const std::string& path, std::span<const int32_t> values,
           std::span<const int64_t> shape);

}  // namespace strata::npy
