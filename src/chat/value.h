// The values a chat template computes with: Python's data model as Jinja2 exposes it, restricted
// to what JSON can carry (None, bool, int, float, str, list, dict with string keys) plus Jinja's
// undefined, namespace() objects and callables (macros, builtins, bound methods).
//
// Lists and dicts are shared, not copied, when a value is copied: templates never mutate them
// (Hugging Face renders in Jinja's immutable sandbox), so sharing is invisible, except for
// namespaces, whose attributes `{% set ns.x = ... %}` assigns in place as Jinja does.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::chat {

class Value;

// A runtime error not yet tied to a template position: the interpreter catches it at the
// innermost expression and rethrows strata::Error "chat template L:C: message".
class EvalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// No string or list a template builds may exceed this (nor may the rendered output): a template
// that doubles a string in a loop fails instead of exhausting memory.
inline constexpr size_t kMaxBytes = size_t(64) << 20;

using Array = std::vector<Value>;

// A dict in insertion order, as Python's; looked up by a linear scan, since template dicts are
// small (a message, a tool schema).
struct Object {
  std::vector<std::pair<std::string, Value>> items;

  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
};

// Arguments of a call: positional, then keyword (name=value) in source order.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, Array, Object, Function };

  Value() = default;  // undefined
  explicit Value(bool b) : v_(b) {}
  explicit Value(int64_t i) : v_(i) {}
  explicit Value(int i) : v_(int64_t{i}) {}
  explicit Value(double f) : v_(f) {}
  explicit Value(std::string s) : v_(std::move(s)) {}
  explicit Value(const char* s) : v_(std::string(s)) {}
  explicit Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  explicit Value(Object o) : v_(std::make_shared<Object>(std::move(o))) {}
  explicit Value(Function f) : v_(std::make_shared<Function>(std::move(f))) {}

  static Value none() { return Value(nullptr); }
  // A namespace() object: attributes are assignable; it is not a mapping.
  static Value make_namespace(Object o);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::String; }
  bool is_array() const { return kind() == Kind::Array; }
  bool is_object() const { return kind() == Kind::Object; }
  bool is_namespace() const { return is_object() && namespace_; }
  bool is_mapping() const { return is_object() && !namespace_; }
  bool is_function() const { return kind() == Kind::Function; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  // An int or float (or bool, which Python treats as an int) as a double.
  double as_double() const;
  const std::string& str() const { return std::get<std::string>(v_); }
  const Array& array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  const Object& object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  Object& mutable_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const Function& function() const { return *std::get<std::shared_ptr<Function>>(v_); }

  // Python's bool(): false for undefined, None, 0, "", [] and {}.
  bool truthy() const;
  // Python's type name, for error messages ("str", "list", "dict", "undefined").
  std::string type_name() const;
  // Functions and undefined become null.
  nlohmann::ordered_json to_json() const;

 private:
  explicit Value(std::nullptr_t) : v_(nullptr) {}

  std::variant<std::monostate, std::nullptr_t, bool, int64_t, double, std::string,
               std::shared_ptr<Array>, std::shared_ptr<Object>, std::shared_ptr<Function>>
      v_;
  bool namespace_ = false;
};

// JSON objects keep their key order (nlohmann::ordered_json), as Python dicts do: tojson and
// `for k, v in d|items` follow it.

// Python's ==, deep for lists and dicts, with 1 == 1.0 == True.
bool equal(const Value& a, const Value& b);
// Python's <, for numbers with numbers, strings with strings (by code point) and lists with
// lists; throws strata::Error for other pairs.
bool less(const Value& a, const Value& b);

// What {{ value }} prints, Python's str(): None, True, 1.5, ['a', 1], {'k': 'v'}; undefined
// prints nothing.
std::string to_str(const Value& v);
// Python's repr() (strings quoted, as inside a list).
std::string repr(const Value& v);
// Python's repr() of a float: the shortest round-tripping digits, "1.0", "1e-07", "1e+16".
std::string float_repr(double f);

// Hugging Face's tojson filter, json.dumps(v, ensure_ascii=False, indent=..., sort_keys=...):
// separators ", " and ": " without indent, "," and ": " with it; non-ASCII text is kept,
// control characters become \uXXXX. Throws strata::Error for functions and undefined inside.
std::string to_json_text(const Value& v, int indent, bool sort_keys);

// String helpers over code points (Python indexes str by code point, not byte).
std::vector<std::string_view> code_points(std::string_view s);

}  // namespace strata::chat
