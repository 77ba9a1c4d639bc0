// Jinja's built-in filters, tests and global functions, and Python's str and dict methods, as
// Hugging Face's chat-template environment provides them. All throw EvalError on bad input.
#pragma once

#include <string>

#include "chat/value.h"

namespace strata::chat {

// `operand | name(args)`. Unknown filters are errors.
Value apply_filter(const std::string& name, const Value& operand, Args& args);
// `operand is name(args)`. Unknown tests are errors.
bool apply_test(const std::string& name, const Value& operand, Args& args);

// Jinja's getattr (`obj.name`): a method of a str or dict first (Python attribute lookup, so
// `schema.items` is the method even when the dict has an "items" key), then a dict key or
// namespace attribute; undefined when there is none. Reading from undefined is an error.
Value get_attr(const Value& obj, const std::string& name);
// Jinja's getitem (`obj[key]`): a dict key, a list or str index (negative from the end), then
// an attribute; undefined when out of range or missing.
Value get_item(const Value& obj, const Value& key);
// Python's obj[start:stop:step] on a list or str; null pointers are omitted parts.
Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step);

// The global functions: range, namespace, dict, raise_exception, strftime_now.
Object global_functions();

// Python's str.strip / lstrip / rstrip: `chars` (or whitespace when undefined/None) removed
// from the chosen ends.
std::string strip(const std::string& s, const Value& chars, bool left, bool right);

// Reads call arguments by position or name, as a Python signature f(a, b=..., ...) would.
class Params {
 public:
  // Throws EvalError on too many positional arguments, unknown or repeated keywords.
  Params(const char* function, Args& args, std::initializer_list<const char*> names);
  // The argument for the i-th name; nullptr if not passed.
  const Value* get(size_t i) const { return values_[i]; }
  Value get_or(size_t i, Value fallback) const { return values_[i] ? *values_[i] : std::move(fallback); }
  // Throws EvalError naming the parameter when it was not passed.
  const Value& required(size_t i) const;

 private:
  const char* function_;
  std::vector<const char*> names_;
  std::vector<const Value*> values_;
};

}  // namespace strata::chat
