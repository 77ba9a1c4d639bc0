// Metadata values and tensor-info helpers shared by the GGUF Reader and Writer.
#include <charconv>
#include <limits>

#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::gguf {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "unknown";
}

Value Value::array(ValueType elem_type, std::vector<Value> items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].type() != elem_type)
      fail("array of ", value_type_name(elem_type), ": element ", i, " is a ",
           value_type_name(items[i].type()));
  }
  Value v(ValueType::ARRAY, std::move(items));
  v.elem_type_ = elem_type;
  return v;
}

Value Value::strings(const std::vector<std::string>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (const auto& s : items) values.push_back(Value::string(s));
  return array(ValueType::STRING, std::move(values));
}

Value Value::i32s(const std::vector<int32_t>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (int32_t x : items) values.push_back(Value::i32(x));
  return array(ValueType::I32, std::move(values));
}

Value Value::f32s(const std::vector<float>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (float x : items) values.push_back(Value::f32(x));
  return array(ValueType::F32, std::move(values));
}

bool Value::is_integer() const {
  return std::holds_alternative<uint64_t>(data_) || std::holds_alternative<int64_t>(data_);
}

bool Value::is_number() const { return is_integer() || std::holds_alternative<double>(data_); }

namespace {
std::string type_description(const Value& v) {
  if (v.type() == ValueType::ARRAY) return cat("array of ", value_type_name(v.elem_type()));
  return value_type_name(v.type());
}
}  // namespace

uint64_t Value::as_u64() const {
  if (const auto* u = std::get_if<uint64_t>(&data_)) return *u;
  if (const auto* i = std::get_if<int64_t>(&data_)) {
    if (*i < 0) fail("expected a non-negative integer, found ", value_type_name(type_), " ", *i);
    return uint64_t(*i);
  }
  fail("expected an unsigned integer, found ", type_description(*this));
}

int64_t Value::as_i64() const {
  if (const auto* i = std::get_if<int64_t>(&data_)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&data_)) {
    if (*u > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("expected an integer that fits i64, found ", value_type_name(type_), " ", *u);
    return int64_t(*u);
  }
  fail("expected an integer, found ", type_description(*this));
}

double Value::as_f64() const {
  if (const auto* d = std::get_if<double>(&data_)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&data_)) return double(*u);
  if (const auto* i = std::get_if<int64_t>(&data_)) return double(*i);
  fail("expected a number, found ", type_description(*this));
}

bool Value::as_bool() const {
  if (const auto* b = std::get_if<bool>(&data_)) return *b;
  fail("expected bool, found ", type_description(*this));
}

const std::string& Value::as_string() const {
  if (const auto* s = std::get_if<std::string>(&data_)) return *s;
  fail("expected string, found ", type_description(*this));
}

const std::vector<Value>& Value::as_array() const {
  if (const auto* a = std::get_if<std::vector<Value>>(&data_)) return *a;
  fail("expected array, found ", type_description(*this));
}

namespace {
template <typename T>
std::string shortest(T x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

// Quotes a string, escaping what would break a one-line rendering (strings are arbitrary bytes).
std::string quoted(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}
}  // namespace

std::string Value::to_string(size_t max_items) const {
  switch (type_) {
    case ValueType::F32: return shortest(float(std::get<double>(data_)));
    case ValueType::F64: return shortest(std::get<double>(data_));
    case ValueType::BOOL: return std::get<bool>(data_) ? "true" : "false";
    case ValueType::STRING: return quoted(std::get<std::string>(data_));
    case ValueType::ARRAY: {
      const auto& items = std::get<std::vector<Value>>(data_);
      if (items.size() > max_items)
        return cat("[", items.size(), " ", value_type_name(elem_type_), "s]");
      std::string out = "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += items[i].to_string(max_items);
      }
      return out + "]";
    }
    default:
      if (const auto* u = std::get_if<uint64_t>(&data_)) return std::to_string(*u);
      if (const auto* i = std::get_if<int64_t>(&data_)) return std::to_string(*i);
      return "(empty)";
  }
}

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorInfo::n_rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

namespace {
std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}
}  // namespace

std::string TensorInfo::shape_string() const { return shape_str(shape); }

uint64_t tensor_nbytes(quant::Type type, const std::vector<int64_t>& shape) {
  if (shape.empty() || shape.size() > size_t(kMaxDims))
    fail("has ", shape.size(), " dimensions (must be 1 to ", kMaxDims, ")");
  int64_t elems = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) fail("ne[", i, "] = ", shape[i], " (must be positive)");
    if (elems > std::numeric_limits<int64_t>::max() / shape[i])
      fail("shape ", shape_str(shape), " has more than 2^63 elements");
    elems *= shape[i];
  }
  const quant::TypeInfo& info = quant::type_info(type);
  if (shape[0] % info.block_elems != 0)
    fail("ne[0] = ", shape[0], " is not a multiple of the ", info.name, " block size ",
         info.block_elems);
  const uint64_t blocks = uint64_t(elems / info.block_elems);
  if (blocks > std::numeric_limits<uint64_t>::max() / info.block_bytes)
    fail("shape ", shape_str(shape), " of ", info.name,
         " is too large (bytes overflow 64 bits)");
  return blocks * info.block_bytes;
}

}  // namespace strata::gguf
