#include "util/npy.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "util/error.h"

namespace strata::npy {

namespace {

constexpr char kMagic[] = "\x93NUMPY";

size_t item_size(const std::string& path, const std::string& dtype) {
  if (dtype == "<f4" || dtype == "<i4" || dtype == "<u4") return 4;
  if (dtype == "<f8" || dtype == "<i8" || dtype == "<u8") return 8;
  if (dtype == "|i1" || dtype == "|u1" || dtype == "|b1") return 1;
  fail(path, ": unsupported dtype '", dtype, "' (little-endian f4, f8, i1-i8, u1-u8 only)");
}

// The quoted value after 'key': in a header dict like {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), }; returns the raw text up to the next top-level comma or closing brace.
std::string dict_value(const std::string& path, const std::string& header, const std::string& key) {
  const std::string k = "'" + key + "'";
  size_t p = header.find(k);
  if (p == std::string::npos) fail(path, ": header has no '", key, "'");
  p = header.find(':', p + k.size());
  if (p == std::string::npos) fail(path, ": header '", key, "' has no value");
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  size_t end = p;
  if (end < header.size() && header[end] == '(') {
    end = header.find(')', end);
    if (end == std::string::npos) fail(path, ": header shape is not closed");
    return header.substr(p, end + 1 - p);
  }
  while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return header.substr(p, end - p);
}

std::vector<int64_t> parse_shape(const std::string& path, const std::string& text) {
  std::vector<int64_t> shape;
  size_t p = 1;  // after '('
  while (p < text.size()) {
    while (p < text.size() && (text[p] == ' ' || text[p] == ',')) ++p;
    if (p >= text.size() || text[p] == ')') break;
    int64_t v = 0;
    size_t digits = 0;
    while (p < text.size() && text[p] >= '0' && text[p] <= '9') {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10)
        fail(path, ": shape ", text, " overflows");
      v = v * 10 + (text[p++] - '0');
      ++digits;
    }
    if (digits == 0) fail(path, ": bad shape ", text);
    shape.push_back(v);
  }
  return shape;
}

void write_raw(const std::string& path, const char* descr, const void* data, size_t nbytes,
               std::span<const int64_t> shape) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";  // Python's one-element tuple: "(3,)"
  std::string header =
      cat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic (6) + version (2) + length (2) + header, padded with spaces to 64 bytes and ended by \n.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(path, ": cannot open for writing");
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t len = uint16_t(header.size());
  const char len_bytes[2] = {char(len & 0xff), char(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), std::streamsize(header.size()));
  out.write(static_cast<const char*>(data), std::streamsize(nbytes));
  if (!out.flush()) fail(path, ": write failed");
}

template <typename T>
void check_count(const std::string& path, std::span<const T> values,
                 std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n != int64_t(values.size()))
    fail(path, ": ", values.size(), " values do not fill the shape (", n, " elements)");
}

}  // namespace

int64_t Array::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> Array::floats() const {
  if (dtype != "<f4") fail("npy: expected float32 ('<f4') values, found '", dtype, "'");
  std::vector<float> out(static_cast<size_t>(size()));
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::vector<int32_t> Array::int32s() const {
  std::vector<int32_t> out(static_cast<size_t>(size()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t v = 0;
    if (dtype == "<i4") {
      int32_t x;
      std::memcpy(&x, bytes.data() + i * 4, 4);
      v = x;
    } else if (dtype == "<u4") {
      uint32_t x;
      std::memcpy(&x, bytes.data() + i * 4, 4);
      v = x;
    } else if (dtype == "<i8" || dtype == "<u8") {
      std::memcpy(&v, bytes.data() + i * 8, 8);
      if (dtype == "<u8" && v < 0) v = std::numeric_limits<int64_t>::max();
    } else {
      fail("npy: expected integer values, found '", dtype, "'");
    }
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      fail("npy: value ", v, " at index ", i, " does not fit int32");
    out[i] = int32_t(v);
  }
  return out;
}

Array read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
  if (file.size() < 10 || std::memcmp(file.data(), kMagic, 6) != 0) fail(path, ": not a .npy file");
  const int major = file[6];
  size_t header_len = 0, pos = 0;
  if (major == 1) {
    header_len = size_t(file[8]) | size_t(file[9]) << 8;
    pos = 10;
  } else if (major == 2 || major == 3) {
    if (file.size() < 12) fail(path, ": truncated header");
    header_len =
        size_t(file[8]) | size_t(file[9]) << 8 | size_t(file[10]) << 16 | size_t(file[11]) << 24;
    pos = 12;
  } else {
    fail(path, ": unsupported .npy version ", major);
  }
  if (header_len > file.size() - pos) fail(path, ": truncated header");
  const std::string header(reinterpret_cast<const char*>(file.data() + pos), header_len);
  pos += header_len;

  Array a;
  std::string descr = dict_value(path, header, "descr");
  if (descr.size() < 2 || descr.front() != '\'' || descr.back() != '\'')
    fail(path, ": bad descr ", descr);
  a.dtype = descr.substr(1, descr.size() - 2);
  if (a.dtype == "=f4" || a.dtype == "=i4" || a.dtype == "=i8") a.dtype[0] = '<';
  if (dict_value(path, header, "fortran_order") != "False")
    fail(path, ": Fortran-order arrays are not supported");
  const std::string shape = dict_value(path, header, "shape");
  if (shape.empty() || shape.front() != '(') fail(path, ": bad shape ", shape);
  a.shape = parse_shape(path, shape);
  const size_t item = item_size(path, a.dtype);
  uint64_t n = 1;
  for (int64_t d : a.shape) {
    if (d != 0 && n > (uint64_t(1) << 62) / uint64_t(d)) fail(path, ": shape is too large");
    n *= uint64_t(d);
  }
  if (n * item > file.size() - pos)
    fail(path, ": holds ", file.size() - pos, " data bytes, the shape needs ", n * item);
  a.bytes.assign(file.begin() + std::ptrdiff_t(pos), file.begin() + std::ptrdiff_t(pos + n * item));
  return a;
}

void write(const std::string& path, std::span<const float> values, std::span<const int64_t> shape) {
  check_count(path, values, shape);
  write_raw(path, "<f4", values.data(), values.size() * 4, shape);
}

void write(const std::string& path, std::span<const int32_t> values,
           std::span<const int64_t> shape) {
  check_count(path, values, shape);
  write_raw(path, "<i4", values.data(), values.size() * 4, shape);
}

}  // namespace strata::npy
