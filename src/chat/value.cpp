#include "chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace strata::chat {

namespace {

bool int_like(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t int_of(const Value& v) { return v.is_int() ? v.as_int() : int64_t(v.as_bool()); }

template <typename... Parts>
[[noreturn]] void eval_fail(Parts&&... parts) {
  throw EvalError(cat(std::forward<Parts>(parts)...));
}

}  // namespace

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

Value Value::make_namespace(Object o) {
  Value v(std::move(o));
  v.namespace_ = true;
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return none();
    case nlohmann::json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= uint64_t(INT64_MAX)) return Value(int64_t(u));
      return Value(double(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json(e));
      return Value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      Object o;
      o.items.reserve(j.size());
      for (const auto& [k, e] : j.items()) o.items.emplace_back(k, from_json(e));
      return Value(std::move(o));
    }
    default:
      return Value();  // binary and discarded values have no template meaning
  }
}

double Value::as_double() const {
  if (is_int()) return double(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return std::get<double>(v_);
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return as_bool();
    case Kind::Int:
      return as_int() != 0;
    case Kind::Float:
      return as_double() != 0.0;
    case Kind::String:
      return !str().empty();
    case Kind::Array:
      return !array().empty();
    case Kind::Object:
      return namespace_ || !object().items.empty();
    case Kind::Function:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::Undefined:
      return "undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::Array:
      return "list";
    case Kind::Object:
      return namespace_ ? "Namespace" : "dict";
    case Kind::Function:
      return "function";
  }
  return "?";
}

nlohmann::ordered_json Value::to_json() const {
  switch (kind()) {
    case Kind::Bool:
      return as_bool();
    case Kind::Int:
      return as_int();
    case Kind::Float:
      return as_double();
    case Kind::String:
      return str();
    case Kind::Array: {
      auto j = nlohmann::ordered_json::array();
      for (const auto& e : array()) j.push_back(e.to_json());
      return j;
    }
    case Kind::Object: {
      auto j = nlohmann::ordered_json::object();
      for (const auto& [k, e] : object().items) j[k] = e.to_json();
      return j;
    }
    default:
      return nullptr;
  }
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (int_like(a) && int_like(b)) return int_of(a) == int_of(b);
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None:
      return true;
    case K::String:
      return a.str() == b.str();
    case K::Array: {
      const Array &x = a.array(), &y = b.array();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case K::Object: {
      if (a.is_namespace() || b.is_namespace()) return &a.object() == &b.object();
      const Object &x = a.object(), &y = b.object();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    }
    case K::Function:
      return &a.function() == &b.function();
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (int_like(a) && int_like(b)) return int_of(a) < int_of(b);
    return a.as_double() < b.as_double();
  }
  // UTF-8 byte order is code point order, which is how Python compares str.
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_array() && b.is_array()) {
    const Array &x = a.array(), &y = b.array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  eval_fail("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  // sci is "[-]d[.ddd]e[+-]xx": split into sign, significant digits and decimal exponent.
  const size_t e_at = sci.find('e');
  std::string mantissa = sci.substr(0, e_at);
  const int exp = std::stoi(sci.substr(e_at + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out = negative ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + e;
  }
  if (exp < 0) return out + "0." + std::string(size_t(-exp - 1), '0') + digits;
  const size_t int_len = size_t(exp) + 1;
  if (digits.size() <= int_len) return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == quote) out += std::string("\\") + char(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += char(c);
    }
  }
  return out + quote;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\u%04x", c);
          out += hex;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
  if (depth > 512) eval_fail("tojson: value nested deeper than 512 levels");
  if (out.size() > kMaxBytes) eval_fail("tojson: output larger than ", kMaxBytes, " bytes");
  const std::string item_sep = indent >= 0 ? "," : ", ";
  const auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent) * size_t(level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float: {
      const double f = v.as_double();
      out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f < 0 ? "-Infinity" : "Infinity") : float_repr(f);
      return;
    }
    case Value::Kind::String:
      json_string(out, v.str());
      return;
    case Value::Kind::Array: {
      const Array& a = v.array();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_dump(out, a[i], indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::Object: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.object().items) items.push_back(&item);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* x, auto* y) { return x->first < y->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_string(out, items[i]->first);
        out += ": ";
        json_dump(out, items[i]->second, indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      eval_fail("Object of type ", v.type_name(), " is not JSON serializable");
  }
}

std::string to_str_impl(const Value& v, bool quoted, int depth) {
  if (depth > 512) eval_fail("value nested deeper than 512 levels");
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return quoted ? "Undefined" : "";
    case Value::Kind::None:
      return "None";
    case Value::Kind::Bool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::Int:
      return std::to_string(v.as_int());
    case Value::Kind::Float:
      return float_repr(v.as_double());
    case Value::Kind::String:
      return quoted ? repr_string(v.str()) : v.str();
    case Value::Kind::Array: {
      std::string out = "[";
      for (size_t i = 0; i < v.array().size(); ++i) {
        if (i) out += ", ";
        out += to_str_impl(v.array()[i], true, depth + 1);
        if (out.size() > kMaxBytes) eval_fail("string larger than ", kMaxBytes, " bytes");
      }
      return out + "]";
    }
    case Value::Kind::Object: {
      std::string out = v.is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : v.object().items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + to_str_impl(e, true, depth + 1);
        if (out.size() > kMaxBytes) eval_fail("string larger than ", kMaxBytes, " bytes");
      }
      return out + (v.is_namespace() ? "}>" : "}");
    }
    case Value::Kind::Function:
      return "<function>";
  }
  return "";
}

}  // namespace

std::string to_str(const Value& v) { return to_str_impl(v, false, 0); }
std::string repr(const Value& v) { return to_str_impl(v, true, 0); }

std::string to_json_text(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_dump(out, v, indent, sort_keys, 0);
  return out;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    tokenizer::utf8::next(s, pos);
    out.push_back(s.substr(start, pos - start));
  }
  return out;
}

}  // namespace strata::chat
